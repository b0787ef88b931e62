"""``hintpipe train`` end to end: JSON keys, gradient check, emulation, torchrun."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from rich.progress import Progress
from torch import nn

import hintpipe
from conftest import allow
from groups import Case, failure_text, run_cases, succeeded
from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, loss_fn_for, make_batch, whole_model
from hintpipe.apps.progress import log_line
from hintpipe.apps.training import EmulatedCosts, TrainConfig, _train_rank, predict_step_time
from hintpipe.cli import build_parser, main
from hintpipe.cli.train import config_from, result_json
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.variability import CommDelay, parse_variability
from hintpipe.option import said_as_flags
from hintpipe.planner.plan import plan
from hintpipe.planner.plan_file import PlanFileError, load_plan, read_plan_file, save_plan
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.launch import free_port
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint_csv import save_hint_csv
from hintpipe.schedule.task import Kind
from hintpipe.spec import SpecError
from json_keys import unitless_time_keys


def test_train_json_and_gradient_check(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace, png = tmp_path / "trace.json", tmp_path / "t.png"
    argv = [
        "train",
        "--model",
        "gpt-mini",
        "--ranks",
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
        "step_time_median_s",
        "step_times_s",
        "tokens_per_s",
        "efficiency",
        "losses",
        "peak_live_bytes",
        "max_grad_abs_diff",
        "max_grad_rel_diff",
    ):
        assert key in out
    assert len(out["losses"]) == 3 and out["losses"][-1] < out["losses"][0]
    assert len(out["peak_live_bytes"]) == 2 and min(out["peak_live_bytes"]) > 0
    assert out["max_grad_abs_diff"] <= 1e-6
    assert out["max_grad_rel_diff"] <= 1e-5
    assert out["grad_rel_tolerance"] == 1e-4
    assert unitless_time_keys(out) == []
    assert out["transport"] == "gloo"  # what the pipeline chose for --transport auto on CPU ranks
    assert out["step_time_median_s"] == statistics.median(out["step_times_s"][1:])  # seconds, steps after the first
    # zb-h1 on 2 ranks, 4 micro-batches: F, B and W of 2 stages.
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 2 * 4 * 3
    assert png.read_bytes()[:4] == b"\x89PNG"


class _PlacingPipeline:
    """Stands in for the pipeline: moves the stage of rank 0 to another device in place, as a GPU rank's does
    (``meta`` here: a device the test machine has)."""

    @classmethod
    def from_modules(cls, modules: list[nn.Module], **options: Any) -> _PlacingPipeline:
        modules[0].to("meta")
        return cls()


def test_the_gradient_reference_is_the_whole_model_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from hintpipe.apps import training

    monkeypatch.setattr(training, "Pipeline", _PlacingPipeline)
    config = TrainConfig.of(model=ModelConfig("mlp", layers=2, hidden=8), ranks=2, microbatches=2, check_grads=True)
    _, modules, reference = training._build_pipeline(0, 2, config)
    assert modules is not None and isinstance(reference, list)
    assert {p.device.type for p in modules[0].parameters()} == {"meta"}  # rank 0's stage was placed
    # The reference was copied before: every stage on the host, with the model's initial weights.
    assert {p.device.type for stage in reference for p in stage.parameters()} == {"cpu"}
    for mine, copied in zip(modules[1].parameters(), reference[1].parameters(), strict=True):
        assert torch.equal(mine, copied) and mine is not copied


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variability", "jitter:1"], "bad variability 'jitter:1': unknown model 'jitter'"),
        (["--variability", "crash:1:2"], "bad variability 'crash:1:2': crash is a fault, not variability: give it"),
        (["--faults", "mb:0.5"], "bad fault 'mb:0.5': mb is variability, not a fault: give it with --variability"),
        (["--variability", "straggler:2:5"], "straggler stage 5 does not exist: the pipeline has 2 stages"),
        (["--seq-len-dist", "normal:3"], "bad sequence length distribution 'normal:3'"),
        (["--hint", "zbv", "--chunks", "3"], "zbv runs exactly two chunks per rank in V shape, got --chunks 3"),
        (
            ["--layers", "1", "--model", "mlp"],
            "--layers 1 makes 1 layers, too few for 2 stages; use --layers 2 or more, or fewer stages",
        ),
        (
            ["--activation-budget", "1B"],
            "--activation-budget 1 is below one micro-batch's hidden states, 64KiB (4 x 64 tokens x 64 values of 4 "
            "bytes), which every stage keeps while a micro-batch is in flight; give several times that (the hint "
            "holds several micro-batches), or leave it out",
        ),
        (
            ["--layers", "2", "--ranks", "5"],
            "--layers 2 makes 4 layers (2 and 2 more of gpt-mini's own), too few for 5 stages; use --layers 3 or more, "
            "or fewer stages",
        ),
        (["--timeout", "0"], "--timeout must be between 1 and 604800, got 0 (1 s: a busy machine delays messages"),
        (["--timeout", "nan"], "--timeout must be finite, got nan"),
        (["--timeout", "1e15"], "--timeout must be between 1 and 604800, got 1e+15"),
        (["--seed", "-1"], "--seed must be between 0 and 4294967295, got -1"),
        (["--slack-microbatches", "nan"], "--slack-microbatches must be finite, got nan"),
        (["--slack-microbatches", "-3"], "--slack-microbatches must be >= 0, got -3"),
        (["--microbatch-size", "0"], "--microbatch-size must be at least 1, got 0"),
        (["--seq-len-dist", "fixed:0"], "bad sequence length distribution 'fixed:0': T '0' is not an integer >= 1"),
        (["--seq-len-dist", "fixed:-3"], "bad sequence length distribution 'fixed:-3': T '-3' is not an integer"),
        (["--chunks", "0"], "--chunks must be at least 1, got 0"),
        (["--microbatches", "0"], "--microbatches must be at least 1, got 0"),
        (["--faults", "crash:1:99"], "--faults names step 99, the run has steps 0..0: it would never fire"),
        (["--trace", "/no/such/folder/t.json"], "--trace /no/such/folder/t.json: the folder /no/such/folder does not"),
        (["--checkpoint-dir", "pyproject.toml"], "--checkpoint-dir pyproject.toml is a file, not a folder"),
        (
            ["--checkpoint-dir", "pyproject.toml/ck"],
            "--checkpoint-dir pyproject.toml/ck: its parent pyproject.toml is a file, not a folder",
        ),
        (["--checkpoint-keep", "0"], "--checkpoint-keep must be at least 1, got 0"),
        (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir"),
        (["--resume", "--replace-checkpoints"], "--resume and --replace-checkpoints need --checkpoint-dir"),
        (
            ["--checkpoint-dir", "/no/such/parent/ck"],
            "--checkpoint-dir /no/such/parent/ck: its parent /no/such/parent does not exist (a typo?); create it first",
        ),
        (["--seq-len-dist", "fixed:5000"], "--seq-len-dist fixed:5000: gpt-mini's positions end at 255 tokens; use a"),
        (["--microbatches", "100000000"], "--microbatches 100000000 x --microbatch-size 4 x 64 tokens: a step's data"),
        (["--trace", "/proc/t.json"], "--trace /proc/t.json cannot be written: No such file or directory"),
        (["--faults", "savefail:0:0"], "--faults savefail and savestop need --checkpoint-dir and --checkpoint-every"),
        (
            ["--faults", "savefail:2:0", "--checkpoint-dir", "/no/such/parent/ck", "--checkpoint-every", "1"],
            "savefail rank 2 does not exist: the run has ranks 0..1",
        ),
        (["--device-budget-fraction", "-5"], "--device-budget-fraction must be >= 0, got -5"),
        (
            ["--slack-microbatches", "1", "--device-budget-fraction", "0"],
            "not allowed with argument --slack-microbatches",
        ),
        pytest.param(
            ["--device", "cuda"],
            "--device cuda was asked for, but torch.cuda.is_available() is False on this machine",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA"),
        ),
        (["--transport", "nccl"], "--transport nccl moves tensors between GPUs; it needs --device cuda on a machine"),
        pytest.param(
            ["--transport", "nccl", "--device", "auto"],
            "--transport nccl moves tensors between GPUs; it needs --device cuda on a machine with CUDA",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA"),
        ),
        (
            ["--variability", "mm:1:0.5:1.5"],
            "FRACTION is the encoder's share of the stages, between 0 and 1, got '1.5'",
        ),
    ],
)
def test_bad_train_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["train", "--ranks", "2", "--microbatches", "4", "--steps", "1", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("changes", "message", "flags"),
    [
        ({"checkpoint_every": 2}, "checkpoint_every needs checkpoint_dir", "--checkpoint-every needs --checkpoint-dir"),
        (
            {"resume": True, "group_readable": True},
            "resume and group_readable need checkpoint_dir",
            "--resume and --group-readable need --checkpoint-dir",
        ),
        (
            {"checkpoint_dir": "ck", "resume": True, "replace_checkpoints": True},
            "resume continues the folder's run, replace_checkpoints deletes it: give one",
            "--resume continues the folder's run, --replace-checkpoints deletes it: give one",
        ),
        (
            {"faults": ("savefail:0:0",)},
            "faults savefail and savestop need checkpoint_dir and checkpoint_every",
            "--faults savefail and savestop need --checkpoint-dir and --checkpoint-every",
        ),
        (
            {"steps": 3, "warmup_steps": 4},
            "warmup_steps 4 is more than steps 3: the warm-up would never end; use warmup_steps 3 or fewer",
            "--warmup-steps 4 is more than --steps 3: the warm-up would never end; use --warmup-steps 3 or fewer",
        ),
        pytest.param(
            {"transport": "nccl"},
            "transport nccl moves tensors between GPUs; it needs device cuda on a machine with CUDA",
            "--transport nccl moves tensors between GPUs; it needs --device cuda on a machine with CUDA",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA"),
        ),
    ],
)
def test_a_run_s_rules_are_the_config_s_in_the_caller_s_words(
    changes: dict[str, Any], message: str, flags: str
) -> None:
    # Before, only the command line checked these: TrainConfig.of(checkpoint_every=2) without a folder, or
    # resume=True, trained afresh and saved nothing, saying nothing.
    with pytest.raises(ValueError) as refused:
        TrainConfig.of(model=ModelConfig("mlp"), ranks=2, microbatches=2, **changes)
    assert str(refused.value) == message
    with said_as_flags(), pytest.raises(ValueError) as refused:
        TrainConfig.of(model=ModelConfig("mlp"), ranks=2, microbatches=2, **changes)
    assert str(refused.value) == flags


def test_injection_is_the_same_for_every_policy() -> None:
    factors = Injection.parse(["mb:0.5", "iid:0.3"], seed=7).factors(stages=6, microbatches=4)
    a = factors(3, 1, Kind.F, 2)
    assert a == factors(3, 1, Kind.F, 2)
    assert a != factors(3, 1, Kind.F, 3)
    # mb:SIGMA is one factor per micro-batch, whatever the stage.
    only_mb = Injection.parse(["mb:0.5"], seed=7).factors(stages=6, microbatches=4)
    assert only_mb(3, 0, Kind.F, 2) == only_mb(3, 5, Kind.B, 2)
    # straggler:FACTOR:STAGE, the simulator's grammar: stage 1's tasks cost 3 times as much.
    straggler = Injection.parse(["straggler:3:1:0:3"]).factors(stages=2, microbatches=4)
    assert (straggler(0, 1, Kind.F, 0), straggler(0, 0, Kind.F, 0)) == (3.0, 1.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("comm:x", "bad variability 'comm:x': LATENCY 'x' is not a number or a time such as 2ms"),
        ("comm:5", "bad variability 'comm:5': the runtime delays messages in time: write a time with a unit"),
        ("compute:0.3", "bad variability 'compute:0.3': unknown model 'compute'"),
        ("straggler:1:2.5", "bad variability 'straggler:1:2.5': expected straggler:FACTOR[:STAGE[:FIRST:LAST]]"),
    ],
)
def test_bad_injection_is_refused_naming_the_fix(spec: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        Injection.parse([spec])
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("crash:0", "bad fault 'crash:0': expected crash:RANK:STEP"),
        ("nan:x", "bad fault 'nan:x': STEP 'x' is not an integer >= 0"),
        (
            "melt:1:1",
            "bad fault 'melt:1:1': unknown fault 'melt'; use crash:RANK:STEP, hang:RANK:STEP, nan:STEP, "
            "savefail:RANK:STEP or savestop:RANK:STEP",
        ),
    ],
)
def test_a_bad_fault_is_refused_naming_the_fix(spec: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        Injection.parse(faults=[spec])
    assert str(info.value).startswith(message)


def test_a_word_means_the_same_in_the_simulator_and_the_runtime() -> None:
    # Both parse the shared words with one function: the same model, in the units each counts in.
    assert parse_variability("mb:0.5") == Injection.parse(["mb:0.5"]).variability[0]
    assert parse_variability("straggler:2:1:0:3") == Injection.parse(["straggler:2:1:0:3"]).variability[0]
    assert Injection.parse(["comm:2ms:1ms"]).comm == CommDelay(0.002, 0.001, in_seconds=True)
    with pytest.raises(SpecError, match="the simulator counts in cost units: write cost units"):
        parse_variability("comm:2ms")


def _device_budget_config() -> TrainConfig:
    # 1F1B on 4 ranks holds 4, 3, 2, 1 micro-batches. The last stage's backwards take 20 times its forwards
    # (emulated: forced, whatever the machine's load), so ranks 1 and 2 wait for gradients while the inputs
    # of their next forwards are there: under a per-device budget they run ahead to the busiest rank's 4.
    return TrainConfig.of(
        model=ModelConfig("mlp", layers=4, hidden=8),
        ranks=4,
        microbatches=8,
        microbatch_size=4,
        policy="greedy",
        steps=2,
        device_budget_fraction=0.0,
        emulate=EmulatedCosts((0.01,) * 4, (0.01, 0.01, 0.01, 0.2), (0.0,) * 4, reference_size=4 * 8),
        timeout=60,
    )


def test_under_a_device_budget_no_rank_holds_more_than_the_busiest_ranks_hint_peak(
    four_ranks: dict[str, list[Any]],
) -> None:
    result = succeeded(four_ranks["device budget"])[0]
    for report in result.reports:
        # Ranks 1 and 2 borrow the room their own peaks (3, 2) leave unused, up to rank 0's 4 and no more; the
        # last rank's next task is always ready, so it never needs to.
        assert report.peak_live == (4, 4, 4, 1)


def _predicted_config(policy: str) -> TrainConfig:
    # Sleep-based tasks (F 100 ms, B 200 ms per stage: far above the runtime's own overhead on a
    # loaded machine); the mlp's micro-batches all have the reference size.
    return TrainConfig.of(
        model=ModelConfig("mlp", layers=2, hidden=8),
        ranks=2,
        microbatches=4,
        microbatch_size=4,
        policy=policy,
        steps=3,
        slack_microbatches=1,
        variability=("mb:0.5",),
        emulate=EmulatedCosts((0.1, 0.1), (0.2, 0.2), (0.0, 0.0), reference_size=4 * 8),
        timeout=60,
        timelines=True,
    )


@pytest.mark.parametrize("policy", ["fixed", "ready"])
def test_simulator_predicts_emulated_steps_from_their_task_times(two_ranks: dict[str, list[Any]], policy: str) -> None:
    """The simulator on a step's own measured task times predicts the step: the runtime adds only its messages'
    latency and its own work, which a busy machine stretches (so the bound above is loose: the prediction's
    accuracy on a quiet machine is benchmarks/runtime-gpt-mini's). In fixed order the prediction is a lower
    bound: the same order of the same task times, with messages that take no time."""
    result = succeeded(two_ranks[f"predict {policy}"])[0]
    hint = generate_hint("1f1b", 2, 4)
    for report in result.reports[1:]:
        predicted = predict_step_time(hint, report, Policy(policy), slack_microbatches=1)
        low = 0.999 if policy == "fixed" else 0.9  # ready may choose otherwise than the runtime did
        assert low * predicted <= report.makespan <= 1.5 * predicted


def _one_record_config() -> TrainConfig:
    # Emulated tasks of exactly F = 50 ms, B = 100 ms (every micro-batch of the reference size, nothing drawn).
    return _predicted_config("fixed").replaced(
        variability=(),
        slack_microbatches=0,
        steps=2,
        emulate=EmulatedCosts((0.05, 0.05), (0.1, 0.1), (0.0, 0.0), reference_size=4 * 8),
    )


def test_a_step_and_its_prediction_are_one_record_compared_field_by_field(two_ranks: dict[str, list[Any]]) -> None:
    """[Note: one record of a step]: ``hintpipe.simulate`` and the runtime's report of one emulated step (1F1B,
    fixed order, 2 ranks, 4 micro-batches, F = 50 ms, B = 100 ms) are the same record type, and compare field
    by field: exactly where the order decides (each rank's tasks, peaks, budgets), and on the safe side where the
    clock does (a sleep is never shorter than its cost; a busy machine only makes the run slower)."""
    report = succeeded(two_ranks["one record"])[0].reports[-1]
    costs = hintpipe.CostModel((0.05, 0.05), (0.1, 0.1), (0.0, 0.0))
    predicted = hintpipe.simulate("1f1b", ranks=2, microbatches=4, policy="fixed", costs=costs)
    assert isinstance(report, hintpipe.StepRecord) and isinstance(predicted, hintpipe.StepRecord)
    # The maths: (m + p - 1)(F + B); the busiest rank's work; 1F1B's peaks, the budget the runtime defaults to.
    assert predicted.makespan == pytest.approx(5 * 0.15) and predicted.lower_bound == pytest.approx(4 * 0.15)
    assert (report.peak_live, report.budget) == (predicted.peak_live, predicted.budget) == ((2.0, 1.0), (2.0, 1.0))
    for rank in range(2):
        ran = [task for r, task, _, _ in report.timeline() if r == rank]
        assert ran == [task for r, task, _, _ in predicted.timeline() if r == rank] == list(predicted.hint.lists[rank])
        assert report.busy[rank] >= predicted.busy[rank]
    assert report.makespan >= predicted.makespan and report.lower_bound >= predicted.lower_bound
    for record in (report, predicted):  # one formula for both
        assert record.efficiency == record.lower_bound / record.makespan
        assert record.bubble == tuple(1 - b / record.makespan for b in record.busy)


def _local_config(dp: int) -> TrainConfig:
    """What the two-node launch runs, spawned on one machine."""
    return TrainConfig.of(
        model=ModelConfig("mlp", seed=3), ranks=2, dp=dp, microbatches=4, steps=2, seed=3, seq_len_dist=SeqLenDist(64)
    )


@pytest.mark.parametrize("dp", [1, 2])
def test_two_node_torchrun_launch_on_loopback(
    two_ranks: dict[str, list[Any]], four_ranks: dict[str, list[Any]], dp: int
) -> None:
    # dp 2: a mesh across both machines (each one holds one pipeline, its replica's on the other)
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        str(dp),
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
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--steps",
        "2",
        "--seed",
        "3",
        "--dp",
        str(dp),
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
    outputs = [node.communicate(timeout=allow(180)) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    out = json.loads(outputs[0][0])
    assert outputs[1][0].strip() == ""  # only rank 0 reports
    # The same run spawned on one machine trains to the same losses.
    local = succeeded((two_ranks if dp == 1 else four_ranks)[f"local dp{dp}"])[0]
    assert out["losses"] == pytest.approx(list(local.losses), rel=1e-6)


BUDGET = ["train", "--model", "gpt-mini", "--ranks", "2", "--microbatches", "8", "--steps", "3"]


def test_memory_budget_in_bytes(two_ranks: dict[str, list[Any]]) -> None:
    text = failure_text(two_ranks["budget 1MiB"])
    # Both ranks hold more than 1 MiB; which one reports first (and the other forwards it) is timing.
    assert "BudgetError: rank " in text
    assert "memory budget 1MiB is below what the hint itself held" in text
    out = result_json(succeeded(two_ranks["budget 1GiB"])[0])
    # Ample room: after the measuring step, rank 0 runs ahead (greedy: whenever the hint's next task, the
    # first backward, is not ready, which it cannot be while rank 1 still computes: its stage is 20x slower).
    assert out["peak_live_slots"][0] > 2
    assert out["peak_live_bytes"][0] < 2**30


SIZED = [*BUDGET, "--seq-len-dist", "lognormal:32:0.6", "--microbatch-order", "longest-first", "--admission", "size"]
SIZED += ["--hint", "zb-h1", "--check-grads"]


def test_train_admits_by_size_within_what_the_given_order_holds(two_ranks: dict[str, list[Any]]) -> None:
    # Longest first puts the long sequences together; admitted by size, each rank holds at most what the hint
    # holds in the order the micro-batches came (every step), and the gradients stay the unsplit model's.
    out = result_json(succeeded(two_ranks["admission by size"])[0])
    assert out["admission"] == "size"
    # Counted in tokens (8 micro-batches of 32 on average), not in micro-batches.
    assert min(out["peak_live_size"]) > 8 * 2
    assert len(out["held_of_budget"]) == 2
    assert all(0 < share <= 1.0 for share in out["held_of_budget"]), out["held_of_budget"]
    assert out["max_grad_rel_diff"] <= out["grad_rel_tolerance"]


def _from_plan_worker(rank: int, world: int, path: str, steps: int) -> list[float]:
    config = ModelConfig(**read_plan_file(path)["model"]["config"])
    planned, _ = load_plan(path, whole_model(config)[0])
    pipe = Pipeline.from_plan(planned, loss_fn=loss_fn_for(config.name), microbatches=4, policy="fixed")
    params = list({id(p): p for m in pipe.modules.values() for p in m.parameters()}.values())
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for step in range(steps):
        inputs, targets, _ = make_batch(config, 4, 4, SeqLenDist(64), step, 0)
        loss = pipe.step(inputs, targets, broadcast_loss=True)
        assert loss is not None
        losses.append(float(loss.detach()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    pipe.close()
    return losses


PLANNING = ["plan", "--model", "mlp", "--layers", "4", "--hidden", "8", "--ranks", "2", "--microbatches", "4"]
TRAINING = ["train", "--steps", "3", "--policy", "fixed"]  # the model, ranks and micro-batches: the plan file's


def test_a_saved_plan_trains_from_the_command_line_as_from_python(
    capsys: pytest.CaptureFixture[str], two_ranks: dict[str, list[Any]], plan_file: str
) -> None:
    cli = result_json(succeeded(two_ranks["plan from the command line"])[0])["losses"]
    python = succeeded(two_ranks["plan from python"])[0]
    assert cli == pytest.approx(python, rel=1e-6)
    for flag, value, planned in (("--ranks", "3", "2"), ("--model", "gpt-mini", "mlp"), ("--hidden", "16", "8")):
        assert main([*TRAINING, "--plan", plan_file, flag, value]) == 2
        assert capsys.readouterr().err == (
            f"hintpipe train: error: {plan_file} is planned for {flag} {planned}, this run asks for {flag} {value}; "
            f"leave {flag} out (the plan file says it) or plan again\n"
        )
    assert main([*TRAINING, "--plan", plan_file, "--ranks", "2", "--model", "mlp", "--microbatches", "4"]) == 0
    capsys.readouterr()  # the same values as the file's: accepted


class _Planned(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.first, self.act, self.last = nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.last(self.act(self.first(x)))
        return out


def test_a_plan_file_holds_no_code_and_loads_onto_the_model_it_was_made_for(tmp_path: Path) -> None:
    path = tmp_path / "plan.pt"
    model = _Planned()
    planned = plan(model, torch.randn(2, 4), ranks=2, microbatches=2, repeats=1)
    save_plan(planned, path)
    with torch.no_grad():  # the model trains on after planning: the file keeps the weights as planned
        model.first.weight.add_(1.0)
    loaded, _ = load_plan(path, model)
    assert loaded.fingerprint == planned.fingerprint and loaded.partition == planned.partition
    for (name, saved), (_, got) in zip(
        planned.graph.module.state_dict().items(), loaded.graph.module.state_dict().items(), strict=True
    ):
        assert torch.equal(saved, got), name
    # Another torch version that captures the same graph loads it; a model of another shape is refused.
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, "torch": "1.0.0"}, path)
    assert load_plan(path, model)[0].fingerprint == planned.fingerprint
    with pytest.raises(PlanFileError) as refused:  # one line naming both versions
        load_plan(path, _Planned(width=8))
    ours = importlib.metadata.version("hintpipe")
    assert str(refused.value) == (
        f"{path} was planned with torch 1.0.0 and hintpipe {ours}; here (torch {torch.__version__}, hintpipe "
        f"{ours}) the model captures to another graph (first.weight is [8, 4] here, [4, 4] planned): plan again, "
        "or give the model it was planned for"
    )
    # Code in the file is never run: torch's safe loader refuses anything but tensors and plain values.
    torch.save({**payload, "plan": _Planned}, path)
    with pytest.raises(PlanFileError, match=rf"^cannot read plan file {re.escape(str(path))}: WeightsUnpickler error"):
        load_plan(path, model)
    path.write_bytes(b"not a plan")
    with pytest.raises(PlanFileError, match="cannot read plan file"):
        load_plan(path, model)


def test_resuming_a_finished_run_says_there_is_nothing_left(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["train", "--model", "mlp", "--ranks", "2", "--microbatches", "2", "--steps", "2"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    assert main([*argv, *ckpt, "--json"]) == 0
    capsys.readouterr()
    assert main([*argv, *ckpt, "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--resume: the checkpoint in {tmp_path / 'ckpt'} is at step 2, the run has --steps 2" in err
    assert err.count("\n") == 1


CSV_RUN = ["train", "--model", "mlp", "--ranks", "2", "--microbatches", "4", "--steps", "2", "--policy", "fixed"]


def test_train_takes_a_csv_hint_as_simulate_does(
    capsys: pytest.CaptureFixture[str], two_ranks: dict[str, list[Any]], csv_hint: Path
) -> None:
    from_csv = succeeded(two_ranks["csv hint"])[0].losses
    assert from_csv == succeeded(two_ranks["zb-h1 by name"])[0].losses
    assert main([*CSV_RUN, "--hint", str(csv_hint), "--ranks", "3"]) == 2
    assert "is for 2 ranks and 4 micro-batches, the run has 3 ranks and 4 micro-batches" in capsys.readouterr().err


def _from_cli(argv: list[str]) -> TrainConfig:
    """The run ``hintpipe train`` would start for ``argv`` (parsed and checked as the command line does)."""
    args = build_parser().parse_args(argv)
    return config_from(args, args.policy)


LOOP = ["train", "--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2", "--microbatches", "4"]
LOOP += ["--steps", "6", "--lr", "0.01", "--lr-schedule", "warmup-cosine", "--warmup-steps", "2"]
LOOP += ["--clip-grad-norm", "0.05", "--eval-every", "4", "--seq-len-dist", "lognormal:12:0.5", "--policy", "fixed"]


def test_a_real_loop_from_the_command_line_is_the_unsplit_model_s_loop(
    two_ranks: dict[str, list[Any]], tensorboard_dir: Path
) -> None:
    """Warm-up and cosine decay, clipping and held-out evaluations from flags: the same losses, rates, norms
    and held-out losses as the unsplit model trained by torch's own AdamW, LambdaLR and clip_grad_norm_; the
    TensorBoard scalars, read back with tensorboard's own reader, are the run's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hintpipe.apps.lr_schedule import LrSchedule, lr_factor
    from hintpipe.apps.training import HELD_OUT_STEP, step_batch

    result = succeeded(two_ranks["loop"])[0]
    config = result.config
    model = nn.Sequential(*build_layers(config.model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(LrSchedule.WARMUP_COSINE, step, 6, 2)
    )
    loss_fn = loss_fn_for("gpt-mini")

    def batch_loss(step: int) -> torch.Tensor:
        xs, ys, _ = step_batch(config, step)
        total = sum(loss_fn(model(x), y) / len(xs) for x, y in zip(xs, ys, strict=True))
        assert isinstance(total, torch.Tensor)
        return total

    losses, rates, norms, evals = [], [], [], []
    for step in range(6):
        loss = batch_loss(step)
        torch.autograd.backward(loss)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)))
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 4 == 0 or step == 5:
            with torch.no_grad():
                evals.append((step + 1, float(batch_loss(HELD_OUT_STEP))))
    assert result.learning_rates == pytest.approx(rates, rel=1e-12)
    assert rates[:3] == pytest.approx([0.01 / 3, 0.02 / 3, 0.01])  # warm-up, then the cosine's top
    assert result.losses == pytest.approx(losses, rel=1e-5)
    assert result.grad_norms == pytest.approx(norms, rel=1e-4) and max(norms) > 0.05  # clipping bit
    assert [s for s, _ in result.eval_losses] == [4, 6]
    assert [v for _, v in result.eval_losses] == pytest.approx([v for _, v in evals], rel=1e-5)
    events = EventAccumulator(str(tensorboard_dir))
    events.Reload()
    assert set(events.Tags()["scalars"]) >= {
        "loss", "learning_rate", "grad_norm", "tokens_per_s", "step_time_s", "bubble", "peak_activation_bytes",
        "held_out_loss",
    }  # fmt: skip

    def scalars(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in events.Scalars(tag)]

    assert [s for s, _ in scalars("loss")] == [1, 2, 3, 4, 5, 6]  # steps run, as the log lines count them
    assert [v for _, v in scalars("loss")] == pytest.approx(list(result.losses), rel=1e-6)  # float32 on disk
    assert [v for _, v in scalars("learning_rate")] == pytest.approx(list(result.learning_rates), rel=1e-6)
    assert [s for s, _ in scalars("held_out_loss")] == [s for s, _ in result.eval_losses]
    assert [v for _, v in scalars("held_out_loss")] == pytest.approx([v for _, v in result.eval_losses], rel=1e-6)


