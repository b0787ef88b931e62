"""The axes beside the pipeline: :mod:`~hintpipe.runtime.parallel.mesh` (where a rank sits),
:mod:`~hintpipe.runtime.parallel.data_parallel` and :mod:`~hintpipe.runtime.parallel.fsdp` (replicas),
:mod:`~hintpipe.runtime.parallel.coordination` (one decision per tensor-parallel group) and
:mod:`~hintpipe.runtime.parallel.tied` (one tensor in several stages)."""
