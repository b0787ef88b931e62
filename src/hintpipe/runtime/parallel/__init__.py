"""The axes beside the pipeline: :mod:`~hintpipe.runtime.parallel.mesh` (where a rank sits),
:mod:`~hintpipe.runtime.parallel.data_parallel` and :mod:`~hintpipe.runtime.parallel.fsdp` (replicas) and
:mod:`~hintpipe.runtime.parallel.tied` (one tensor in several stages): step hooks around the loop. A
tensor-parallel group's one decision per task is the loop's own (:mod:`~hintpipe.runtime.loop.coordination`)."""
