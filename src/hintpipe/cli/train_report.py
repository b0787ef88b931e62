"""What ``hintpipe train`` shows of a run: before it, what ``--forming crop`` trains of what it draws; after it,
its ``--json`` object, its table of steps and its summary line (apart from the command that runs it,
:mod:`hintpipe.cli.train`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from rich.table import Table

from hintpipe.dispatch.fit import AdmissionUnit
from hintpipe.units import format_size

if TYPE_CHECKING:  # the training modules need torch
    from hintpipe.apps.training import TrainConfig, TrainResult


def result_json(result: TrainResult) -> dict[str, Any]:
    """The run as ``--json`` prints it: every time key says its unit (``_s``, ``_ms``)."""
    from hintpipe.apps.gradcheck import relative_tolerance

    config = result.config
    unit = f"{config.model.spec.unit}_per_s"
    by_size = config.pipeline.admission is AdmissionUnit.SIZE and config.pipeline.activation_budget is None
    return {
        "policy": config.pipeline.policy,
        "hint": config.pipeline.hint,
        "ranks": config.parallelism.ranks,
        "dp": config.parallelism.dp,
        "tp": config.parallelism.tp,
        "coordination_ms": result.coordination_ms,
        "dp_overlap_ms": None if result.dp_overlap_ms is None else list(result.dp_overlap_ms),
        "dp_exposed_ms": None if result.dp_exposed_ms is None else list(result.dp_exposed_ms),
        "runtime_cpu_ms": None if result.runtime_cpu_ms is None else list(result.runtime_cpu_ms),
        "microbatches": config.pipeline.microbatches,
        "emulated": config.pipeline.emulate is not None,
        "step_time_median_s": result.step_time_median,
        unit: result.throughput,
        "efficiency": result.efficiency,
        "losses": list(result.losses),
        "peak_live_bytes": result.peak_live_bytes,
        "peak_live_slots": result.peak_live,
        "admission": config.pipeline.admission.value,
        # Admitted by input elements (admission by size without a byte budget): per rank, the most it held.
        "peak_live_size": result.peak_admitted if by_size else None,
        "held_of_budget": result.held_of_budget,
        "device": config.pipeline.device,
        "transport": result.transport,
        "device_peak_bytes": result.device_peak_bytes,
        "step_times_s": [r.makespan for r in result.reports],
        "bubble": [list(r.bubble) for r in result.reports],
        "max_grad_abs_diff": result.max_grad_abs_diff,
        "max_grad_rel_diff": result.max_grad_rel_diff,
        "grad_rel_tolerance": None
        if result.max_grad_rel_diff is None
        else relative_tolerance(result.config.pipeline.precision),
        "resumed_from": result.resumed_from,
        "resumed": None if result.resumed_checkpoint is None else resumed_line(result),
        "nonfinite_steps": list(result.nonfinite_steps),
        "learning_rates": list(result.learning_rates),
        "grad_norms": list(result.grad_norms),
        "eval_losses": [{"steps": steps, "loss": loss} for steps, loss in result.eval_losses],
        # What they are on: hintpipe.held_out_batches(config) makes the same batches again.
        "eval_batches": config.metrics.eval_batches,
        "prepared_data": list(config.prepared),
        "prepared_eval_data": list(config.eval_prepared),
        "wall_time_s": result.wall_time,
        "total_" + unit.removesuffix("_per_s"): sum(result.tokens),
    }


def resumed_line(result: TrainResult) -> str:
    """``resumed from CK/step-00000008 (step 8 of 20)``: where a resumed run went on from."""
    return f"resumed from {result.resumed_checkpoint} (step {result.resumed_from} of {result.config.training.steps})"


#: Rows of the step table: a longer run shows its first and last steps (every step is in ``--json``).
TABLE_ROWS = 20


def step_table(result: TrainResult) -> Table:
    """One row per step (the first and last ``TABLE_ROWS / 2`` of a longer run); with data parallelism,
    throughput in total and per replica (loss: the global batch's)."""
    table = Table()
    unit = f"{result.config.model.spec.unit}/s"
    dp = result.config.parallelism.dp
    throughput = [unit] if dp == 1 else [f"{unit} total", f"{unit} per replica"]
    for column in ("step", "time ms", *throughput, "efficiency", "bubble per rank", "peak live per rank", "loss"):
        table.add_column(column, justify="right")
    rows = list(zip(result.reports, result.tokens, result.losses, strict=True))
    half = TABLE_ROWS // 2
    if len(rows) > TABLE_ROWS:
        table.caption = f"{len(rows) - TABLE_ROWS} steps between not shown (every step: --json)"
    for index, (report, tokens, loss) in enumerate(rows):
        if len(rows) > TABLE_ROWS and half <= index < len(rows) - half:
            if index == half:
                table.add_row("...", *[""] * (len(table.columns) - 1))
            continue
        rates = [tokens / report.makespan] if dp == 1 else [tokens / report.makespan, tokens / dp / report.makespan]
        table.add_row(
            str(report.step + 1),  # steps run, as the log lines and TensorBoard count them
            f"{report.makespan * 1e3:.1f}",
            *(f"{rate:,.0f}" for rate in rates),
            f"{report.efficiency:.3f}",
            " ".join(f"{b:.2f}" for b in report.bubble),
            " ".join(format_size(b) for b in report.peak_live_bytes),
            f"{loss:.4f}",
        )
    return table


def summary_line(result: TrainResult) -> str:
    """The run in one line: the steps it ran, its tokens and time (the whole loop's: the optimizer, evaluations
    and checkpoints too), their rate, the last loss and held-out loss."""
    config = result.config
    unit = config.model.spec.unit
    first, last = result.resumed_from + 1, result.resumed_from + len(result.reports)
    steps = f"{len(result.reports)} steps" + (
        f" ({first}-{last} of {config.training.steps})" if result.resumed_from else ""
    )
    tokens = sum(result.tokens)
    line = (
        f"{steps} in {result.wall_time:.1f} s: {tokens:,} {unit}, {tokens / result.wall_time:,.0f} {unit}/s, "
        f"final loss {result.losses[-1]:.4f}"
    )
    if result.eval_losses:
        after, loss = result.eval_losses[-1]
        line += f", held-out loss {loss:.4f} (after step {after})"
    return line


#: A run that crops its documents is told what it trains when that is less than this share of what it draws.
CROP_NOTICE_BELOW = 0.9


def say_what_crop_trains(config: TrainConfig) -> None:
    """One line on stderr when ``--forming crop`` (the default) trains far fewer tokens than its micro-batches
    draw, each cropped to its shortest document: on documents of mixed lengths most of a step's text is never
    trained, which no figure of the run showed (its tokens/s counts the tokens trained)."""
    from hintpipe.apps.batches import crop_share

    share = crop_share(config)
    if share is None or share >= CROP_NOTICE_BELOW:
        return
    print(
        f"hintpipe train: --forming crop trains {share:.0%} of the tokens its micro-batches draw (each cropped to "
        "its shortest document; from the first 8 steps' draws): --forming concat or padded trains them all",
        file=sys.stderr,
    )


def say_where_it_evaluates(config: TrainConfig) -> str | None:
    """One line on stderr, returned too, when a run evaluates on held-out documents of its training data
    (``--eval-every`` without ``--eval-data``) though a ``--data`` folder is laid out in splits with an
    evaluation split of its own (see [Note: a folder in splits] in :mod:`hintpipe.data.dataset_splits`): the
    dataset's validation split is what its users evaluate on, and the run would not say it left it unread."""
    from hintpipe.data.manifest import HELD_OUT_EVERY
    from hintpipe.data.refusal import DataRefused
    from hintpipe.data.sources import BUILT_IN_DATA, data_entries, evaluation_source

    if not config.metrics.eval_every or config.data.eval_source is not None:
        return None
    for entry in data_entries(config.data.source):
        if entry.path in BUILT_IN_DATA:
            continue
        try:
            split = evaluation_source(entry.path)
        except DataRefused:  # not a folder it reads: nothing to say
            continue
        if split != entry.path:
            line = (
                f"hintpipe train: --data {entry.path} has an evaluation split ({split}); the run evaluates on every "
                f"{HELD_OUT_EVERY}th document of its train split: --eval-data {entry.path} evaluates on {split}"
            )
            print(line, file=sys.stderr)
            return line
    return None
