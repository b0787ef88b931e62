"""The dispatch policy: how a rank chooses among its ready, admitted tasks.

The rules are the scoreboard's (:class:`hintpipe.dispatch.scoreboard.Scoreboard`); the choice is an option
every part takes (the simulator, the runtime, the command line, a step's record), so it is a module of its
own in :mod:`hintpipe.dispatch`, which every one of them may import.

This module is torch-free.
"""

from __future__ import annotations

from hintpipe.choice import Choice


class Policy(Choice):
    """How a rank chooses among its ready, admitted tasks.

    - ``fixed``: run the hint in order, waiting for its next task (the
      baseline every fixed-order pipeline uses).
    - ``greedy``: run the best-ranked ready, admitted task at once.
    - ``ready``: deviate from the hint only where it cannot cost the hint's
      next task ``k``. With *producer notices* (the driver says when the
      remote task that feeds ``k`` starts and ends; the simulator always
      does) it is the ETA rule: run ``k`` if it is ready; else take ``best``,
      the best-ranked ready task (an ``F`` only if admitted), and run it if
      it is expected to end before ``k``'s input is expected (ETA: the
      producer's end, or its start plus its expected cost, plus the latency;
      infinity while the producer has not started); an ``F`` may also go
      once that input is late (past its ETA by a quarter of ``k``'s cost: a
      tie in the plan is not lateness) or ``k`` is overdue by the plan;
      a ``B`` or ``W`` never overtakes a late input, because the downstream
      ranks wait on it. Where notices travel (the runtime), ties within that
      quarter go to the hint and a producer not heard of is expected by
      ``k``'s due time (see [Note: ETAs in the runtime]). Without notices (a
      driver that cannot tell) it is the older *patience* rule: ``best`` runs
      if it fits before ``k`` is due by the forecast (its planned gap after its
      predecessor plus a quarter of its cost, never before its planned
      start), or once ``k`` is overdue. Either way, without variability and
      latency it takes the makespan of ``fixed`` (zb-h1's own gaps it fills
      at that makespan), and it
      keeps greedy's gains without greedy's habit of starting a low-ranked
      task just before a high-ranked one arrives.
    """

    FIXED = "fixed"
    GREEDY = "greedy"
    READY = "ready"
