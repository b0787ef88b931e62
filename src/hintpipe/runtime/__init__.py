"""The runtime: one process per rank, driving the scoreboard with messages and compute.

- :mod:`~hintpipe.runtime.pipeline`: the public :class:`Pipeline`, a facade that checks options and hands each step
  to :mod:`~hintpipe.runtime.engine` (one rank's steps and evaluations, each a step loop);
- :mod:`~hintpipe.runtime.assembly`: what a rank's pipeline is made of, built once into the frozen
  :mod:`~hintpipe.runtime.parts` (with the seams given beside the options; the ranks compare their options in
  :mod:`~hintpipe.runtime.option_agreement`);
- :mod:`~hintpipe.runtime.loop`: one step: the step loop, the executor, admission, the ``ready`` forecast,
  tensor-parallel coordination, the step hooks (agreement, reports);
- :mod:`~hintpipe.runtime.transport`: messages between ranks: the protocol, the transports by name (the gloo
  mailboxes, NCCL links), the wire format, staging through host memory;
- :mod:`~hintpipe.runtime.parallel`: the other axes: the mesh, data parallelism (replicas, FSDP2), tied
  weights;
- :mod:`~hintpipe.runtime.checkpoint`: checkpoints, collective phases, stopping on a signal;
- :mod:`~hintpipe.runtime.launch` (the launcher's side; a spawned rank starts in
  :mod:`~hintpipe.runtime.rank_entry` and runs :mod:`~hintpipe.runtime.rank_process`),
  :mod:`~hintpipe.runtime.faults` (with
  :mod:`~hintpipe.runtime.injection`), and below them all :mod:`~hintpipe.runtime.errors`,
  :mod:`~hintpipe.modes` (the runtime's choices), :mod:`~hintpipe.runtime.model_names`,
  :mod:`~hintpipe.runtime.liveness` (which peer stopped answering) and
  :mod:`~hintpipe.runtime.launcher_env` (what a launcher tells its ranks).

The floors (``scripts/import_graph.py`` holds them): those base modules; then the transport and the
checkpoints; then the loop; then the other axes (step hooks); then the rest, which assembles and runs it.

Importing this package imports no torch; its modules do.
"""
