"""What the command line refuses when it parses, before any rank starts: integers beyond every bound, and an
output folder that cannot be made (issue 51's probe: both were accepted and failed later, on a rank)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.train_config import TrainConfig
from hintpipe.cli import build_parser, main
from hintpipe.cli.common import whole_number

HUGE = 2**63  # one past int64: what a 64-bit tensor or a C call cannot hold


def _integer_flags(command: str) -> list[str]:
    """Every flag of ``command`` that takes an integer."""
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = commands.choices[command]
    return sorted(a.option_strings[0] for a in parser._actions if a.type in (int, whole_number))


REQUIRED = {"train": ["--ranks", "2", "--microbatches", "2"], "plan": ["--ranks", "2", "--microbatches", "2"]}
REQUIRED["simulate"] = REQUIRED["train"]


@pytest.mark.parametrize(
    ("command", "flag"), [(c, f) for c in ("train", "plan", "simulate", "demo") for f in _integer_flags(c)]
)
def test_every_integer_flag_refuses_a_value_beyond_its_bound_when_parsed(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: --checkpoint-every, --log-every, --layers, ... took 2**63 and the run went on to use it.
    given = {**dict(zip(REQUIRED.get(command, [])[::2], REQUIRED.get(command, [])[1::2], strict=True)), flag: str(HUGE)}
    argv = [command, *(word for pair in given.items() for word in pair)]
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(argv)
    assert stopped.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == f"hintpipe: error: argument {flag}: must be at most 2147483647, got {HUGE}"


def test_the_integer_flags_are_many() -> None:
    # The parametrisation above walks the parsers: a flag typed otherwise would drop out of it unseen.
    assert {"--steps", "--checkpoint-every", "--log-every", "--layers", "--seed"} <= set(_integer_flags("train"))
    assert _integer_flags("demo") == ["--steps"]


@pytest.mark.parametrize(
    ("section", "key", "flag"),
    [("training", "steps", "--steps"), ("metrics", "log_every", "--log-every"), ("model", "layers", "--layers")],
)
def test_a_config_files_integer_beyond_its_bound_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str, flag: str
) -> None:
    # Before: `steps = 9223372036854775807` was said as "9.22337e+18"; log_every and layers were taken.
    toml = tmp_path / "run.toml"
    toml.write_text(f"[{section}]\n{key} = 9223372036854775807\n")
    assert main(["train", "--config", str(toml), "--ranks", "2", "--microbatches", "2"]) == 2
    assert capsys.readouterr().err == (
        f"hintpipe: error: --config {toml}: [{section}] {key}: {flag} must be at most 2147483647, got "
        "9223372036854775807\n"
    )


def test_an_integer_option_beyond_its_bound_is_refused_in_python() -> None:
    with pytest.raises(ValueError) as refused:
        TrainConfig.of(model=ModelConfig("gpt-mini"), ranks=2, microbatches=2, checkpoint_every=HUGE)
    assert str(refused.value) == f"checkpoint_every must be at most 2147483647, got {HUGE}"
    with pytest.raises(ValueError) as steps:
        TrainConfig.of(model=ModelConfig("gpt-mini"), ranks=2, microbatches=2, steps=2**63 - 1)
    assert str(steps.value) == f"steps must be between 1 and 2147483647, got {2**63 - 1}"


@pytest.mark.parametrize("below", ["sub", "a/b"])
def test_a_tensorboard_folder_under_a_file_is_refused_before_the_ranks_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], below: str
) -> None:
    # Before: the ranks started, and rank 0 failed with NotADirectoryError once it opened the writer.
    file = tmp_path / "runs"
    file.write_text("")
    board = file / below
    assert main(["train", "--ranks", "2", "--microbatches", "2", "--steps", "1", "--tensorboard", str(board)]) == 2
    assert capsys.readouterr().err == (
        f"hintpipe train: error: --tensorboard {board}: {file} is a file, so the folder cannot be made; give a folder\n"
    )
    assert file.read_text() == ""
