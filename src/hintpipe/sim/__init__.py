"""The event simulator: the scoreboard on a virtual clock, with cost and variability models.

Torch-free. The runtime uses :mod:`hintpipe.sim.expected` to plan the
``ready`` policy from measured task times, so a simulation and the runtime's
expectations come from the same engine.
"""
