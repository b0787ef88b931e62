"""The runtime: one process per rank, driving the scoreboard with messages and compute.

Modules: :mod:`~hintpipe.runtime.pipeline` (the public :class:`Pipeline`),
:mod:`~hintpipe.runtime.step_loop` (one step's dispatch loop),
:mod:`~hintpipe.runtime.executor` and :mod:`~hintpipe.runtime.transport` (the
two protocols the loop drives), :mod:`~hintpipe.runtime.admission`,
:mod:`~hintpipe.runtime.reports`, :mod:`~hintpipe.runtime.faults`,
:mod:`~hintpipe.runtime.launch` and :mod:`~hintpipe.runtime.checkpoint`.
Importing this package imports no torch; its modules do.
"""
