"""The memory-aware planner: capture, profile, memory model, search, stage generation.

:func:`hintpipe.plan` (in :mod:`~hintpipe.planner.plan`) runs the chain. The
search (:mod:`~hintpipe.planner.search`, :mod:`~hintpipe.planner.tables`,
:mod:`~hintpipe.planner.memory`, :mod:`~hintpipe.planner.baselines`,
:mod:`~hintpipe.planner.partition`, :mod:`~hintpipe.planner.node_profile`)
works on plain data and imports no torch.
"""
