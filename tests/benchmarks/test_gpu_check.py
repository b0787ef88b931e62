"""benchmarks/gpu, the prepared GPU check: every row can fail, and the CPU dry run's rows are what they should be.

Each check's judgement is a pure function of its figures (``benchmarks/gpu/judge.py``): the tests below hand
every check a wrong result (a gradient dropped, one small tensor off, a skewed profile, a slow step, a memory
ratio off) and see its row fail and the run's last line name it. Then ``run.sh`` end to end on the CPU: which
rows pass there, which skip (exactly: the timing rows and the memory cap, which only a GPU measures), and the
figures that a CPU gives exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import allow

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

import correctness  # noqa: E402  (benchmark scripts, importable from their folder)
import gpu_check  # noqa: E402
import judge  # noqa: E402
from report import Result  # noqa: E402

TITLES = [title for title, _ in gpu_check.CHECKS]


def _grads() -> dict[str, torch.Tensor]:
    """A model's gradients: a large weight and a small bias."""
    return {"w": torch.linspace(-1.0, 1.0, 64).reshape(8, 8), "b": torch.full((4,), 1e-3)}


def _dropped() -> dict[str, torch.Tensor]:
    return {"w": _grads()["w"]}


def _small_tensor_off() -> dict[str, torch.Tensor]:
    """The bias off by 10% of itself: 1e-4, invisible beside the weight's scale (1.0)."""
    return _grads() | {"b": _grads()["b"] * 1.1}


def _one_element_off() -> dict[str, torch.Tensor]:
    w = _grads()["w"].clone()
    w[3, 3] += 1e-3
    return _grads() | {"w": w}


TIMING = judge.TIMING_OFF_CUDA
#: Per check: its rows from a wrong result, the first failing row's name, and why it fails.
WRONG: dict[int, Callable[[], tuple[list[judge.Verdict], str, str]]] = {
    1: lambda: (
        judge.judge_offload_hooks(_dropped(), _grads(), 42, 0, "cpu"),
        "gradients against plain autograd",
        "1 of 2 missing (b)",
    ),
    2: lambda: (
        judge.judge_shared_gpu("ready", "ready", _one_element_off(), _grads(), "cpu"),
        "ready: gradients against the unsplit model",
        "1 outside: w",
    ),
    3: lambda: (
        judge.judge_train_grads(0, 3e-5, [5.0, 4.9], 1e-5),
        "largest relative gradient difference",
        "outside the bound",
    ),
    4: lambda: (
        judge.judge_nan_abort(1, "rank 1: the loss of micro-batch 0 in step 1 is nan", correctness.NAN_WORDS),
        "the neighbour says the failing rank's words",
        "outside the bound",
    ),
    5: lambda: (
        judge.judge_offload_training([0, 0], _grads(), _grads(), "cpu"),
        "offloaded nodes",
        "the plan offloads nothing",
    ),
    6: lambda: (
        judge.judge_throughput(
            {"1f1b fp32 fixed": 0.150}, {"1f1b fp32 fixed": 0.100}, 0.140, ["1f1b fp32 fixed"], "cuda"
        ),
        "1f1b fp32 fixed: against the bound",
        "outside the bound",
    ),
    7: lambda: (
        judge.judge_memory(
            [("stage 0: held / predicted", 1e3, 1e3, ""), ("stage 1: held / predicted", 1e3, 1.4e3, "")]
        ),
        "stage 1: held / predicted",
        "outside the bound",
    ),
    8: lambda: (
        judge.judge_hf_run("gpt2 device ready bf16", 4.15, 4.16, _small_tensor_off(), _grads(), "cpu"),
        "gpt2 device ready bf16: gradients",
        "1 outside: b",
    ),
    9: lambda: (
        judge.judge_stage_times("gpt2 2 stages", [10.0, 10.0], [10.5, 12.0], "cuda"),
        "gpt2 2 stages, stage 1: measured / predicted",
        "outside the bound",
    ),
    10: lambda: (
        judge.judge_throughput(
            {"hintpipe ready fp32": 0.100}, {"hintpipe ready fp32": 0.095}, 0.080, ["hintpipe ready fp32"], "cuda"
        ),
        "hintpipe ready fp32: against torch Schedule1F1B",
        "outside the bound",
    ),
    11: lambda: (
        judge.judge_memory_cap((4, 4), (2, 4), "cuda"),
        "largest micro-batch under the cap",
        "outside the bound",
    ),
    12: lambda: (
        judge.judge_slow_bf16(
            {("bfw", "fp32"): 0.13, ("bfw", "bf16"): 1.30, ("zbv", "fp32"): 0.12, ("zbv", "bf16"): 0.11}, "cuda"
        ),
        "bfw: bf16 over fp32",
        "outside the bound",
    ),
}


