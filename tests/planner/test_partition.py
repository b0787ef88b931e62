"""A partition as a plan reports it (:mod:`hintpipe.planner.partition`): the largest micro-batch that fits, found
by bracketing, and the partition's JSON."""

from __future__ import annotations

import numpy as np

from hintpipe.planner.memory import MemoryModel
from hintpipe.planner.partition import Partition, StagePlan, max_microbatch_size, summary
from hintpipe.planner.tables import NodeTables

TABLES = NodeTables(("a",), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), (), ())  # not read by the bracketing
MODEL = MemoryModel(inflight=(2, 1), budgets=(1e9, 1e9))


def test_the_largest_micro_batch_that_fits_is_found_whatever_its_size() -> None:
    scales: list[float] = []

    def fits(model: MemoryModel) -> bool:
        scales.append(model.scale)
        return model.scale * 8 <= 37  # profiled at 8: sizes up to 37 fit

    assert max_microbatch_size(TABLES, MODEL, 2, 8, fits) == 37
    assert scales[:7] == [1 / 8, 2 / 8, 4 / 8, 1.0, 2.0, 4.0, 8.0]  # doubled until it does not fit, then halved
    assert max_microbatch_size(TABLES, MODEL, 2, 8, lambda model: False) == 0  # not even one row
    assert max_microbatch_size(TABLES, MODEL, 2, 8, lambda model: True, limit=100) == 100
    assert max_microbatch_size(TABLES, MODEL, 2, 8, lambda model: model.scale * 8 <= 64, limit=100) == 64


def test_a_partition_is_reported_with_each_stages_figures_and_how_many_nodes_it_saves_on() -> None:
    stage = StagePlan("embed", "h.1", 12, 3.5, 6e8, 1e9, 2, 2e8, ("gelu", "mul"), ("h.0",))
    assert stage.spare_bytes == 4e8
    assert summary(Partition((0, 12, 20), 3.5, (stage,), 16)) == {
        "stages": [
            {
                "first_node": "embed",
                "last_node": "h.1",
                "nodes": 12,
                "time_ms": 3.5,
                "memory_bytes": 6e8,
                "budget_bytes": 1e9,
                "inflight": 2,
                "recompute": 2,
                "offload": 1,
            }
        ],
        "cuts": [0, 12, 20],
        "bottleneck_ms": 3.5,
        "max_microbatch_size": 16,
    }
