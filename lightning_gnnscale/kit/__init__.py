"""The kit every system builds on (docs/architecture.md): ``strategies`` (the suite's
Strategy base and its metered single-device and DDP strategies), ``datamodule`` (the DataModule
base) with ``partition_io`` (partition directories), ``sampled`` (the replicated-graph
DataModule of ``single`` and ``ddp``), ``loaders`` (samplers, batch makers, the collective train
loader) and ``partitions`` (a rank's part of a partitioned graph). Distributed inference lives
beside its one-process sibling, in ``models/inference.py``."""
