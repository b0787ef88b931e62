"""The runtime: one process per rank, driving the scoreboard with messages and compute.

- :mod:`~hintpipe.runtime.pipeline`: the public :class:`Pipeline`, a facade that checks options and runs steps;
- :mod:`~hintpipe.runtime.assembly`: what a rank's pipeline is made of, built once;
- :mod:`~hintpipe.runtime.loop`: one step: the step loop, the executor, admission, the ``ready`` plan, the
  step hooks (agreement, reports);
- :mod:`~hintpipe.runtime.transport`: messages between ranks: the wire format, the gloo mailboxes, staging
  through host memory, NCCL links;
- :mod:`~hintpipe.runtime.parallel`: the other axes: the mesh, data parallelism (replicas, FSDP2),
  tensor-parallel coordination, tied weights;
- :mod:`~hintpipe.runtime.checkpoint`: checkpoints, collective phases, stopping on a signal;
- :mod:`~hintpipe.runtime.launch`, :mod:`~hintpipe.runtime.faults` (with
  :mod:`~hintpipe.runtime.injection`) and :mod:`~hintpipe.runtime.errors`.

Importing this package imports no torch; its modules do.
"""
