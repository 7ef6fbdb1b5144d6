"""No module reaches into another's private state (issue 36): every module under
``lightning_gnnscale/`` is parsed and its attribute reads checked (docs/architecture.md,
"Reach-ins").

The rule, per file:

- ``<anything>.fit_loop`` is refused: the Trainer's loops are Lightning's internals (the
  epoch a loader runs comes from the DataModule's own checkpointed state instead).
- ``<...>trainer.datamodule`` / ``<...>trainer.strategy`` is refused: the components are handed
  what they need when they meet (the DataModule binds to the strategy through
  ``contract.bind_datamodule`` and hands it what loading a checkpoint needs), instead of
  finding each other through the Trainer.
- ``<x>._name`` (one leading underscore) read off a module imported in the file: the suite's
  own modules are the suite's business; another library's module only as listed in
  :data:`MODULE_PRIVATES`, each with its reason.
- ``self._name`` / ``cls._name``: the same file must define ``_name`` (assign it, ``def``
  it, declare it in a class body or ``setattr`` it by name). A private name the file does
  not define is a base class's from elsewhere: Lightning's (``self._lightning_module``) or
  the suite base's (``self._dtype``).
- ``<object>._name`` (anything else): the same file must store ``_name`` as an attribute or
  declare it in a class body (a method of that name is not enough: grappa's callback has a
  ``_recorder`` method and read another callback's ``_recorder`` attribute).

:data:`READ_EXCEPTIONS` lists the justified exceptions, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_gnnscale"

# (module as imported, attribute): why reading it is sound
MODULE_PRIVATES = {
    ("os", "_exit"): "documented: leave without the interpreter's teardown",
    ("sys", "_getframe"): "documented: the audit names the caller of a collective",
    ("sys", "_xoptions"): "documented: the -X flags the warm client compares",
    ("torch.distributed", "_broadcast_coalesced"): (
        "DDP's own collective: the audit wraps it to see every call DDP makes"
    ),
    ("multiprocessing.forkserver", "_forkserver"): (
        "the forkserver has no public handle: the launcher stops and finds its rank server"
    ),
    ("threading", "_shutdown"): "the warm run ends as the interpreter would (its threads)",
    ("atexit", "_run_exitfuncs"): "the warm run ends as the interpreter would (exit handlers)",
}

# (file under lightning_gnnscale/, expression): why reading it is sound
READ_EXCEPTIONS = {
    ("comm/hooks.py", "ddp_model.reducer._rebuild_buckets"): (
        "DDP's bucket layout for the next backward, which a resume must reduce in (torch has "
        "no public way; DDP's own join code calls it outside forward)"
    ),
    ("comm/hooks.py", "ddp_model.reducer._get_zeros_like_grad_buckets"): (
        "the parameters of each of DDP's buckets, read once per checkpoint (as above)"
    ),
    ("proc_memory.py", "forkserver._forkserver._forkserver_pid"): (
        "the rank server's pid: multiprocessing keeps it nowhere public"
    ),
    ("graph/seed_split.py", "split._init"): (
        "SeedSplit.from_chunk initialises an instance of its own class (cls.__new__)"
    ),
    ("contract.py", "trainer.strategy"): (
        "the contract's one door from a Trainer to its suite strategy (type-checked, with an "
        "error naming the valid strategies): callbacks and DataModules bind through it"
    ),
    ("checkpoints.py", "trainer.strategy"): (
        "a ModelCheckpoint's cross-rank broadcast, as Lightning's ModelCheckpoint does it "
        "(the suite strategy meters it)"
    ),
}

# the Trainer's components, which others are handed instead of reading them off the Trainer
TRAINER_COMPONENTS = ("datamodule", "strategy")


def is_trainer_component(node: ast.Attribute) -> bool:
    """``trainer.<component>`` or ``<x>.trainer.<component>``."""
    owner = node.value
    named = (isinstance(owner, ast.Name) and owner.id == "trainer") or (
        isinstance(owner, ast.Attribute) and owner.attr == "trainer"
    )
    return named and node.attr in TRAINER_COMPONENTS


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def is_setattr(call: ast.Call) -> bool:
    """``setattr(...)`` or ``object.__setattr__(...)``."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "setattr"
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "__setattr__"
        and isinstance(func.value, ast.Name)
        and func.value.id == "object"
    )


