"""The rules agree everywhere: one dependency rule and one in-flight peak, read by every caller.

:mod:`hintpipe.schedule.rules` defines them once; these tests check that the
validator, the scoreboard's graph, the generators, the simulator and the
runtime's measured peak derive exactly what the rules say, for every
generator, 2, 4 and 8 ranks, and every chunk count the generator allows.
"""

from __future__ import annotations

import itertools

import pytest

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.runtime.loop.reports import measured_peak
from hintpipe.schedule import rules
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, HintName
from hintpipe.schedule.task import Kind, Task
from hintpipe.schedule.validation import validate_hint
from hintpipe.sim.simulator import Simulator

CHUNKS = {
    HintName.GPIPE: (1, 2),
    HintName.ONE_F_ONE_B: (1,),
    HintName.INTERLEAVED_1F1B: (1, 2),
    HintName.ZB_H1: (1,),
    HintName.ZBV: (2,),
    HintName.BF: (1, 2),
    HintName.BFW: (1, 2),
}
CASES = [
    (name, ranks, chunks) for name, chunks_allowed in CHUNKS.items() for ranks in (2, 4, 8) for chunks in chunks_allowed
]


def _hint(name: HintName, ranks: int, chunks: int) -> Hint:
    return generate_hint(name, ranks, 8, chunks)


@pytest.mark.parametrize(("name", "ranks", "chunks"), CASES)
def test_the_scoreboard_graph_is_the_dependency_rule(name: HintName, ranks: int, chunks: int) -> None:
    hint = _hint(name, ranks, chunks)
    validate_hint(hint)  # the validator's dependency checks pass on every generated hint
    stage_rank = hint.placement.stage_rank
    for r in range(hint.ranks):
        graph = RankGraph(hint, r)
        for i, task in enumerate(graph.tasks):
            deps = rules.dependencies(task, hint.stages)
            assert graph.need[i] == len(deps)
            succ = rules.successors(task, hint.stages, hint.split_backward)
            local = {graph.tasks[j] for j in graph.local[i]}
            link = graph.remote[i]
            remote = {link[1]} if link is not None else set()
            assert local | remote == set(succ)
            assert all(stage_rank[t.stage] == r for t in local)
            assert all(stage_rank[t.stage] != r for t in remote)


@pytest.mark.parametrize(("name", "ranks", "chunks"), CASES)
def test_successors_invert_dependencies(name: HintName, ranks: int, chunks: int) -> None:
    hint = _hint(name, ranks, chunks)
    tasks = [t for per_rank in hint.lists for t in per_rank]
    for a, b in itertools.product(tasks, repeat=2):
        if a.mb == b.mb:
            assert (a in rules.dependencies(b, hint.stages)) == (
                b in rules.successors(a, hint.stages, hint.split_backward)
            )


@pytest.mark.parametrize(("name", "ranks", "chunks"), CASES)
def test_one_in_flight_peak_everywhere(name: HintName, ranks: int, chunks: int) -> None:
    hint = _hint(name, ranks, chunks)
    result = Simulator(hint, CostModel.uniform(hint.stages)).run(Policy.FIXED)
    records = result.timeline()
    for r in range(hint.ranks):
        by_rule = rules.in_flight_peak(hint.lists[r], hint.split_backward)
        assert RankGraph(hint, r).peak == by_rule  # the scoreboard's admission
        assert result.peak_live[r] == by_rule  # the simulator's accounting
        # The runtime measures its peak from the timeline (start of F to end of the releaser);
        # with uniform costs the fixed-order timeline holds exactly the hint's peak.
        mine = [rec for rec in records if rec[0] == r]
        assert measured_peak(mine, hint.split_backward) == by_rule
    for s in range(hint.stages):
        stage_records = [rec for rec in records if rec[1].stage == s]
        assert measured_peak(stage_records, hint.split_backward) == hint.stage_peaks[s]


@pytest.mark.parametrize(("name", "ranks", "chunks"), CASES)
def test_the_simulator_respects_every_dependency(name: HintName, ranks: int, chunks: int) -> None:
    hint = _hint(name, ranks, chunks)
    for policy in Policy:
        result = Simulator(hint, CostModel.uniform(hint.stages)).run(policy, slack_microbatches=1)
        start = {task: begin for _, task, begin, _ in result.timeline()}
        end = {task: finish for _, task, _, finish in result.timeline()}
        for task in start:
            for dep in rules.dependencies(task, hint.stages):
                assert start[task] >= end[dep]


def test_memory_delta_is_one_for_a_forward_and_minus_one_for_its_releaser() -> None:
    assert [rules.memory_delta(Task(0, k, 0), False) for k in Kind] == [1, -1, 0]
    assert [rules.memory_delta(Task(0, k, 0), True) for k in Kind] == [1, 0, -1]
    assert rules.in_flight([Task(0, Kind.F, 0), Task(0, Kind.F, 1), Task(0, Kind.B, 0)], False) == [1, 2, 1]