def _passes(setup: Any, result: Result) -> None:
    result.judge([judge.check("fine", True, "1", "1")])
    result.summary = "fine"


@pytest.mark.parametrize("number", list(WRONG))
def test_a_wrong_result_fails_its_row_and_the_last_line_names_it(
    number: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    verdicts, row, why = WRONG[number]()
    assert judge.first_failing(verdicts) == next(v for v in verdicts if v.row == row)

    def wrong(setup: Any, result: Result) -> None:
        result.judge(verdicts)

    checks: list[tuple[str, Any]] = [(title, _passes) for title in TITLES]
    checks[number - 1] = (TITLES[number - 1], wrong)
    monkeypatch.setattr(gpu_check, "CHECKS", checks)
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu"]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[-1] == f"first failing row: {number}. {TITLES[number - 1]}: {row}: {why}"
    assert out.err == f"failed: {number}\n"
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["final"] == out.out.splitlines()[-1]
    assert [c["passed"] for c in results["checks"]] == [n != number for n in range(1, 13)]


def test_the_same_figures_skip_off_cuda_and_pass_within_their_bounds() -> None:
    slow = judge.judge_throughput({"r": 0.150}, {"r": 0.100}, 0.140, ["r"], "cpu")
    assert [(v.row, v.status, v.why) for v in slow] == [
        ("r: against the bound", "SKIP", TIMING),
        ("r: against torch Schedule1F1B", "SKIP", TIMING),
    ]
    fine = judge.judge_throughput({"r": 0.110}, {"r": 0.100}, 0.115, ["r"], "cuda")
    assert [(v.status, v.figures) for v in fine] == [
        ("PASS", "110.0 ms against 100.0 ms: 0.909x"),
        ("PASS", "110.0 ms against 115.0 ms: 1.045x"),
    ]
    assert judge.judge_throughput({"r": "could not run: boom"}, {}, 0.1, ["r"], "cpu")[0].status == "FAIL"
    assert [v.status for v in judge.judge_stage_times("m", [10.0, 10.0], [10.5, 12.0], "cpu")] == ["SKIP"] * 3
    assert [v.status for v in judge.judge_memory_cap((4, 2), None, "cpu")] == ["PASS", "SKIP"]
    offloading = judge.judge_memory([("s", 1e3, 0.7e3, judge.OFFLOAD_OFF_CUDA)])
    assert [(v.status, v.why) for v in offloading] == [("SKIP", judge.OFFLOAD_OFF_CUDA)]


def test_gradients_fail_when_one_is_missing_extra_or_a_small_tensor_is_off() -> None:
    expected = _grads()
    assert judge.judge_gradients("g", expected, expected, "cpu").status == "PASS"
    assert judge.judge_gradients("g", _dropped(), expected, "cpu").why == "1 of 2 missing (b)"
    extra = expected | {"c": torch.zeros(2)}
    assert judge.judge_gradients("g", extra, expected, "cpu").why == "1 not in the reference (c)"
    assert judge.judge_bf16_gradients("g", _dropped(), expected).why == "1 of 2 missing (b)"
    # bf16: each tensor against its own scale, so the bias 10% off fails while 1% off passes
    assert judge.judge_bf16_gradients("g", _small_tensor_off(), expected).why == "1 outside: b"
    near = expected | {"b": expected["b"] * 1.01}
    assert judge.judge_bf16_gradients("g", near, expected).status == "PASS"
    nan = expected | {"b": torch.full((4,), float("nan"))}
    assert judge.judge_bf16_gradients("g", nan, expected).why == "1 outside: b"
    assert judge.judge_gradients("g", nan, expected, "cpu").why == "1 outside: b"
    reshaped = expected | {"w": expected["w"].reshape(64)}
    assert judge.judge_gradients("g", reshaped, expected, "cpu").why == "1 of another shape (w)"


def test_a_check_that_raises_fails_and_the_next_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def raises(setup: Any, result: Result) -> None:
        raise RuntimeError("the device fell off the bus")

    monkeypatch.setattr(gpu_check, "CHECKS", [("First", raises), ("Second", _passes)])
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu"]) == 1
    checks = json.loads((tmp_path / "results.json").read_text())["checks"]
    summary = "Could not run: RuntimeError: the device fell off the bus"
    assert [(c["title"], c["passed"], c["summary"]) for c in checks] == [
        ("First", False, summary),
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
    out = capsys.readouterr()
    assert out.err == "failed: 1\n"
    assert out.out.splitlines()[-1] == f"first failing row: 1. First: the check ran: {summary}"


# -- the dry run on CPU -----------------------------------------------------------------------------------------

#: Check 6's hintpipe runs (their table labels), in order: hint, stages, then precision x policy.
THROUGHPUT_HINTS = [
    ("1f1b", "2"),
    ("zb-h1", "2"),
    ("gpipe", "2"),
    ("bfw", "2"),
    ("bfw", "4"),
    ("interleaved-1f1b", "4"),
]
THROUGHPUT_HINTS.append(("zbv", "4"))
BOUND = "bound: both stages' compute in one process"


def throughput_runs() -> list[list[str]]:
    rows = []
    for hint, stages in THROUGHPUT_HINTS:
        rows += [["hintpipe", hint, stages, p, q, "fixed"] for p in ("fp32", "bf16") for q in ("fixed", "ready")]
        if hint == "1f1b":
            rows += [["hintpipe", "1f1b", "2", "fp32", policy, "variable"] for policy in ("fixed", "ready")]
    return rows


def throughput_rows() -> list[list[str]]:
    """Check 6's leading cells on CPU (no host-staged torch run there), in order."""
    return [
        *throughput_runs(),
        ["torch Schedule1F1B", "1f1b", "2", "fp32", "-", "fixed"],
        [BOUND, "-", "2", "fp32", "-", "fixed"],
        ["busiest stage's compute alone", "-", "2", "fp32", "-", "fixed"],
        [BOUND, "-", "2", "bf16", "-", "fixed"],
        [BOUND, "-", "2", "fp32", "-", "variable"],
    ]


def memory_rows(offloaded: dict[str, list[int]], skipped: bool) -> list[str]:
    """Check 7's rows that skip on CPU (a stage that offloads) or pass (the others)."""
    rows = [(f"stage {i}, {plan}: held / predicted", offloaded[plan][i] > 0) for i in range(4) for plan in offloaded]
    return [row for row, offloads in rows if offloads == skipped]


def skipped_rows(offloaded: dict[str, list[int]]) -> dict[int, list[str]]:
    """Every row the CPU dry run skips, by check: the timing rows, the memory cap, and the memory of a stage that
    offloads (which the CPU's accounting does not see)."""
    six = []
    for cells in throughput_runs():
        label = " | ".join(cells)
        six.append(f"{label}: against the bound")
        if cells[3] == "fp32" and cells[5] == "fixed":
            six.append(f"{label}: against torch Schedule1F1B")
    nine = []
    for model in ("gpt2", "llama"):
        for stages in (2, 4):
            nine += [f"{model} {stages} stages, stage {s}: measured / predicted" for s in range(stages)]
            nine.append(f"{model} {stages} stages: slowest measured / mean")
    ten = [f"hintpipe {p} {x}: against the bound" for x in ("fp32", "bf16") for p in ("fixed", "ready")]
    ten[1:1] = ["hintpipe fixed fp32: against torch Schedule1F1B"]
    ten[3:3] = ["hintpipe ready fp32: against torch Schedule1F1B"]
    twelve = ["bfw: bf16 over fp32", "zbv: bf16 over fp32", "fp32: bfw over zbv", "bf16: bfw over zbv"]
    return {
        6: six,
        7: memory_rows(offloaded, True),
        9: nine,
        10: ten,
        11: ["largest micro-batch under the cap"],
        12: twelve,
    }


def passed_rows(offloaded: dict[str, list[int]]) -> dict[int, list[str]]:
    """Every row the CPU dry run measures and passes, by check."""
    eight = []
    for model in ("gpt2", "llama"):
        eight.append(f"{model}: the device's plan file loads on the host")
        for run in (
            "device fixed fp32",
            "device ready fp32",
            "host fixed fp32",
            "host ready fp32",
            "device ready bf16",
        ):
            eight += [f"{model} {run}: loss", f"{model} {run}: gradients"]
    return {
        1: ["gradients against plain autograd", "saved tensors moved", "parameters moved"],
        2: [f"{p}: {what}" for p in ("fixed", "ready") for what in ("ran as", "gradients against the unsplit model")],
        3: ["exit status", "largest relative gradient difference", "losses finite"],
        4: ["exit status", "the neighbour says the failing rank's words"],
        5: ["offloaded nodes", "gradients against the unsplit model"],
        7: memory_rows(offloaded, False),
        8: eight,
        11: ["planner's largest micro-batch"],
    }


def test_the_gpu_check_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    env = os.environ | {"PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu" / "run.sh"), str(out), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=allow(600),  # about 60 s of one core's time: 10x for a loaded machine
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    checks = {c["number"]: c for c in results["checks"]}
    assert [checks[n]["title"] for n in sorted(checks)] == TITLES
    by_status: dict[str, dict[int, list[str]]] = {"PASS": {}, "SKIP": {}}
    for number, c in checks.items():
        assert [v["status"] for v in c["verdicts"] if v["status"] == "FAIL"] == [], c["verdicts"]
        for status, rows in by_status.items():
            named = [v["row"] for v in c["verdicts"] if v["status"] == status]
            if named:
                rows[number] = named
    offloaded = checks[7]["data"]["offloaded"]
    assert sum(offloaded["budget"]) > 0 and list(offloaded) == ["no budget", "budget"]
    assert by_status["SKIP"] == skipped_rows(offloaded)
    assert by_status["PASS"] == passed_rows(offloaded)
    skips = {v["why"] for c in checks.values() for v in c["verdicts"] if v["status"] == "SKIP"}
    assert skips == {judge.TIMING_OFF_CUDA, judge.OFFLOAD_OFF_CUDA, "a CPU has no per-process memory cap (CUDA only)"}
    passed = sum(len(rows) for rows in passed_rows(offloaded).values())
    skipped = sum(len(rows) for rows in skipped_rows(offloaded).values())
    final = f"all passed: 12 checks, {passed} rows passed, {skipped} skipped"
    assert results["final"] == final and done.stdout.splitlines()[-2] == final
    assert results["whole"]["status"] == "SKIP"
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(
        ["results.json", "results.md"]
        + [f"{Result(i + 1, t).slug}.{x}" for i, t in enumerate(TITLES) for x in ("json", "md")]
    )
    # What a CPU gives exactly: the same gradients as the unsplit model, bit for bit, where the order of the sums
    # is the same; the planner's activation bytes within its bounds; every hint's run in the throughput table.
    assert checks[1]["data"]["parameters_moved"] == 0 and checks[1]["data"]["max_abs_diff"] == 0.0
    assert [checks[2]["data"][p]["max_abs_diff"] for p in ("fixed", "ready")] == [0.0, 0.0]
    assert checks[3]["data"]["max_grad_rel_diff"] == 0.0
    assert correctness.NAN_WORDS in checks[4]["data"]["stderr"]
    assert sum(checks[5]["data"]["offloaded"]) > 0 and checks[5]["data"]["max_abs_diff"] == 0.0
    low, high = checks[7]["data"]["bounds"]
    held, predicted = checks[7]["data"]["measured"], checks[7]["data"]["predicted"]
    for plan in ("no budget", "budget"):  # every stage that does not offload
        ratios = [m["held"] / p for m, p, n in zip(held[plan], predicted[plan], offloaded[plan], strict=True) if not n]
        assert all(low <= r <= high for r in ratios), ratios
    assert [row[:6] for row in checks[6]["rows"]] == throughput_rows()
    assert all("could not run" not in " ".join(row) for row in checks[6]["rows"] + checks[10]["rows"])
    assert [row[:4] for row in checks[12]["rows"]] == [
        ["bfw", "bf16", "none", "yes"],
        ["bfw", "fp32", "none", "no"],
        ["zbv", "fp32", "2", "yes"],
        ["zbv", "bf16", "2", "no"],
    ]
