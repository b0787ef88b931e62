"""``hintpipe export`` (:mod:`hintpipe.cli.export`): what it says of the model it wrote and how to load it, as
lines or one JSON object, its notes on stderr, and a checkpoint it cannot use refused in one line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from hintpipe.apps import export
from hintpipe.apps.export import Exported
from hintpipe.cli import export as export_command
from hintpipe.cli import main
from hintpipe.runtime.errors import CheckpointError

DONE = Exported(
    Path("/out"),
    Path("/runs/a/step-00000008"),
    8,
    "GPT2LMHeadModel",
    ("config.json", "model.safetensors", "tokenizer.json"),
    ("the run's tokenizer was not copied: /tok/vocab.txt is gone; copy the tokenizer into the export by hand",),
)


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """``export_checkpoint`` stood in for: it returns :data:`DONE` and keeps what it was asked."""
    asked: list[tuple[Any, ...]] = []

    def export_checkpoint(checkpoint: str, out_dir: str, *, force: bool = False, dtype: str = "fp32") -> Exported:
        asked.append((checkpoint, out_dir, force, dtype))
        return DONE

    monkeypatch.setattr(export, "export_checkpoint", export_checkpoint)
    return asked


def test_a_hugging_face_export_says_how_to_load_it_and_its_tokenizer(
    exported: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "/runs/a", "/out", "--force"]) == 0
    assert exported == [("/runs/a", "/out", True, "fp32")]
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "/runs/a/step-00000008 (step 8, GPT2LMHeadModel, fp32) exported to /out:",
        "  config.json, model.safetensors, tokenizer.json",
        "load it with transformers.GPT2LMHeadModel.from_pretrained('/out')",
        "and its tokenizer with transformers.AutoTokenizer.from_pretrained('/out')",
    ]
    assert err == f"hintpipe export: {DONE.notes[0]}\n"


def test_the_json_holds_what_was_written_and_the_notes(
    exported: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(checkpoint="/runs/a", out_dir="/out", force=False, json=True, dtype="fp32")
    assert export_command.run(args) == 0
    assert json.loads(capsys.readouterr().out) == {
        "out_dir": "/out",
        "step": 8,
        "architecture": "GPT2LMHeadModel",
        "dtype": "fp32",
        "files": ["config.json", "model.safetensors", "tokenizer.json"],
        "notes": list(DONE.notes),
    }
    assert exported == [("/runs/a", "/out", False, "fp32")]
    assert main(["export", "/runs/a", "/out", "--dtype", "bf16"]) == 0  # the flag reaches the export
    assert exported[-1] == ("/runs/a", "/out", False, "bf16")
    assert main(["export", "/runs/a", "/out", "--dtype", "int8"]) == 2
    assert "argument --dtype: invalid choice: 'int8' (choose from 'fp32', 'bf16', 'fp16')" in capsys.readouterr().err


def test_a_checkpoint_it_cannot_use_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuses(checkpoint: str, out_dir: str, *, force: bool = False, dtype: str = "fp32") -> Exported:
        raise CheckpointError("/runs/a: no usable checkpoint (step-00000008: manifest.json is missing)")

    monkeypatch.setattr(export, "export_checkpoint", refuses)
    assert main(["export", "/runs/a", "/out"]) == 2
    assert capsys.readouterr().err == (
        "hintpipe export: error: /runs/a: no usable checkpoint (step-00000008: manifest.json is missing)\n"
    )