def test_the_lr_factor_warms_up_then_decays_to_zero() -> None:
    from hintpipe.apps.lr_schedule import LrSchedule, lr_factor

    cosine = [lr_factor(LrSchedule.WARMUP_COSINE, s, 6, 2) for s in range(7)]
    assert cosine == pytest.approx([1 / 3, 2 / 3, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0])
    linear = [lr_factor(LrSchedule.WARMUP_LINEAR, s, 6, 2) for s in range(7)]
    assert linear == pytest.approx([1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25, 0.0])
    assert {lr_factor(LrSchedule.CONSTANT, s, 6, 2) for s in range(7)} == {1.0}


CONCAT = [*LOOP, "--microbatch-size", "2", "--max-seq-len", "32", "--data", "stdlib", "--forming", "concat"]
CONCAT += ["--steps", "2", "--policy", "fixed", "--check-grads"]


def test_documents_end_to_end_train_as_the_unsplit_model(two_ranks: dict[str, list[Any]]) -> None:
    from hintpipe.apps.batches import step_batch
    from hintpipe.apps.gradcheck import RELATIVE_TOLERANCE

    result = succeeded(two_ranks["concat"])[0]
    assert result.tokens == (4 * 2 * 31, 4 * 2 * 31)  # every row full: 4 micro-batches of 2 rows of 31 targets
    assert result.max_grad_rel_diff is not None and result.max_grad_rel_diff <= RELATIVE_TOLERANCE
    model = whole_model(result.config.model)[0]  # the run's first weights (its seed's)
    inputs, targets, _ = step_batch(result.config, 0)
    with torch.no_grad():  # the mean over the micro-batches of each one's mean token loss
        unsplit = torch.stack(
            [loss_fn_for(result.config.model)(model(x), y) for x, y in zip(inputs, targets, strict=True)]
        )
    assert result.losses[0] == pytest.approx(float(unsplit.mean()), rel=1e-5)


