"""A renamed option's flag and config key before the rename (``Option.before``) still work until 0.8: the old flag
is hidden from ``--help``, says one line on stderr that names the new one and then acts as it; the old key of a
config file the same; giving both names is refused in one line; ``--print-config`` writes the new name. (The
Python keywords and attributes: tests/tree/test_vocabulary.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from conftest import parse_cli
from hintpipe.cli import build_parser, main
from hintpipe.cli.common import RetiredFlag
from hintpipe.cli.config_file import config_commands
from hintpipe.cli.train import config_from
from hintpipe.option import flag_of
from hintpipe.options import OPTIONS, RENAMED_OPTIONS

RUN = ["--ranks", "2", "--microbatches", "4"]


def test_the_renamed_options_are_the_slack_and_the_device_budget() -> None:
    assert RENAMED_OPTIONS == {"memory_slack": "slack_microbatches", "device_budget": "device_budget_fraction"}


@pytest.mark.parametrize("command", ["train", "simulate"])
def test_the_old_flag_sets_the_new_one_and_says_so_once(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_cli([command, *RUN, "--memory-slack", "2"])
    assert (args.slack_microbatches, args.device_budget_fraction) == (2.0, None)
    assert capsys.readouterr().err == (
        f"hintpipe {command}: warning: --memory-slack is now --slack-microbatches; the old flag goes in 0.8\n"
    )
    assert vars(args) == vars(parse_cli([command, *RUN, "--slack-microbatches", "2"]))
    capsys.readouterr()
    # --device-budget alone is the fraction 0, as --device-budget-fraction alone is
    for given, fraction in ((["--device-budget"], 0.0), (["--device-budget", "0.25"], 0.25)):
        args = parse_cli([command, *RUN, *given])
        assert (args.slack_microbatches, args.device_budget_fraction) == (0.0, fraction)
        assert capsys.readouterr().err == (
            f"hintpipe {command}: warning: --device-budget is now --device-budget-fraction; the old flag goes in 0.8\n"
        )


def test_under_torchrun_rank_0_alone_says_the_warning(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every rank of a ``torchrun`` launch parses the same command line: before, each said the warning (eight
    ranks, eight lines)."""
    path = tmp_path / "run.toml"
    path.write_text("[parallelism]\nmemory_slack = 2.0\n")
    for name, value in {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        parse_cli(["train", *RUN, "--memory-slack", "2"])
        parse_cli(["simulate", *RUN, "--config", str(path)])
        said[rank] = capsys.readouterr().err
    assert said["1"] == ""
    assert said["0"] == (
        "hintpipe train: warning: --memory-slack is now --slack-microbatches; the old flag goes in 0.8\n"
        f"hintpipe simulate: warning: --config {path}: [parallelism] memory_slack is now slack_microbatches; the old "
        "key goes in 0.8\n"
    )


def test_a_run_from_the_old_flag_is_the_run_from_the_new_one() -> None:
    before = config_from(parse_cli(["train", *RUN, "--model", "mlp", "--memory-slack", "2"]), "ready")
    now = config_from(parse_cli(["train", *RUN, "--model", "mlp", "--slack-microbatches", "2"]), "ready")
    assert before.pipeline.slack_microbatches == 2.0
    assert before == now


@pytest.mark.parametrize(
    "given",
    [
        ["--memory-slack", "2", "--slack-microbatches", "2"],
        ["--slack-microbatches", "2", "--memory-slack", "2"],
        ["--device-budget-fraction", "--device-budget", "0.5"],
        ["--memory-slack", "1", "--device-budget-fraction"],
    ],
)
def test_the_old_flag_beside_the_new_one_or_another_room_is_refused_in_one_line(
    given: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = (word for word in given if word.startswith("--"))
    assert main(["simulate", *RUN, *given]) == 2
    said = capsys.readouterr().err.splitlines()[-1]
    assert said == f"hintpipe: error: argument {second}: not allowed with argument {first}"


@pytest.mark.parametrize("command", ["train", "simulate"])
def test_the_old_flags_are_hidden_from_help_and_are_no_config_keys(command: str) -> None:
    parser = config_commands(build_parser())[command]
    retired = {a.option_strings[0]: a.dest for a in parser._actions if isinstance(a, RetiredFlag)}
    assert retired == {"--memory-slack": "slack_microbatches", "--device-budget": "device_budget_fraction"}
    assert {flag_of(OPTIONS[new].before or "") for new in retired.values()} == set(retired)
    shown = parser.format_help()
    assert "--slack-microbatches" in shown and "--device-budget-fraction" in shown
    assert "--memory-slack" not in shown and "--device-budget " not in shown and "--device-budget\n" not in shown


def test_the_old_config_key_sets_the_new_one_says_so_and_prints_as_the_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[parallelism]\nranks = 2\nmemory_slack = 2.0\n[training]\nmicrobatches = 4\n")
    args = parse_cli(["simulate", "--config", str(path)])
    assert args.slack_microbatches == 2.0
    assert capsys.readouterr().err == (
        f"hintpipe simulate: warning: --config {path}: [parallelism] memory_slack is now slack_microbatches; the old "
        "key goes in 0.8\n"
    )
    assert main(["simulate", "--config", str(path), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "slack_microbatches = 2.0\n" in printed and "memory_slack" not in printed
    # the flag given overrides the file's old key, as it does the new one
    assert parse_cli(["simulate", "--config", str(path), "--device-budget-fraction"]).slack_microbatches == 0.0
    assert parse_cli(["simulate", "--config", str(path), "--memory-slack", "3"]).slack_microbatches == 3.0


def test_a_config_file_with_both_names_of_an_option_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[parallelism]\nranks = 2\ndevice_budget = 0.5\ndevice_budget_fraction = 0.5\n")
    said = (
        f"--config {path}: [parallelism] gives device_budget_fraction and device_budget, its name before; keep "
        "device_budget_fraction alone"
    )
    with pytest.raises(ValueError) as refused:
        parse_cli(["simulate", "--config", str(path), *RUN])
    assert str(refused.value) == said


def test_every_old_flag_acts_as_its_new_one() -> None:
    # Its type, nargs and const are the new flag's: a bad value is refused as the new flag refuses it.
    for command in ("train", "simulate"):
        parser = config_commands(build_parser())[command]
        actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
        for old, new in (("memory_slack", "slack_microbatches"), ("device_budget", "device_budget_fraction")):
            before, now = actions[flag_of(old)], actions[flag_of(new)]
            assert isinstance(before, RetiredFlag) and before.now is now
            assert (before.nargs, before.const, before.type, before.dest) == (now.nargs, now.const, now.type, now.dest)
            assert before.default is argparse.SUPPRESS and before.help is argparse.SUPPRESS
