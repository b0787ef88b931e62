"""The ``ready`` policy's arbitration against fixed order: never worse where it cannot gain."""

from __future__ import annotations

import numpy as np
import pytest

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.engine import drive, fixed_order
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.dispatch.variability import CommDelay, parse_variability
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintError, HintName
from hintpipe.sim.simulator import Sample, Simulator

LATENCIES = (0.0, 0.05, 0.2, 0.5, 1.0, 2.0)


def _chunks(name: HintName) -> int:
    return 2 if name in (HintName.ZBV, HintName.INTERLEAVED_1F1B) else 1


def _grid() -> list[tuple[HintName, int, int]]:
    cells = []
    for name in HintName:
        for p in (4, 8, 16):
            for m in (8, 32):
                try:
                    generate_hint(name, p, m, _chunks(name))
                except HintError:
                    continue  # interleaving needs whole rounds of micro-batches
                cells.append((name, p, m))
    return cells


def test_the_grid_has_492_configurations() -> None:
    assert len(_grid()) * len(LATENCIES) * 2 == 492


@pytest.mark.parametrize(("name", "p", "m"), _grid(), ids=lambda v: str(getattr(v, "value", v)))
def test_ready_never_loses_to_fixed_with_latency_and_no_jitter(name: HintName, p: int, m: int) -> None:
    # 7 hints x P {4, 8, 16} x M {8, 32} x latency x slack {0, 2}: 492 configurations. The
    # ETA rule knows when each input will land, so it deviates only where the next task
    # cannot be delayed; it equals fixed order exactly without latency.
    hint = generate_hint(name, p, m, _chunks(name))
    sim = Simulator(hint, CostModel.uniform(hint.stages))
    for latency in LATENCIES:
        sample = Sample.expected(hint, sim.cost_model, CommDelay(latency))
        fixed = sim.run(Policy.FIXED, sample).makespan
        for slack in (0, 2):
            ready = sim.run(Policy.READY, sample, slack_microbatches=slack).makespan
            if latency == 0.0:
                assert ready == fixed
            else:
                assert ready <= fixed


def test_patience_without_notices_can_lose_with_latency() -> None:
    # Why the ETA rule replaced patience: its due time includes a tolerance, so a
    # backfilled task can make the next one late (zb-h1, 4 x 8, latency 0.2: 0.993x).
    hint = generate_hint("zb-h1", 4, 8)
    sim = Simulator(hint, CostModel.uniform(4))
    sample = Sample.expected(hint, sim.cost_model, CommDelay(0.2))
    fixed = sim.run(Policy.FIXED, sample).makespan
    assert fixed / sim.run(Policy.READY, sample, notices=False).makespan == pytest.approx(0.99324, abs=1e-5)
    assert sim.run(Policy.READY, sample).makespan <= fixed


@pytest.mark.parametrize("name", [h.value for h in HintName])
def test_the_fixed_order_sweep_times_every_task_as_the_event_loop_does(name: str) -> None:
    hint = generate_hint(name, 4, 8, _chunks(HintName(name)))
    sim = Simulator(hint, CostModel.uniform(hint.stages))
    models = [parse_variability("mb:0.5"), parse_variability("comm:0.2:0.2")]
    sample = Sample.draw(hint, sim.cost_model, models, np.random.default_rng(4))
    cost = [sample.costs[ts.stage, ts.mb, ts.kind].tolist() for ts in hint.lists]
    delay = [sample.delays[ts.stage, ts.mb, ts.kind].tolist() for ts in hint.lists]
    layout = sim.layout
    swept = fixed_order(cost, delay, layout.source_rank, layout.source_pos)
    assert swept is not None
    boards = [Scoreboard(graph, Policy.FIXED) for graph in sim.graphs]
    starts, ends, _ = drive(boards, cost, delay, layout.link_rank, layout.link_pos, notices=False)
    assert swept == (starts, ends)
