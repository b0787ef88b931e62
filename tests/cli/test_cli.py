"""The command line: the documented JSON keys, the claims, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import allow
from hintpipe.cli import main
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintName
from hintpipe.schedule.hint_csv import save_hint_csv
from json_keys import unitless_time_keys


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_compare_speedup_under_variable_lengths(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys,
        "simulate",
        "--ranks",
        "4",
        "--microbatches",
        "16",
        "--hint",
        "1f1b",
        "--variability",
        "mb:0.5",
        "--slack-microbatches",
        "2",
        "--trials",
        "20",
        "--microbatch-order",
        "given",
        "--compare",
    )
    assert out["speedup"] >= 1.10
    assert out["speedup"] == pytest.approx(out["fixed"]["makespan_cost"] / out["ready"]["makespan_cost"])
    assert unitless_time_keys(out) == []
    for policy in ("fixed", "greedy", "ready"):
        keys = {
            "makespan_cost",
            "lower_bound_cost",
            "efficiency",
            "bubble_fraction",
            "peak_live_slots",
            "tasks",
            "sim_seconds",
        }
        assert keys <= set(out[policy])
        assert out[policy]["tasks"] == 128
    assert out["fixed"]["peak_live_slots"] == [4, 3, 2, 1]


@pytest.mark.parametrize("hint", [h.value for h in HintName])
def test_ready_never_loses_without_variability(capsys: pytest.CaptureFixture[str], hint: str) -> None:
    chunks = ["--chunks", "2"] if hint == "interleaved-1f1b" else []
    out = run_json(
        capsys,
        "simulate",
        "--ranks",
        "4",
        "--microbatches",
        "16",
        "--hint",
        hint,
        *chunks,
        "--variability",
        "iid:0.0",
        "--slack-microbatches",
        "2",
        "--compare",
    )
    assert out["speedup"] == 1.0  # without variability ready runs the hint exactly as fixed does


def test_single_policy_json_and_outputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    out = run_json(
        capsys,
        "simulate",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        "--hint",
        "gpipe",
        "--policy",
        "fixed",
        "--trace",
        str(trace),
        "--timeline",
        str(png),
    )
    assert out["makespan_cost"] == 33
    assert out["bubble_fraction"] == pytest.approx(3 / 11)
    assert out["peak_live_slots"] == [8, 8, 8, 8]
    assert len([e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]) == 64
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_admission_by_size_holds_a_sorted_order_to_the_given_orders_memory(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["simulate", "--ranks", "8", "--microbatches", "32", "--hint", "bfw", "--variability", "mb:0.5"]
    common += ["--microbatch-order", "shortest-first", "--device-budget-fraction", "--trials", "3", "--compare"]
    by_size = run_json(capsys, *common, "--admission", "size")
    by_slots = run_json(capsys, *common)
    assert by_size["admission"] == "size"
    for policy in ("fixed", "greedy", "ready"):
        held, room = by_size[policy]["peak_live_size"], by_size[policy]["budget_size"]
        assert all(h <= b for h, b in zip(held, room, strict=True))
        assert (
            by_size[policy]["lower_bound_cost"]
            <= by_size[policy]["memory_bound_cost"]
            <= by_size[policy]["makespan_cost"]
        )
    assert by_slots["ready"]["peak_live_slots"][0] == 8  # slots: as many micro-batches as fixed 1F1B's busiest
    assert "peak_live_size" not in by_slots["ready"]


def test_hint_from_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "zb.csv"
    save_hint_csv(generate_hint("zb-h1", 4, 8), path)
    out = run_json(capsys, "simulate", "--ranks", "4", "--microbatches", "8", "--hint", str(path), "--policy", "fixed")
    assert out["makespan_cost"] == 8 * 3 + 3 * 1


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--ranks", "2", "--microbatches", "4", "--compare"]) == 0
    out = capsys.readouterr().out
    assert "makespan" in out and "speedup over fixed: ready 1.000x, greedy 1.000x" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hint", "2f2b"], "hintpipe simulate: error: unknown hint '2f2b': choose one of gpipe"),
        (["--variability", "mb"], "hintpipe simulate: error: bad variability 'mb': expected mb:SIGMA"),
        (
            ["--activation-budget", "2"],
            "hintpipe simulate: error: memory budget 2 on rank 0 is below the hint's own peak 4",
        ),
        (["--activation-budget", "1,2,3"], "--activation-budget has 3 values for 4: give one, or one each"),
        (["--activation-budget", "lots"], "bad size 'lots': expected a number with an optional unit"),
        (["--variability", "comm:2ms"], "the simulator counts in cost units: write cost units"),
        (["--chunks", "2"], "1f1b runs one chunk per rank, got --chunks 2; use interleaved-1f1b"),
        (["--trials", "0"], "trials must be at least 1, got 0"),
        (["--hint", "missing.csv"], "cannot read hint file missing.csv"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["simulate", "--ranks", "4", "--microbatches", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_unknown_policy_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--ranks", "4", "--microbatches", "8", "--policy", "eager"]) == 2
    assert (
        "argument --policy: invalid choice: 'eager' (choose from 'fixed', 'greedy', 'ready')" in capsys.readouterr().err
    )


def test_demo_trains_the_same_model_both_ways(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "demo.png"
    out = run_json(capsys, "demo", "--steps", "3", "--timeline", str(png))
    fixed, ready = out["fixed"], out["ready"]
    # Same data, same maths: the policies differ in order, not in the losses.
    assert ready["losses"] == pytest.approx(fixed["losses"], rel=1e-5)
    assert fixed["peak_live_slots"] == [2, 1]  # 1F1B on 2 ranks
    assert ready["peak_live_slots"][0] <= 4  # its budget: 2 + slack_microbatches 2
    assert (fixed["device"], fixed["transport"], fixed["device_peak_bytes"]) == ("cpu", "gloo", None)  # auto: gloo
    assert unitless_time_keys(out) == []
    assert out["speedup"] == pytest.approx(ready["tokens_per_s"] / fixed["tokens_per_s"])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_command_line_and_the_simulator_run_without_torch() -> None:
    # ``hintpipe simulate`` is pure Python and numpy: importing torch would cost it seconds.
    code = (
        "import sys, hintpipe.cli, hintpipe.sim.simulator, hintpipe.sim.compare, hintpipe.dispatch.scoreboard\n"
        "from hintpipe.cli import main\n"
        "assert main(['simulate', '--ranks', '2', '--microbatches', '4', '--json']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=allow(60))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["makespan_cost"] == 15.0  # (m + p - 1)(F + B) = 5 x (1 + 2)


def test_hintpipes_own_warnings_are_the_commands_lines_and_others_pythons() -> None:
    """A command's user saw ``.../planner/plan.py:377: EvalModeWarning: ...`` and then a line of hintpipe's source
    (``graph = captured if captured is not None else capture(...)``); now one line in the command's words."""
    from hintpipe.cli import _warning_line, _warnings_as_lines
    from hintpipe.planner.mode_check import EvalModeWarning

    before = warnings.formatwarning
    with _warnings_as_lines("train"):
        own = warnings.formatwarning("its router's noise", EvalModeWarning, "plan.py", 377, "graph = ...")
        other = warnings.formatwarning("deprecated", FutureWarning, "lib.py", 3, "x = 1")
    assert own == "hintpipe train: EvalModeWarning: its router's noise\n"
    assert other == "lib.py:3: FutureWarning: deprecated\n  x = 1\n"
    assert warnings.formatwarning is before  # put back: a test or a caller in the same process sees Python's
    assert _warning_line("plan", "m", EvalModeWarning, "f", 1) == "hintpipe plan: EvalModeWarning: m\n"
