"""``--config FILE``: every flag of a command is a key of the file, in its one section; a key from the file parses
as the same flag does; flags override the file; ``--print-config`` writes every value, and its file parses back
to the same run; one file drives ``train``, ``simulate`` and ``plan``; a bad file, key or value is one line."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from conftest import parse_cli
from hintpipe.cli import build_parser, main
from hintpipe.cli.common import whole_number
from hintpipe.cli.config_file import (
    INVOCATION,
    OLD_SECTIONS,
    SECTION_OF,
    SECTIONS,
    config_commands,
    config_keys,
)
from hintpipe.cli.train import config_from
from hintpipe.options import OPTIONS, ROOM
from hintpipe.schedule.hint import HintName

README = Path(__file__).resolve().parents[2] / "README.md"
HINTS = ", ".join(h.value for h in HintName)

#: What each command needs whatever else is given.
REQUIRED: dict[str, dict[str, Any]] = {
    "train": {"ranks": 2, "microbatches": 4},
    "simulate": {"ranks": 2, "microbatches": 4},
    "plan": {"ranks": 2, "microbatches": 4, "stage_memory": "1GiB"},
}
#: Values of the flags that take words, other than their defaults.
WORDS = {
    "variability": ["iid:0.1", "mb:0.2"],
    "faults": ["nan:1"],
    "hint": "gpipe",
    "tensorboard": "runs/tb",
    "data": "corpus.jsonl",
    "data_field": "body",
    "seq_len_dist": "lognormal:32:0.5",
    "betas": "0.8,0.99",
    "activation_budget": "64MiB",
    "stage_memory": "2GiB",
}


def _commands() -> dict[str, argparse.ArgumentParser]:
    return config_commands(build_parser())


def _keys(command: str) -> dict[str, argparse.Action]:
    return config_keys(_commands()[command])


def _sample(action: argparse.Action) -> Any:
    """A value of the flag other than its default, as a file holds it (derived from the action, so that a flag
    added later is sampled too)."""
    option = OPTIONS.get(action.dest)
    low = option.minimum if option is not None and option.minimum is not None else 0
    if isinstance(action, argparse._StoreConstAction):
        return action.const
    if action.choices is not None:
        return next(c for c in reversed(list(action.choices)) if c != action.default)
    if action.type in (int, whole_number):
        # low + 3, or low + 4 where that is the default (--steps and --microbatch-size: 1 + 3 is their 4)
        one: Any = next(v for v in (int(low) + 3, int(low) + 4) if v != action.default)
    elif action.type is float:
        high = option.maximum if option is not None and option.maximum is not None else None
        one = low + 2.5 if high is None else (low + high) / 2
    else:
        one = WORDS.get(action.dest, f"some-{action.dest}")
    if isinstance(action, argparse._AppendAction):
        one = one if isinstance(one, list) else [one]
    elif isinstance(action.nargs, int):
        one = [one] * action.nargs
    # A sample equal to the default would pass however the file's key were read, or dropped.
    assert one != action.default, (action.dest, one)
    return one


def _flags(action: argparse.Action, value: Any) -> list[str]:
    flag = action.option_strings[-1]
    if isinstance(action, argparse._StoreConstAction):
        return [flag] if value == action.const else []
    if isinstance(action, argparse._AppendAction):
        return [word for v in value for word in (flag, str(v))]
    if isinstance(value, list):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def _argv(command: str, values: dict[str, Any]) -> list[str]:
    keys = _keys(command)
    return [command, *(word for key, value in values.items() for word in _flags(keys[key], value))]


def _file(path: Path, values: dict[str, Any]) -> Path:
    sections: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        sections.setdefault(SECTION_OF[key], {})[key] = value
    path.write_text(tomli_w.dumps(sections))
    return path


def _refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line ``argv`` is refused with, after ``hintpipe: error: --config PATH: ``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    path = argv[argv.index("--config") + 1]
    prefix = f"hintpipe: error: --config {path}: "
    assert err.startswith(prefix), err
    return err.strip().removeprefix(prefix)


# -- the keys and their sections -----------------------------------------------------------------------------------


def test_every_flag_of_a_command_is_a_key_in_exactly_one_section() -> None:
    assert set(_commands()) == {"train", "simulate", "plan"}
    assert len(SECTION_OF) == sum(len(keys) for keys in SECTIONS.values()), "a key in two sections"
    assert not set(SECTIONS) & set(OLD_SECTIONS)
    for command, parser in _commands().items():
        flags = {a.dest for a in parser._actions if a.option_strings}
        keys = _keys(command)
        assert set(keys) == flags - INVOCATION, command
        unplaced = sorted(set(keys) - set(SECTION_OF))
        assert not unplaced, f"{command}'s flags with no section in hintpipe.cli.config_file.SECTIONS: {unplaced}"
    # The table's options that are flags are keys; the invocation's flags are not.
    for name, option in OPTIONS.items():
        for command in option.commands:
            assert name in _keys(command), (command, name)
    assert {"config", "print_config", "json"} <= INVOCATION


def _cases() -> list[tuple[str, str]]:
    return [(command, key) for command in REQUIRED for key in _keys(command)]


@pytest.mark.parametrize(("command", "key"), _cases())
def test_a_key_from_the_file_is_the_same_flag(tmp_path: Path, command: str, key: str) -> None:
    given = REQUIRED[command] | {key: _sample(_keys(command)[key])}
    path = _file(tmp_path / "run.toml", given)
    assert vars(parse_cli(_argv(command, given))) == vars(parse_cli([command, "--config", str(path)]))


def _everything(command: str, room: str | None) -> dict[str, Any]:
    """Every key of the command at a value other than its default (of the room options, only ``room``)."""
    keys = _keys(command)
    return {key: _sample(action) for key, action in keys.items() if key not in ROOM or key == room}


def _round_trips() -> list[tuple[str, str | None]]:
    return [("train", room) for room in ROOM] + [("simulate", room) for room in ROOM] + [("plan", None)]


@pytest.mark.parametrize(("command", "room"), _round_trips())
def test_print_config_writes_every_value_and_its_file_parses_to_the_same_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, room: str | None
) -> None:
    values = _everything(command, room)
    argv = _argv(command, values)
    assert main([*argv, "--print-config"]) == 0
    text = capsys.readouterr().out
    written = tomllib.loads(text)
    assert list(written) == [s for s in SECTIONS if s in written]  # in the map's order
    flat = {key: value for section, keys in written.items() for key, value in keys.items()}
    assert all(SECTION_OF[key] == section for section, keys in written.items() for key in keys)
    defaults = {key: a.default for key, a in _keys(command).items() if key not in values and a.default is not None}
    assert flat == values | defaults  # every key (the other room options at their defaults), none of the invocation's
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert vars(parse_cli([command, "--config", str(path)])) == vars(parse_cli(argv)) | {"print_config": False}
    # The same file drives the other commands: each takes the keys it has flags for and skips the others.
    for other in _commands():
        assert main([other, "--config", str(path), "--print-config"]) == 0, other
        capsys.readouterr()


def test_print_config_writes_the_model_and_the_checkpoints_and_leaves_out_what_is_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The user's report: a printed config trained another model than the one it was printed from.
    argv = ["train", "--ranks", "2", "--microbatches", "4", "--model", "mlp", "--layers", "3", "--hidden", "32"]
    assert main([*argv, "--checkpoint-dir", "ck", "--resume", "--json", "--print-config"]) == 0
    written = tomllib.loads(capsys.readouterr().out)
    assert written["model"] == {"model": "mlp", "layers": 3, "hidden": 32, "seq_len_dist": "fixed:64"}
    assert written["checkpoint"]["checkpoint_dir"] == "ck" and written["checkpoint"]["resume"] is True
    assert "hint" not in written["parallelism"] and "plan" not in written["checkpoint"]  # None: not given
    assert "json" not in str(written)


def _readme_config() -> str:
    blocks: list[str] = re.findall(r"^```toml\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.MULTILINE)
    assert len(blocks) == 2  # the fine-tune's (tests/apps/test_model_folders.py), then this one
    return blocks[1]


def test_the_readme_s_config_file_runs_as_it_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.toml"
    path.write_text(_readme_config())
    given = tomllib.loads(_readme_config())
    keys = _keys("train")
    for values in given.values():
        for key, value in values.items():  # a key at its default would pass read or dropped
            assert value != keys[key].default, key
    for command in ("train", "simulate"):
        assert main([command, "--config", str(path), "--print-config"]) == 0, capsys.readouterr().err
        written = tomllib.loads(capsys.readouterr().out)
        taken = _keys(command)  # simulate takes neither the model nor the steps
        ours = {s: {k: v for k, v in keys.items() if k in taken} for s, keys in given.items()}
        assert {s: {k: written[s][k] for k in keys} for s, keys in ours.items() if keys} == {
            s: keys for s, keys in ours.items() if keys
        }, command
    args = parse_cli(["train", "--config", str(path)])
    config = config_from(args, args.policy)
    assert (config.model.name, config.model.layers, config.pipeline.microbatches, config.training.steps) == (
        "mlp",
        6,
        8,
        100,
    )
    assert (
        config.parallelism.ranks,
        str(config.pipeline.policy),
        config.pipeline.hint,
        config.training.variability,
    ) == (2, "fixed", "zb-h1", ("mb:0.3",))


@pytest.mark.parametrize(
    ("section", "key", "wrong", "said"),
    [
        ("model", "model", 3, "--model must be a string, got 3"),
        ("model", "layers", 2.5, "--layers must be an integer, got 2.5"),
        ("model", "layers", "6", "--layers must be an integer, got '6'"),
        ("training", "microbatches", True, "--microbatches must be an integer, got True"),
        ("training", "steps", 100.0, "--steps must be an integer, got 100.0"),
        ("training", "variability", 0.3, "--variability must be a list of strings, got 0.3"),
        ("training", "variability", [0.3], "--variability must be a list of strings, got [0.3]"),
        ("parallelism", "ranks", "2", "--ranks must be an integer, got '2'"),
        ("parallelism", "policy", 1, "--policy 1 is unknown: choose one of fixed, greedy, ready"),
        ("parallelism", "hint", ["zb-h1"], "--hint must be a string, got ['zb-h1']"),
    ],
)
def test_each_key_of_the_readme_s_file_refuses_a_wrongly_typed_value_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str, wrong: Any, said: str
) -> None:
    given = tomllib.loads(_readme_config())
    assert key in given[section]
    given[section][key] = wrong
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(given))
    assert _refusal(capsys, ["train", "--config", str(path)]) == f"[{section}] {key}: {said}"


# -- flags over the file -------------------------------------------------------------------------------------------


def test_flags_override_the_file_and_a_run_s_config_equals_its_flags(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        '[model]\nmodel = "mlp"\nlayers = 2\n[training]\nmicrobatches = 8\nsteps = 3\n'
        '[parallelism]\nranks = 2\npolicy = "fixed"\nslack_microbatches = 1.0\n'
    )
    from_file = parse_cli(["train", "--config", str(path), "--policy", "greedy", "--device-budget-fraction", "0.5"])
    from_flags = parse_cli(["train", "--ranks", "2", "--microbatches", "8", "--steps", "3", "--policy", "greedy"])
    from_flags.model, from_flags.layers = "mlp", 2
    from_flags.device_budget_fraction = 0.5  # the room the flags give replaces the file's slack_microbatches
    assert vars(from_file) == vars(from_flags)
    assert config_from(from_file, from_file.policy) == config_from(from_flags, from_flags.policy)


def test_a_repeatable_flag_replaces_the_file_s_list(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[training]\nvariability = ["mb:0.3"]\n')
    base = ["simulate", "--ranks", "2", "--microbatches", "4", "--config", str(path)]
    assert parse_cli(base).variability == ["mb:0.3"]
    assert parse_cli([*base, "--variability", "iid:0.1"]).variability == ["iid:0.1"]
    assert parse_cli([*base, "--var", "iid:0.1"]).variability == ["iid:0.1"]  # argparse's prefix of the flag
    path.write_text('[training]\nvariability = "mb:0.3"\n')  # one string: a list of one
    assert parse_cli(base).variability == ["mb:0.3"]


def test_values_take_their_flag_s_type(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[optimizer]\nlr = 1\n[parallelism]\nactivation_budget = 1048576\n")
    args = parse_cli(["train", "--ranks", "2", "--microbatches", "4", "--config", str(path)])
    assert args.lr == 1.0 and isinstance(args.lr, float)  # a number flag takes an integer, as a float
    assert args.activation_budget == 1048576  # a size: a number of bytes, or a string such as "1MiB"


def test_keys_of_another_command_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        '[simulate]\ntrials = 3\n[plan]\nrepeats = 2\n[checkpoint]\ncheckpoint_dir = "ck"\nsave = "p.plan"\n'
        "[parallelism]\nranks = 2\n[training]\nmicrobatches = 4\n"
    )
    assert parse_cli(["simulate", "--config", str(path)]).trials == 3
    assert parse_cli(["plan", "--config", str(path)]).save == "p.plan"
    train = parse_cli(["train", "--config", str(path)])
    assert train.checkpoint_dir == "ck" and not hasattr(train, "trials") and not hasattr(train, "save")


# -- refusals ------------------------------------------------------------------------------------------------------

SECTION_LIST = "model, data, optimizer, lr_schedule, training, parallelism, checkpoint, metrics, simulate, plan"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[parallelism]\npolcy = "ready"\n', "unknown key 'polcy' in [parallelism]; did you mean 'policy'?"),
        ("[parallelism]\nstps = 2\n", "unknown key 'stps' in [parallelism]; did you mean 'steps' in [training]?"),
        ("[lr_schedule]\nzzz = 1\n", "unknown key 'zzz' in [lr_schedule]; its keys are lr_schedule, warmup_steps"),
        ('polcy = "ready"\n', "unknown key 'polcy' at the top level; did you mean 'policy' in [parallelism]?"),
        ("zzz = 1\n", f"unknown key 'zzz' at the top level; keys go in the sections {SECTION_LIST}"),
        ("[model]\nsteps = 2\n", "'steps' belongs in [training], not [model]"),
        ("steps = 2\n", "'steps' belongs in [training], not at the top level"),
        ('[simulate]\nmodel = "mlp"\n', "'model' belongs in [model], not [simulate]"),  # another command's section
        ("[parallelsm]\nranks = 2\n", "unknown section [parallelsm]; did you mean [parallelism]?"),
        ("[zzz]\nranks = 2\n", f"unknown section [zzz]; the sections are {SECTION_LIST}"),
        (
            '[pipeline]\nmicrobatches = 8\npolicy = "fixed"\n[run]\nranks = 2\nsteps = 3\ndata = "stdlib"\n',
            "[pipeline] and [run] are no longer sections: put data in [data]; microbatches and steps in [training]; "
            "policy and ranks in [parallelism]",
        ),
        (
            "[run]\nsteps = 3\n",
            "[run] is no longer a section: put steps in [training]",
        ),
    ],
)
def test_a_misplaced_or_unknown_key_is_refused_in_one_line_with_the_nearest_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert _refusal(capsys, ["train", "--config", str(path)]) == said


@pytest.mark.parametrize(
    ("command", "text", "said"),
    [
        ("train", "[training]\nsteps = 2.5\n", "[training] steps: --steps must be an integer, got 2.5"),
        ("train", '[training]\nsteps = "2"\n', "[training] steps: --steps must be an integer, got '2'"),
        ("train", "[training]\nsteps = true\n", "[training] steps: --steps must be an integer, got True"),
        ("train", "[training]\nsteps = 0\n", "[training] steps: --steps must be between 1 and 2147483647, got 0"),
        ("simulate", "[parallelism]\nranks = 2.0\n", "[parallelism] ranks: --ranks must be an integer, got 2.0"),
        ("simulate", "[simulate]\ntrials = 1.5\n", "[simulate] trials: --trials must be an integer, got 1.5"),
        ("train", '[optimizer]\nlr = "fast"\n', "[optimizer] lr: --lr must be a number, got 'fast'"),
        ("train", "[training]\nemulate = 1\n", "[training] emulate: --emulate must be true or false, got 1"),
        (
            "train",
            '[parallelism]\npolicy = "soon"\n',
            "[parallelism] policy: --policy 'soon' is unknown: choose one of fixed, greedy, ready",
        ),
        (
            "plan",
            '[parallelism]\nhint = "zigzag"\n',
            f"[parallelism] hint: --hint 'zigzag' is unknown: choose one of {HINTS}",
        ),
        (
            "simulate",
            "[training]\nvariability = [1]\n",
            "[training] variability: --variability must be a list of strings, got [1]",
        ),
        ("train", "[data]\ndata = 3\n", "[data] data: --data must be a list of strings, got 3"),
        (
            "train",
            "[checkpoint]\ncheckpoint_dir = 3\n",
            "[checkpoint] checkpoint_dir: --checkpoint-dir must be a string, got 3",
        ),
        ("plan", "[plan]\nstage_memory = true\n", "[plan] stage_memory: --stage-memory must be a size, got True"),
        (
            "simulate",
            '[parallelism]\nactivation_budget = "2GiB,lots"\n',
            "[parallelism] activation_budget: --activation-budget: bad size 'lots': expected a number with an "
            "optional unit such as 512MiB, 2GiB or 1e9",
        ),
    ],
)
def test_a_bad_value_is_refused_in_its_flag_s_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str, said: str
) -> None:
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert _refusal(capsys, [command, "--config", str(path)]) == said


def test_a_file_that_is_not_toml_or_not_there_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.toml"
    assert _refusal(capsys, ["train", "--config", str(path)]) == "No such file or directory"
    path.write_text("policy = \n")
    assert main(["train", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"hintpipe: error: --config {path} is not TOML: ")


def test_a_file_that_is_no_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[training]\nsteps = "\xff"\n')
    huge = tmp_path / "huge.toml"
    huge.write_text("# " + "x" * (1 << 20) + "\n")
    for path, said in (
        ("/dev/zero", "/dev/zero is not a regular file; give a TOML file"),
        (deep, f"{deep} nests too deep to be a config file"),
        (latin, f"{latin} is not UTF-8 text (byte 20)"),
        (huge, f"{huge} is over 1 MiB; a config file is a few kilobytes"),
    ):
        assert main(["train", "--config", str(path)]) == 2
        assert capsys.readouterr().err == f"hintpipe: error: --config {said}\n"
