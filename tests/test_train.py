"""``hintpipe train`` end to end: JSON keys, gradient check, emulation, torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hintpipe.apps.models import ModelConfig, SeqLenDist
from hintpipe.apps.training import EmulatedCosts, TrainConfig, predict_step_time, train
from hintpipe.cli import main
from hintpipe.runtime.faults import Injection
from hintpipe.runtime.launch import free_port
from hintpipe.schedule.generators import generate_hint
from hintpipe.scoreboard import Policy
from hintpipe.sim.variability import SpecError


def test_train_json_and_gradient_check(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace, png = tmp_path / "trace.json", tmp_path / "t.png"
    argv = [
        "train",
        "--model",
        "gpt-mini",
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--steps",
        "3",
        "--hint",
        "zb-h1",
        "--policy",
        "greedy",
        "--seq-len-dist",
        "lognormal:32:0.5",
        "--check-grads",
        "--trace",
        str(trace),
        "--timeline",
        str(png),
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "step_time_median",
        "tokens_per_s",
        "efficiency",
        "losses",
        "peak_live",
        "max_grad_abs_diff",
        "max_grad_rel_diff",
    ):
        assert key in out
    assert len(out["losses"]) == 3 and out["losses"][-1] < out["losses"][0]
    assert len(out["peak_live"]) == 2 and min(out["peak_live"]) > 0
    assert out["max_grad_abs_diff"] <= 1e-6
    assert out["max_grad_rel_diff"] <= 1e-5
    # zb-h1 on 2 ranks, 4 micro-batches: F, B and W of 2 stages.
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 2 * 4 * 3
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--inject", "jitter:1"], "bad injection 'jitter:1': unknown kind 'jitter'"),
        (["--inject", "straggler:5:2"], "straggler rank 5 does not exist: the run has ranks 0..1"),
        (["--seq-len-dist", "normal:3"], "bad sequence length distribution 'normal:3'"),
        (["--hint", "zbv", "--chunks", "3"], "zbv runs exactly two chunks per rank in V shape, got --chunks 3"),
        (["--layers", "1", "--model", "mlp"], "1 layers cannot fill 2 stages"),
    ],
)
def test_bad_train_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["train", "--stages", "2", "--microbatches", "4", "--steps", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_injection_is_the_same_for_every_policy() -> None:
    injection = Injection.parse(["mb:0.5", "compute:0.3"], seed=7)
    a = injection.extra_seconds(0, 3, 1, "F", 2, 0.01)
    assert a == injection.extra_seconds(0, 3, 1, "F", 2, 0.01)
    assert a != injection.extra_seconds(0, 3, 1, "F", 3, 0.01)
    # mb:SIGMA is one factor per micro-batch, whatever the stage.
    only_mb = Injection.parse(["mb:0.5"], seed=7)
    assert only_mb.extra_seconds(0, 3, 0, "F", 2, 0.01) == only_mb.extra_seconds(1, 3, 5, "B", 2, 0.01)
    assert Injection.parse(["straggler:1:3"]).extra_seconds(1, 0, 0, "F", 0, 0.01) == pytest.approx(0.02)
    with pytest.raises(SpecError, match=r"bad injection 'comm:x': 'x' is not a number"):
        Injection.parse(["comm:x"])


@pytest.mark.parametrize("policy", ["fixed", "ready"])
def test_simulator_predicts_emulated_steps_within_10_percent(policy: str) -> None:
    # Sleep-based tasks (F 20 ms, B 40 ms per stage); variable micro-batch
    # sizes would need tokens, so the mlp's micro-batches scale nothing here.
    costs = EmulatedCosts((0.02, 0.02), (0.04, 0.04), (0.0, 0.0), reference_tokens=4)
    config = TrainConfig(
        model=ModelConfig("mlp", layers=2, hidden=8),
        ranks=2,
        microbatches=4,
        microbatch_size=4,
        policy=policy,
        steps=3,
        memory_slack=1,
        inject=("mb:0.5",),
        emulate=costs,
        timeout=60,
    )
    result = train(config)
    assert result is not None
    hint = generate_hint("1f1b", 2, 4)
    for report in result.reports[1:]:
        predicted = predict_step_time(hint, report, Policy(policy), slack=1)
        assert predicted == pytest.approx(report.step_time, rel=0.10)
    assert result.config.emulate is not None


def test_two_node_torchrun_launch_on_loopback(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]
    train_args = [
        "-m",
        "hintpipe",
        "train",
        "--model",
        "mlp",
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--steps",
        "2",
        "--seed",
        "3",
        "--json",
    ]
    nodes = [
        subprocess.Popen(
            [*command, "--node-rank", str(n), *train_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in (0, 1)
    ]
    outputs = [node.communicate(timeout=180) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    out = json.loads(outputs[0][0])
    assert outputs[1][0].strip() == ""  # only rank 0 reports
    # The same run spawned on one machine trains to the same losses.
    local = train(
        TrainConfig(model=ModelConfig("mlp", seed=3), ranks=2, microbatches=4, steps=2, seed=3, seq_len=SeqLenDist(64))
    )
    assert local is not None
    assert out["losses"] == pytest.approx(list(local.losses), rel=1e-6)


def test_memory_budget_in_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "--model", "gpt-mini", "--stages", "2", "--microbatches", "8", "--steps", "3"]
    assert main([*base, "--memory-budget", "1MiB"]) == 1
    err = capsys.readouterr().err
    assert (
        "rank 0: hintpipe.scoreboard.BudgetError: rank 0: memory budget 1MiB is below what the hint itself held" in err
    )
    assert main([*base, "--memory-budget", "1GiB", "--policy", "greedy", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # Ample room: after the measuring step, rank 0 runs ahead (greedy: whenever the hint's next
    # task, the first backward, is not ready, which it cannot be while rank 1 still computes).
    assert out["peak_live_slots"][0] > 2
    assert out["peak_live"][0] < 2**30
