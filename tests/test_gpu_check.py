"""benchmarks/gpu/run.sh, the prepared GPU check, end to end on CPU: every check runs and writes its result as
it ends, and one failing check fails the run without stopping the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

import gpu_check  # noqa: E402  (a benchmark script, importable from its folder)

TITLES = [
    "Offload hooks against plain autograd",
    "Two ranks sharing the GPU, against the unsplit model",
    "train --check-grads",
    "An injected NaN reaches the neighbour",
    "A plan that offloads, trained",
    "Throughput against torch's Schedule1F1B",
    "Memory: planned against measured",
    "Hugging Face models planned on either device, trained here",
    "Predicted against measured stage times",
    "Throughput of GPT-2 against the unsplit model",
    "The largest micro-batch under a memory cap",
    "bf16 10x slow: bf16 or the hint?",
]

#: Check 6's hints and the stages each runs on (4: two chunks per rank), in the table's order.
THROUGHPUT_HINTS = [
    ("1f1b", "2"),
    ("zb-h1", "2"),
    ("gpipe", "2"),
    ("bfw", "2"),
    ("bfw", "4"),
    ("interleaved-1f1b", "4"),
    ("zbv", "4"),
]
BOUND = "bound: both stages' compute in one process"


def throughput_rows() -> list[list[str]]:
    """Check 6's leading cells on CPU (no host-staged torch run there), in order."""
    rows = []
    for hint, stages in THROUGHPUT_HINTS:
        rows += [
            ["hintpipe", hint, stages, p, policy, "fixed"] for p in ("fp32", "bf16") for policy in ("fixed", "ready")
        ]
        if hint == "1f1b":
            rows += [["hintpipe", "1f1b", "2", "fp32", policy, "variable"] for policy in ("fixed", "ready")]
    return [
        *rows,
        ["torch Schedule1F1B", "1f1b", "2", "fp32", "-", "fixed"],
        [BOUND, "-", "2", "fp32", "-", "fixed"],
        ["busiest stage's compute alone", "-", "2", "fp32", "-", "fixed"],
        [BOUND, "-", "2", "bf16", "-", "fixed"],
        [BOUND, "-", "2", "fp32", "-", "variable"],
    ]


def assert_over_bound(table: dict[str, Any]) -> None:
    """Every run's "over bound" is its median step over its precision's and lengths' bound, minus 1, as the JSON
    data has them; the bounds themselves have none."""
    data = table["data"]
    for row in table["rows"]:
        figures = data[" | ".join(row[:6])]
        if row[0] == BOUND or row[0].startswith("busiest"):
            assert figures["over_bound"] is None and row[-1] == "-"
            continue
        assert figures["bound"] == " | ".join([BOUND, "-", "2", row[3], "-", row[5]])
        over = figures["step_s"] / data[figures["bound"]]["step_s"] - 1
        assert figures["over_bound"] == pytest.approx(over)
        assert row[-1] == f"{over * 100:+.1f}%"
    assert data["over_bound_goal"] == 0.05


def test_the_gpu_check_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    env = os.environ | {"PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu" / "run.sh"), str(out), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    checks = results["checks"]
    assert [(c["number"], c["title"], c["passed"]) for c in checks] == [(i + 1, t, True) for i, t in enumerate(TITLES)]
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(
        ["results.json", "results.md"]
        + [f"{gpu_check.Result(i + 1, t).slug}.{x}" for i, t in enumerate(TITLES) for x in ("json", "md")]
    )
    by_number = {c["number"]: c for c in checks}
    assert by_number[1]["data"]["parameters_moved"] == 0 and by_number[1]["data"]["max_abs_diff"] == 0.0
    assert [row[:3] for row in by_number[2]["rows"]] == [["fixed", "fixed", "gloo"], ["ready", "ready", "gloo"]]
    assert by_number[3]["data"]["max_grad_rel_diff"] <= 1e-5
    assert gpu_check.NAN_WORDS in by_number[4]["data"]["stderr"]
    assert sum(by_number[5]["data"]["offloaded"]) > 0 and by_number[5]["data"]["max_abs_diff"] == 0.0
    assert [row[:6] for row in by_number[6]["rows"]] == throughput_rows()
    assert_over_bound(by_number[6])
    assert [row[:4] for row in by_number[12]["rows"]] == [
        ["bfw", "bf16", "none", "yes"],
        ["bfw", "fp32", "none", "no"],
        ["zbv", "fp32", "2", "yes"],
        ["zbv", "bf16", "2", "no"],
    ]
    assert by_number[12]["data"]["answer"].startswith("bf16 over fp32: bfw ")
    assert by_number[7]["data"]["bounds"] == list(gpu_check.MEMORY_BOUNDS)
    hf_rows = by_number[8]["rows"]
    assert [row[:4] for row in hf_rows[:5]] == [
        ["gpt2", "cpu", "fixed", "fp32"],
        ["gpt2", "cpu", "ready", "fp32"],
        ["gpt2", "cpu (host)", "fixed", "fp32"],
        ["gpt2", "cpu (host)", "ready", "fp32"],
        ["gpt2", "cpu", "ready", "bf16"],
    ]
    assert all(row[-1] == "yes" for row in hf_rows) and len(hf_rows) == 10
    assert [row[:2] for row in by_number[9]["rows"]] == [["gpt2", "2"], ["gpt2", "4"], ["llama", "2"], ["llama", "4"]]
    assert done.stdout.splitlines()[-2].startswith("12 of 12 checks passed in ")


def _fails(setup: Any, result: Any) -> None:
    raise RuntimeError("the device fell off the bus")


def _passes(setup: Any, result: Any) -> None:
    result.passed = True
    result.summary = "fine"


def test_a_failing_check_fails_the_run_and_the_next_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpu_check, "CHECKS", [("First", _fails), ("Second", _passes)])
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu"]) == 1
    checks = json.loads((tmp_path / "results.json").read_text())["checks"]
    assert [(c["title"], c["passed"], c["summary"]) for c in checks] == [
        ("First", False, "Could not run: RuntimeError: the device fell off the bus"),
        ("Second", True, "fine"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "01-first.json",
        "01-first.md",
        "02-second.json",
        "02-second.md",
        "results.json",
        "results.md",
    ]
    assert capsys.readouterr().err == "failed: 1\n"
