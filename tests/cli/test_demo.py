"""``hintpipe demo`` (:mod:`hintpipe.cli.demo`): two runs of one config, and a demo stopped by a signal says so
in one line and exits with that signal's status, comparing nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hintpipe.apps import training
from hintpipe.cli import demo


def test_a_demo_stopped_by_a_signal_says_where_and_compares_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ran: list[tuple[str, int]] = []

    def train(config: Any) -> Any:
        ran.append((config.pipeline.policy, config.training.steps))
        return SimpleNamespace(stopped_by="SIGTERM", resumed_from=0, reports=[None] * 3, config=config)

    monkeypatch.setattr(training, "train", train)
    args = argparse.Namespace(steps=5, timeline=str(tmp_path / "t.png"), json=True)
    assert demo.run(args) == 128 + 15
    assert ran == [("fixed", 5)]  # the ready run is not made
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "hintpipe demo: stopped by SIGTERM after step 3 of 5 of the fixed run; nothing compared\n",
    )
    assert not (tmp_path / "t.png").exists()