@pytest.fixture(scope="module")
def tensorboard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tensorboard")


@pytest.fixture(scope="module")
def csv_hint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("csv") / "zb.csv"
    save_hint_csv(generate_hint("zb-h1", 2, 4), path)
    return path


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("plan") / "plan.pt")
    assert main([*PLANNING, "--stage-memory", "1GiB", "--repeats", "1", "--save", path, "--json"]) == 0
    return path


@pytest.fixture(scope="module")
def two_ranks(csv_hint: Path, plan_file: str, tensorboard_dir: Path) -> dict[str, list[Any]]:
    """This module's 2-rank runs on one spawned group (the command-line ones parsed as the command line does)."""
    slow_last = ["--variability", "straggler:20:1"]
    cases = {
        **{f"predict {p}": Case(_train_rank, (_predicted_config(p),)) for p in ("fixed", "ready")},
        "one record": Case(_train_rank, (_one_record_config(),)),
        "local dp1": Case(_train_rank, (_local_config(1),)),
        "budget 1MiB": Case(_train_rank, (_from_cli([*BUDGET, "--activation-budget", "1MiB"]),)),
        "budget 1GiB": Case(
            _train_rank, (_from_cli([*BUDGET, "--activation-budget", "1GiB", "--policy", "greedy", *slow_last]),)
        ),
        "admission by size": Case(_train_rank, (_from_cli(SIZED),)),
        "csv hint": Case(_train_rank, (_from_cli([*CSV_RUN, "--hint", str(csv_hint)]),)),
        "zb-h1 by name": Case(_train_rank, (_from_cli([*CSV_RUN, "--hint", "zb-h1"]),)),
        "plan from the command line": Case(_train_rank, (_from_cli([*TRAINING, "--plan", plan_file]),)),
        "loop": Case(_train_rank, (_from_cli([*LOOP, "--tensorboard", str(tensorboard_dir)]),)),
        "plan from python": Case(_from_plan_worker, (plan_file, 3)),
        "concat": Case(_train_rank, (_from_cli(CONCAT),)),
    }
    return run_cases(2, cases, timeout=120)