def file_names(nodes: list[ast.AST]) -> tuple[set[str], set[str]]:
    """``(stored, defined)`` of a file's nodes. Stored: attributes it assigns or deletes,
    class-body names and ``setattr(obj, "<name>", ...)`` / ``object.__setattr__`` targets.
    Defined: those and every function, method and class it defines."""
    stored, defs = set(), set()
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            stored.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defs.add(node.name)
        elif isinstance(node, ast.ClassDef):
            defs.add(node.name)
            for statement in node.body:
                targets = statement.targets if isinstance(statement, ast.Assign) else []
                if isinstance(statement, ast.AnnAssign):
                    targets = [statement.target]
                stored.update(t.id for t in targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.Call)
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and is_setattr(node)
        ):
            stored.add(node.args[1].value)
    return stored, stored | defs


def imported_modules(nodes: list[ast.AST]) -> dict[str, tuple[str, bool]]:
    """``{name bound by an import: (what it imports, whether it is the suite's own)}``."""
    bound = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                target = alias.name if alias.asname else alias.name.split(".")[0]
                bound[name] = (target, target.startswith("lightning_gnnscale"))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            ours = node.level > 0 or module.startswith("lightning_gnnscale")
            for alias in node.names:
                bound[alias.asname or alias.name] = (f"{module}.{alias.name}".strip("."), ours)
    return bound


def reach_ins(path: Path, source: str) -> list[str]:
    """The reach-ins of one file, as ``"<file>:<line>: <expression> (<why>)"``."""
    nodes = list(ast.walk(ast.parse(source)))
    relative = path.relative_to(PACKAGE).as_posix()
    (stored, defined), modules = file_names(nodes), imported_modules(nodes)
    found = []
    for node in nodes:
        if not isinstance(node, ast.Attribute):
            continue
        component = is_trainer_component(node)
        if (
            node.attr != "fit_loop"
            and not component
            and not (is_private(node.attr) and isinstance(node.ctx, ast.Load))
        ):
            continue
        text = ast.unparse(node)
        where = f"{relative}:{node.lineno}: {text}"
        if node.attr == "fit_loop":
            found.append(f"{where} (the Trainer's loops are Lightning's internals)")
            continue
        if component:
            if (relative, text) not in READ_EXCEPTIONS:
                found.append(f"{where} (a component found through the Trainer, not handed over)")
            continue
        if isinstance(node.value, ast.Name) and node.value.id in modules:
            module, ours = modules[node.value.id]
            if not ours and (module, node.attr) not in MODULE_PRIVATES:
                found.append(f"{where} (a private name of {module})")
            continue
        if (relative, text) in READ_EXCEPTIONS:
            continue
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if on_self and node.attr not in defined:
            found.append(f"{where} (a base class's private name, not defined in this file)")
        elif not on_self and node.attr not in stored:
            found.append(f"{where} (another object's private attribute)")
    return found


def package_reach_ins() -> list[str]:
    return [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in reach_ins(path, path.read_text(encoding="utf-8"))
    ]


def test_no_module_reaches_into_private_state_or_the_fit_loop():
    found = package_reach_ins()
    assert not found, "reach-ins:\n" + "\n".join(found)


def test_the_rule_flags_each_kind_of_reach_in_and_passes_a_files_own_privates():
    """The rule on small sources: what it must flag, what it must let through."""
    path = PACKAGE / "systems" / "example.py"
    flagged = {
        "epoch = trainer.fit_loop.epoch_progress.current.processed": "fit_loop",
        "trainer = self._lightning_module": "self._lightning_module",
        "def _recorder(self, t):\n    return next(cb._recorder for cb in t.callbacks)": (
            "cb._recorder"
        ),
        "x = self.x.to(self._dtype)": "self._dtype",
        "import torch\nfn = torch._C._get_tracing_state": "torch._C",
        "dm = trainer.datamodule": "trainer.datamodule",
        "fn = self.lightning_module.trainer.datamodule.complete": "trainer.datamodule",
        "comm = self.trainer.strategy.comm": "self.trainer.strategy",
    }
    for source, expression in flagged.items():
        assert any(expression in hit for hit in reach_ins(path, source)), source
    allowed = [
        "class A:\n    def __init__(self):\n        self._n = 0\n    def n(self):\n"
        "        return self._n",
        "class A:\n    _cache: dict | None = None\n    def same(self, other):\n"
        "        return self._cache is other._cache",
        "class A:\n    def __init__(self):\n        self._n = 0\n    def same(self, other):\n"
        "        return self._n == other._n",
        "from .. import launch\ntoken = launch._run_token()",
        "import os\nos._exit(0)",
        "object.__setattr__(self, '_calls', [0])\ncount = self._calls[0]",
        "name = run.strategy.name\ncls = spec.datamodule",
    ]
    for source in allowed:
        assert reach_ins(path, source) == [], source
