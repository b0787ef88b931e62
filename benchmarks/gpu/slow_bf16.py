"""Check 12: "bf16 on the GPU looks 10x slow: bf16 or the hint?".

The project's issue quotes two runs of ``hintpipe train`` on one GPU: ``--hint bfw --policy ready --precision
bf16`` at 1.27-1.50 s a step, and ``--hint zbv --policy ready --slack-microbatches 2`` in float32 at 0.11-0.14 s.
They differ in the hint (and its room) and in the precision at once. This check runs both as quoted, and each
in the other precision, through the command line's own parsing (:func:`hintpipe.cli.train.config_from`) and
:func:`hintpipe.apps.training.train`: the bf16 / fp32 ratio of one hint says what bf16 costs, bfw / zbv in one
precision what the hint costs.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from tables import Table

from hintpipe.apps.training import TrainResult, train
from hintpipe.cli import build_parser
from hintpipe.cli.train import config_from

#: The two quoted runs, less their precision: the hint, the flags it came with, and the precision it was quoted in.
QUOTED: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("bfw", (), "bf16"),
    ("zbv", ("--slack-microbatches", "2"), "fp32"),
)
PRECISIONS = ("fp32", "bf16")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One run: a quoted hint with its flags, in one precision."""

    hint: str
    flags: tuple[str, ...]
    precision: str
    quoted: bool

    def argv(self, sizes: Sequence[str]) -> list[str]:
        """``hintpipe train``'s arguments: the quoted run's at ``sizes``, in this precision, with JSON output
        (no progress bar)."""
        own = ["--hint", self.hint, "--policy", "ready", "--precision", self.precision, *self.flags]
        return ["train", *sizes, *own, "--json"]

    @property
    def slack(self) -> str:
        return (
            self.flags[self.flags.index("--slack-microbatches") + 1] if "--slack-microbatches" in self.flags else "none"
        )


def variants() -> list[Variant]:
    """Each quoted run as quoted, then in the other precision."""
    out = []
    for hint, flags, quoted in QUOTED:
        other = next(p for p in PRECISIONS if p != quoted)
        out += [Variant(hint, flags, quoted, True), Variant(hint, flags, other, False)]
    return out


def run_train(argv: list[str]) -> TrainResult:
    """``hintpipe <argv>`` as the command line runs it (its parsing and checks, then :func:`train`)."""
    args = build_parser().parse_args(argv)
    result = train(config_from(args, args.policy))
    assert result is not None  # spawned here, not under torchrun: rank 0's result comes back
    return result


def figures(result: TrainResult) -> dict[str, Any]:
    """The run's step times over the steps after the first (as the issue's step lines show them), and each
    rank's CPU time in the runtime per step."""
    steps = [r.makespan for r in result.measured]
    return {
        "step_s": statistics.median(steps),
        "step_range_s": [min(steps), max(steps)],
        "wall_s_per_step": result.wall_time / len(result.reports),
        "runtime_cpu_ms": list(result.runtime_cpu_ms or ()),
    }


def cells(variant: Variant, got: dict[str, Any] | str, fp32: dict[str, Any] | str | None) -> list[str]:
    """A row: what ran, then its figures (or why it did not run); bf16 rows also over fp32 of the same hint."""
    head = [variant.hint, variant.precision, variant.slack, "yes" if variant.quoted else "no"]
    if isinstance(got, str):
        return [*head, "-", "-", "-", got]
    low, high = got["step_range_s"]
    step = f"{got['step_s'] * 1e3:.1f} ({low * 1e3:.1f}-{high * 1e3:.1f})"
    cpu = " / ".join(f"{ms:.1f}" for ms in got["runtime_cpu_ms"]) or "-"
    ratio = "-"
    if variant.precision == "bf16" and isinstance(fp32, dict):
        ratio = f"{got['step_s'] / fp32['step_s']:.2f}x"
    return [*head, step, f"{got['wall_s_per_step'] * 1e3:.1f}", cpu, ratio]


def answer(measured: dict[Variant, dict[str, Any] | str]) -> str:
    """The check's answer in one line: what bf16 costs each hint, and what bfw costs over zbv in each
    precision (step over step, medians)."""
    step = {(v.hint, v.precision): got["step_s"] for v, got in measured.items() if isinstance(got, dict)}

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> str:
        return f"{step[a] / step[b]:.2f}x" if a in step and b in step else "n/a"

    bf16 = ", ".join(f"{hint} {ratio((hint, 'bf16'), (hint, 'fp32'))}" for hint, _, _ in QUOTED)
    hint = ", ".join(f"{p} {ratio(('bfw', p), ('zbv', p))}" for p in PRECISIONS)
    return f"bf16 over fp32: {bf16}; bfw over zbv: {hint}."


def slow_bf16_table(device: str, sizes: Sequence[str]) -> Table:
    """The quoted runs and their precision swapped, each a few steps, at ``sizes`` (the quoted command's flags
    for the model and batch on CUDA, smaller on CPU)."""
    measured: dict[Variant, dict[str, Any] | str] = {}
    failed = False
    for variant in variants():
        try:
            measured[variant] = figures(run_train(variant.argv([*sizes, "--device", device])))
        except Exception as exc:  # one run that fails: its row says why, the others still run
            measured[variant] = f"could not run: {type(exc).__name__}: " + (str(exc).splitlines() or [""])[0][:300]
            failed = True
    rows = []
    for variant, got in measured.items():
        fp32 = next((g for v, g in measured.items() if v.hint == variant.hint and v.precision == "fp32"), None)
        rows.append(cells(variant, got, fp32))
    headers = ["hint", "precision", "slack (micro-batches)", "as quoted", "step ms (min-max)", "wall ms / step"]
    headers += ["runtime CPU ms per rank", "bf16 / fp32"]
    command = " ".join(["hintpipe", *variants()[0].argv([*sizes, "--device", device])[:-1]])
    notes = [
        f"`{command}` and the same with `--hint zbv --slack-microbatches 2`, each in fp32 and bf16: step times are the "
        "runs' own (`StepReport.makespan`, the step lines' figure), over the steps after the first; wall ms / step: "
        "every step's whole time on rank 0 (the optimizer too), the first included.",
        "Runtime CPU: each rank's CPU time in hintpipe's runtime per step (messages, staging, notices, "
        "scheduling; `TrainResult.runtime_cpu_ms`). The hints differ in their room too (as quoted): check 6 "
        "runs bfw and zbv at the same room, on its own model.",
        f"Answer: {answer(measured)}",
    ]
    data = {
        "runs": {" ".join(v.argv(sizes)): got for v, got in measured.items()},
        "answer": answer(measured),
        "device": device,
        "steps": {
            f"{v.hint} {v.precision}": got["step_s"] if isinstance(got, dict) else got for v, got in measured.items()
        },
    }
    return Table(headers, rows, notes, data, failed, left=4)