@pytest.fixture(scope="module")
def four_ranks() -> dict[str, list[Any]]:
    """This module's 4-rank runs on one spawned group."""
    cases = {
        "device budget": Case(_train_rank, (_device_budget_config(),)),
        "local dp2": Case(_train_rank, (_local_config(2),)),
    }
    return run_cases(4, cases, timeout=120)


def test_version_names_hintpipe_torch_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    ours, theirs = importlib.metadata.version("hintpipe"), importlib.metadata.version("torch")
    assert capsys.readouterr().out == f"hintpipe {ours} (torch {theirs}, Python {platform.python_version()})\n"


def test_lr_reaches_the_run() -> None:
    argv = ["train", "--model", "mlp", "--ranks", "2", "--microbatches", "2"]
    assert _from_cli([*argv, "--lr", "0.05"]).optimizer.lr == 0.05
    assert _from_cli(argv).optimizer.lr == 1e-3
    with pytest.raises(ValueError, match=r"^--lr must be >= 0, got -1$"):
        _from_cli([*argv, "--lr", "-1"])


def test_log_every_prints_step_lines_on_stderr_beside_pure_json(capfd: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--model", "mlp", "--ranks", "2", "--microbatches", "2", "--steps", "4", "--lr", "0.05"]
    assert main([*argv, "--log-every", "2", "--json"]) == 0
    captured = capfd.readouterr()  # rank 0's process writes the lines: file descriptors, not sys.stderr
    out = json.loads(captured.out)  # stdout: the JSON object alone
    lines = captured.err.splitlines()
    pattern = re.compile(r"^step (\d)/4: loss (\d+\.\d{4}), (\d+\.\d) ms, ([\d,]+) samples/s(, ETA \d:\d\d:\d\d)?$")
    matches = [pattern.match(line) for line in lines]
    assert [m.group(1) for m in matches if m] == ["2", "4"] and len(lines) == 2, lines
    assert [bool(m.group(5)) for m in matches if m] == [True, False]  # the time left, until the last step
    for m in matches:
        assert m is not None
        step = int(m.group(1)) - 1
        assert m.group(2) == f"{out['losses'][step]:.4f}"
        assert m.group(3) == f"{out['step_times_s'][step] * 1e3:.1f}"
        assert int(m.group(4).replace(",", "")) == round(2 * 4 / out["step_times_s"][step])  # 2 x 4 samples


def test_without_a_terminal_a_long_run_prints_a_tenth_of_its_steps_a_short_table_and_a_summary(
    capfd: pytest.CaptureFixture[str],
) -> None:
    argv = ["train", "--model", "mlp", "--ranks", "2", "--microbatches", "2", "--steps", "25", "--lr", "0.05"]
    assert main(argv) == 0
    captured = capfd.readouterr()  # stderr is a pipe here: lines, not a bar
    shown = [int(line.split("/")[0].removeprefix("step ")) for line in captured.err.splitlines()]
    assert shown == [3, 6, 9, 12, 15, 18, 21, 24, 25]  # every ceil(25 / 10) steps, and the last
    rows = [line for line in captured.out.splitlines() if re.match(r"^│ +(\d+|\.\.\.) +│", line)]
    firsts = [row.split("│")[1].strip() for row in rows]
    assert firsts == [str(s) for s in range(1, 11)] + ["..."] + [str(s) for s in range(16, 26)]
    assert "5 steps between not shown (every step: --json)" in captured.out
    summary = re.search(
        r"^25 steps in (\d+\.\d) s: 200 samples, ([\d,]+) samples/s, final loss (\d+\.\d{4})$", captured.out, re.M
    )
    assert summary is not None, captured.out  # 25 steps x 2 micro-batches x 4 samples
    last_row = rows[-1].split("│")
    assert last_row[-2].strip() == summary.group(3)  # the table's last loss


def test_eta_and_line_every() -> None:
    from hintpipe.apps.progress import eta, line_every

    assert eta(12.0, 3, 7) == "0:00:28"
    assert eta(4000.0, 1, 1) == "1:06:40"
    assert eta(0.0, 0, 5) == "0:00:00"
    assert line_every(2, 100, shown=True, bar=None) == 2  # given: always
    assert line_every(0, 100, shown=True, bar=None) == 10  # no terminal: a tenth of the run
    assert line_every(0, 7, shown=True, bar=None) == 1
    assert line_every(0, 100, shown=False, bar=None) == 0  # --json: none
    assert line_every(0, 100, shown=True, bar=Progress()) == 0  # the bar says it


def test_a_log_line_goes_above_the_progress_bar() -> None:
    screen = io.StringIO()
    bar = Progress(console=Console(file=screen, force_terminal=True, width=80), transient=True)
    with bar:
        bar.add_task("training", total=2)
        log_line(bar, "step 1/2: loss 0.5000, 10.0 ms, 800 samples/s")
    assert "step 1/2: loss 0.5000, 10.0 ms, 800 samples/s\n" in screen.getvalue()


def test_a_hand_made_plan_file_with_wrong_fields_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from hintpipe.planner import plan_file

    missing, unknown = tmp_path / "missing.pt", tmp_path / "unknown.pt"
    torch.save({"format": plan_file._FORMAT, "model": {"config": {"name": "gpt-mini"}}, "plan": {}}, missing)
    config = {"name": "gpt-mini", "layers": 2, "hidden": 16, "bogus": 1}
    plan = {"ranks": 2, "microbatches": 4, "hint": "1f1b", "chunks": 1}
    torch.save({"format": plan_file._FORMAT, "model": {"config": config}, "plan": plan}, unknown)
    for path, what in [
        (missing, "no field 'ranks'"),
        (unknown, "TypeError: ModelConfig.__init__() got an unexpected keyword argument 'bogus'"),
    ]:
        assert main(["train", "--plan", str(path), "--steps", "1"]) == 2
        assert capsys.readouterr().err == (
            f"hintpipe train: error: {path} says it is a hintpipe plan file but its fields are not a plan's ({what}); "
            "write it again with `hintpipe plan ... --save FILE`\n"
        )
