"""What ``hintpipe train`` shows of a finished run (:mod:`hintpipe.cli.train_report`): its summary line, and a
table of its steps that shows a long run's first and last ones."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from rich.console import Console

from hintpipe.apps.model_config import ModelConfig
from hintpipe.cli.train_report import TABLE_ROWS, resumed_line, step_table, summary_line


def _result(steps: int, *, resumed_from: int = 0, dp: int = 1, evals: list[tuple[int, float]] | None = None) -> Any:
    reports = [
        SimpleNamespace(
            step=resumed_from + i, makespan=0.5, efficiency=0.8, bubble=(0.25, 0.5), peak_live_bytes=(2048, 1024)
        )
        for i in range(steps)
    ]
    config = SimpleNamespace(
        model=ModelConfig("gpt-mini"), parallelism=SimpleNamespace(dp=dp), training=SimpleNamespace(steps=40)
    )
    return cast(
        Any,
        SimpleNamespace(
            config=config,
            reports=reports,
            tokens=[1000] * steps,
            losses=[2.0 - 0.01 * i for i in range(steps)],
            wall_time=4.0,
            resumed_from=resumed_from,
            resumed_checkpoint="ck/step-00000008",
            eval_losses=evals or [],
        ),
    )


def _text(table: Any) -> list[str]:
    console = Console(width=140, record=True)
    console.print(table)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_the_summary_line_says_the_steps_tokens_rate_and_losses() -> None:
    assert summary_line(_result(4)) == "4 steps in 4.0 s: 4,000 tokens, 1,000 tokens/s, final loss 1.9700"
    resumed = _result(4, resumed_from=8, evals=[(10, 2.5), (12, 2.25)])
    assert summary_line(resumed) == (
        "4 steps (9-12 of 40) in 4.0 s: 4,000 tokens, 1,000 tokens/s, final loss 1.9700, held-out loss 2.2500 "
        "(after step 12)"
    )
    assert resumed_line(resumed) == "resumed from ck/step-00000008 (step 8 of 40)"


def test_a_short_run_shows_every_step_as_the_log_counts_them() -> None:
    lines = _text(step_table(_result(2)))
    rows = [line for line in lines if line.startswith("│")]  # the header's are ┃
    assert [row.split("│")[1].strip() for row in rows] == ["1", "2"]
    cells = [cell.strip() for cell in rows[0].split("│")[2:-1]]
    assert cells == ["500.0", "2,000", "0.800", "0.25 0.50", "2KiB 1KiB", "2.0000"]


def test_a_long_run_shows_its_first_and_last_steps_and_says_how_many_are_left_out() -> None:
    table = step_table(_result(TABLE_ROWS + 5, dp=2))
    assert [column.header for column in table.columns][2:4] == ["tokens/s total", "tokens/s per replica"]
    steps = [row.split("│")[1].strip() for row in _text(table) if row.startswith("│")]
    assert steps == [str(s) for s in range(1, 11)] + ["..."] + [str(s) for s in range(16, 26)]
    assert table.caption == "5 steps between not shown (every step: --json)"


def test_a_run_that_leaves_its_datasets_validation_split_unread_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hintpipe.apps.training import TrainConfig
    from hintpipe.cli.train_report import say_where_it_evaluates

    pytest.importorskip("datasets")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("\n\n".join(f"train document {i}" for i in range(40)))
    (corpus / "validation.txt").write_text("\n\n".join(f"held document {i}" for i in range(10)))
    model = ModelConfig("gpt-mini", layers=2, hidden=16, vocab=256, max_seq_len=32)
    run = TrainConfig.of(model=model, ranks=2, microbatches=2, data=str(corpus), eval_every=2)
    line = (
        f"hintpipe train: --data {corpus} has an evaluation split ({corpus / 'validation'}); the run evaluates on "
        f"every 20th document of its train split: --eval-data {corpus} evaluates on {corpus / 'validation'}"
    )
    assert say_where_it_evaluates(run) == line
    assert capsys.readouterr().err == line + "\n"
    evaluated = TrainConfig.of(
        model=model, ranks=2, microbatches=2, data=str(corpus), eval_every=2, eval_data=str(corpus)
    )
    assert say_where_it_evaluates(evaluated) is None
    assert say_where_it_evaluates(TrainConfig.of(model=model, ranks=2, microbatches=2, data=str(corpus))) is None
