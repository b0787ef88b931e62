"""The memory-aware planner: capture, profile, memory model, search, stage generation.

:func:`hintpipe.plan` (in :mod:`~hintpipe.planner.plan`) runs the chain. The
search (:mod:`~hintpipe.planner.search`, :mod:`~hintpipe.planner.tables`,
:mod:`~hintpipe.planner.memory`, :mod:`~hintpipe.planner.baselines`) works on
plain arrays and imports no torch.
"""
