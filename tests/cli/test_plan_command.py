"""``hintpipe plan`` (:mod:`hintpipe.cli.plan`): the plan of a built-in model as a table or one JSON object, its
baselines beside it, and no budget said as none (JSON has no infinity)."""

from __future__ import annotations

import json
import math

import pytest

from hintpipe.cli import main
from hintpipe.cli.plan import _finite
from json_keys import unitless_time_keys


def test_plan_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        "--model",
        "gpt-mini",
        "--layers",
        "2",
        "--hidden",
        "32",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--stage-memory",
        "64MiB",
        "--repeats",
        "1",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["stages"]) == 2
    for key in ("first_node", "last_node", "time_ms", "memory_bytes", "recompute", "offload"):
        assert key in out["stages"][0]
    assert {"bottleneck_ms", "max_microbatch_size"} <= set(out)
    for name in ("uniform", "params", "time"):
        assert {"bottleneck_ms", "max_microbatch_size"} <= set(out["baselines"][name])
    assert out["bottleneck_ms"] == pytest.approx(max(s["time_ms"] for s in out["stages"]))
    assert unitless_time_keys(out) == []


def test_plan_cli_without_a_stage_memory_plans_without_a_limit(capsys: pytest.CaptureFixture[str]) -> None:
    # As hintpipe.plan does by default: no budget, so no largest micro-batch to report.
    argv = ["plan", "--model", "gpt-mini", "--layers", "2", "--hidden", "32", "--ranks", "2", "--microbatches", "4"]
    assert main([*argv, "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 micro-batches of 4, stage memory unlimited" in out
    assert out.count("no limit") == 4  # the plan and its three baselines
    assert main([*argv, "--repeats", "1", "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert [s["budget_bytes"] for s in stages] == [None, None]  # no budget (JSON has no infinity)


def test_no_budget_is_written_as_none_wherever_it_stands() -> None:
    value = {"budget_bytes": math.inf, "stages": [{"budget_bytes": -math.inf, "time_ms": 1.5}], "n": 3}
    assert _finite(value) == {"budget_bytes": None, "stages": [{"budget_bytes": None, "time_ms": 1.5}], "n": 3}
    assert json.loads(json.dumps(_finite(value), allow_nan=False)) == _finite(value)
