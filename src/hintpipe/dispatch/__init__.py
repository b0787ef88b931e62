"""Dispatch: which task a rank runs next, and what it may hold. The one state machine both drivers share.

DESIGN's "one scoreboard, two drivers": the event simulator drives these modules with a virtual clock, the
runtime with messages and compute, so a simulation is a prediction of the runtime. Both import them from here;
neither imports the other (the runtime imports nothing from :mod:`hintpipe.sim`). Torch-free, and above only
:mod:`hintpipe.schedule` (what a schedule *is*) and the foundation: ``scripts/import_graph.py`` fails on an
arrow from here into the runtime, the simulator, the planner, the applications, the command line or the
options.

The state machine:

- ``scoreboard``: one rank's state: ready, admitted, running, done, live memory; ``take`` picks the next task.
- ``policy``: ``fixed``, ``greedy``, ``ready``: the rules ``take`` picks by.
- ``rank_graph``: one rank's tasks and their dependencies, memory per position (the scoreboard's fixed part).
- ``rank_forecast``: what ``ready`` expects of each task: when it is due, what it costs.
- ``budgets``: how much a rank may hold in flight (slots, bytes, a device's share).
- ``projected_live``: the live memory admission looks ahead at.
- ``fit``: a hint fitted into a memory budget; ``AdmissionUnit`` (slots or sizes).
- ``by_size``: admission by size: what each forward weighs, each rank's room, a step's fitted hint.
- ``per_position``: the flat per-position arrays the hot paths index.

What the state machine forecasts and is measured on:

- ``engine``: the fixed-order sweep (forecasting for ``ready``; every fixed run) and the event loop that drives
  scoreboards (the simulator's clock). The simulator runs on this engine, the runtime forecasts with it.
- ``layout``: a hint's graphs and cross-rank links by position, and its forecasts (a fixed-order run on
  expected costs).
- ``expected``: the ``ready`` forecast from measured per-stage medians (the runtime's, and a prediction's).
- ``bounds``: what no policy can beat, with any memory or at a budget (the simulator's results, the
  runtime's reports).
- ``cost_model``: each task's expected cost and activation size.
- ``sample``: one step's work, each task's cost and each message's delay: drawn by the simulator, measured
  by the runtime (its report's lower bound is :func:`~hintpipe.dispatch.bounds.lower_bound` of it).
- ``variability``: the models of runtime variability (``mb:0.5``, ``comm:2ms``, ``straggler:...``). They
  are not the simulator's alone: the runtime injects the very models the simulator draws from
  (:mod:`hintpipe.runtime.injection`), so a prediction and the run it predicts see the same work; they sit
  here, beside the samples drawn from them, rather than in the foundation, which holds no model of work.
"""
