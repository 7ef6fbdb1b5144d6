"""Link-prediction building blocks on plain tensors (docs/tasks.md, "Link prediction building
blocks"): the seeded edge split (:mod:`.split`), hash-keyed negatives (:mod:`.negatives`) and
summable ranking statistics with AUC (:mod:`.metrics`)."""
