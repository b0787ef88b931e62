"""``--config FILE``: every option of the table, given in a TOML file, parses as the same flag does; flags
override the file; one file drives ``train``, ``simulate`` and ``plan``; a bad file is one line."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from conftest import parse_cli
from hintpipe.cli import main
from hintpipe.cli.config_file import section_of
from hintpipe.cli.train import config_from
from hintpipe.option import Option
from hintpipe.options import OPTIONS

#: What each command needs whatever else is given.
REQUIRED: dict[str, dict[str, Any]] = {
    "train": {"ranks": 2, "microbatches": 4},
    "simulate": {"ranks": 2, "microbatches": 4},
}
REQUIRED["plan"] = REQUIRED["train"] | {"stage_memory": "1GiB"}
SPECS = {"variability": ["iid:0.1", "mb:0.2"], "faults": ["nan:1"]}


def _sample(option: Option) -> Any:
    """A value of the option other than its default, as a file holds it."""
    if option.kind == "specs":
        return SPECS[option.name]
    if option.kind == "bool":
        return True
    if option.choices is not None:
        default = getattr(option.default, "value", option.default)
        return next(m.value for m in reversed(list(option.choices)) if m.value != default)
    if option.kind == "size":
        return "64MiB"
    if option.kind == "int":
        return int(option.minimum or 0) + 3
    if option.kind == "float":
        return (option.minimum or 0.0) + 2.5
    return {"hint": "gpipe", "tensorboard": "runs/tb", "data": "corpus.jsonl", "data_field": "body"}.get(
        option.name, "tokenizer-folder"
    )


def _flags(name: str, value: Any) -> list[str]:
    flag = OPTIONS[name].flag
    if isinstance(value, bool):
        return [flag] if value else []
    if isinstance(value, list):
        return [word for v in value for word in (flag, str(v))]
    return [flag, str(value)]


def _cases() -> list[tuple[str, str]]:
    return [(command, name) for command in REQUIRED for name, o in OPTIONS.items() if command in o.commands]


@pytest.mark.parametrize(("command", "name"), _cases())
def test_an_option_from_the_file_is_the_same_flag(tmp_path: Path, command: str, name: str) -> None:
    value = _sample(OPTIONS[name])
    given = REQUIRED[command] | {name: value}
    flags = [command, *(word for key, v in given.items() for word in _flags(key, v))]
    path = tmp_path / "run.toml"
    sections: dict[str, dict[str, Any]] = {}
    for key, v in given.items():
        sections.setdefault(section_of(OPTIONS[key]), {})[key] = v
    path.write_text(tomli_w.dumps(sections))
    assert vars(parse_cli(flags)) == vars(parse_cli([command, "--config", str(path)]))


def test_flags_override_the_file_and_a_run_s_config_equals_its_flags(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[pipeline]\nmicrobatches = 8\npolicy = "fixed"\nmemory_slack = 1.0\n[run]\nranks = 2\nsteps = 3\n')
    from_file = parse_cli(["train", "--config", str(path), "--policy", "greedy", "--device-budget", "0.5"])
    from_flags = parse_cli(["train", "--ranks", "2", "--microbatches", "8", "--steps", "3", "--policy", "greedy"])
    from_flags.device_budget = 0.5  # the room the flags give replaces the file's memory_slack
    assert vars(from_file) == vars(from_flags)
    assert config_from(from_file, from_file.policy) == config_from(from_flags, from_flags.policy)


def test_a_repeatable_flag_replaces_the_file_s_list(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[run]\nvariability = ["mb:0.3"]\n')
    base = ["simulate", "--ranks", "2", "--microbatches", "4", "--config", str(path)]
    assert parse_cli(base).variability == ["mb:0.3"]
    assert parse_cli([*base, "--variability", "iid:0.1"]).variability == ["iid:0.1"]


def test_print_config_writes_the_file_a_command_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--ranks", "2", "--microbatches", "4", "--policy", "fixed", "--variability", "mb:0.3"]
    assert main([*argv, "--print-config"]) == 0
    text = capsys.readouterr().out
    written = tomllib.loads(text)
    assert written["pipeline"]["policy"] == "fixed" and written["run"]["variability"] == ["mb:0.3"]
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert vars(parse_cli(["train", "--config", str(path)])) == vars(parse_cli(argv)) | {"print_config": False}
    # The same file drives the simulator: it takes the options it has flags for and leaves train's.
    assert main(["simulate", "--config", str(path), "--json"]) == 0


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[pipeline]\npolcy = "ready"\n', "unknown option 'polcy'; see `hintpipe COMMAND --help`"),
        ("[pipe]\npolicy = 1\n", "unknown section [pipe]; the sections are pipeline, run, simulate, plan"),
        ("policy = \n", "is not TOML: "),
    ],
)
def test_a_bad_file_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"hintpipe: error: --config {path}")
    assert said in err
