"""One options source: the Python keywords, the run's config and the command line's flags are the options of
:data:`hintpipe.options.OPTIONS`, under the same names, with the same defaults and choices."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

import hintpipe.runtime
from hintpipe.apps.config_section import key_of
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.run_sections import SECTIONS, place_of
from hintpipe.apps.training import TrainConfig
from hintpipe.cli import build_parser
from hintpipe.cli.common import RetiredFlag
from hintpipe.dispatch.policy import Policy
from hintpipe.modes import Precision
from hintpipe.option import ChoiceField
from hintpipe.options import OPTIONS, PipelineConfig, check_options, field_option
from hintpipe.planner.plan import plan
from hintpipe.runtime.pipeline import Pipeline

#: Flags that are not options of the pipeline or the run: what a command does with its results, and the model.
COMMAND_ONLY = {
    "train": {"json", "trace", "timeline", "plan", "checkpoint_dir", "resume", "check_grads", "emulate", "model",
              "init", "layers", "hidden", "heads", "vocab", "max_seq_len", "dropout", "seq_len_dist",
              "slack_microbatches", "activation_budget", "device_budget_fraction"},
    "simulate": {"json", "trace", "timeline", "compare", "costs", "trials", "slack_microbatches", "activation_budget",
                 "device_budget_fraction"},
    "plan": {"json", "save", "model", "init", "layers", "hidden", "heads", "vocab", "max_seq_len", "dropout",
             "seq_len"},
}  # fmt: skip
for _flags_of_a_command in COMMAND_ONLY.values():
    _flags_of_a_command |= {"config", "print_config"}  # --config FILE and --print-config, in every command
#: The room options are flags of both commands, in a group of their own (at most one of them).
ROOM_FLAGS = {"slack_microbatches", "activation_budget", "device_budget_fraction"}
#: ``train --plan FILE`` takes these from the file: their flags default to None (resolved after parsing); so
#: does the tokenizer (a model folder's own, where it has one).
FROM_PLAN = {"ranks", "microbatches", "hint", "chunks", "tokenizer"}
#: ``plan`` resolves the tokenizer as ``train`` does.
RESOLVED = {"plan": {"tokenizer"}}
#: The data's options: the planner takes a model, not data (the command reads the data's vocabulary).
DATA = ("data", "data_field", "data_split", "tokenizer")


def _flags(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = commands.choices[command]._actions  # a renamed option's flag before: see tests/cli/test_renamed_flags.py
    return {a.dest: a for a in actions if a.dest != "help" and not isinstance(a, RetiredFlag)}


def _default(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value


@pytest.mark.parametrize("command", ["train", "simulate", "plan"])
def test_every_flag_is_an_option_of_the_same_name_default_and_choices(command: str) -> None:
    flags = _flags(command)
    for dest, action in flags.items():
        if dest in COMMAND_ONLY[command] - ROOM_FLAGS:
            continue
        option = OPTIONS[dest]  # a KeyError names a flag defined beside the options
        assert command in option.commands, dest
        assert action.option_strings == [option.flag], dest
        if option.choices is not None and action.choices is not None:
            assert list(action.choices) == [m.value for m in option.choices], dest
        if (command == "train" and dest in FROM_PLAN) or dest in RESOLVED.get(command, ()):
            assert action.default is None and not action.required, dest
        elif option.kind not in ("specs", "sources") and not action.required:  # repeatable: none until given
            assert action.default == _default(option.default), dest
    for name, option in OPTIONS.items():
        if command in option.commands:
            assert name in flags, f"{option.flag} is missing from {command}"


def test_the_pipeline_config_is_the_table_s_pipeline_rows_with_their_defaults() -> None:
    fields = {f.name: f for f in dataclasses.fields(PipelineConfig)}
    assert list(fields) == [name for name, option in OPTIONS.items() if option.pipeline]
    for name, field in fields.items():
        option = OPTIONS[name]
        assert field_option(PipelineConfig, field) == option, name  # the one definition
        if option.required:
            assert field.default is dataclasses.MISSING, name
        else:
            assert field.default == option.default, name
    # The Pipeline takes the config, or its fields as keywords (checked by the config, not restated).
    signature = inspect.signature(Pipeline.__init__).parameters
    assert [n for n in signature if n not in ("self", "modules")] == [
        "loss_fn", "microbatches", "config", "seams", "names", "options"
    ]  # fmt: skip


def test_a_pipeline_config_converts_and_checks_its_values_once() -> None:
    config = PipelineConfig(microbatches=8, policy="fixed", precision="bf16")
    assert (config.policy, config.precision, config.hint) == (Policy.FIXED, Precision.BF16, "1f1b")
    assert dataclasses.replace(config, policy="ready").policy is Policy.READY
    with pytest.raises(
        ValueError, match=r"^give one of slack_microbatches, activation_budget, device_budget_fraction, got "
    ):
        PipelineConfig(microbatches=8, slack_microbatches=1.0, device_budget_fraction=0.5)
    with pytest.raises(ValueError, match=r"^microbatches must be at least 1, got 0$"):
        PipelineConfig(microbatches=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.policy = Policy.READY  # type: ignore[misc]


def _choice_fields(config_class: type) -> dict[str, ChoiceField[Any]]:
    return {
        f.name: descriptor
        for f in dataclasses.fields(config_class)
        if isinstance(descriptor := inspect.getattr_static(config_class, f.name, None), ChoiceField)
    }


def _read(config: TrainConfig, key: str) -> Any:
    """The option ``key`` of a run's config, read where its section holds it."""
    place = place_of(key)
    assert place is not None, key
    value: Any = config
    for part in place.split("."):
        value = getattr(value, part)
    return value


def _run_choices() -> dict[str, ChoiceField[Any]]:
    """Every choice of a run's config, by key: the pipeline's and its sections'."""
    sections = {
        key_of(s, f): inspect.getattr_static(s, f.name, None)
        for s in SECTIONS
        for f in dataclasses.fields(s)  # type: ignore[arg-type]
    }
    return _choice_fields(PipelineConfig) | {k: d for k, d in sections.items() if isinstance(d, ChoiceField)}


def test_every_choice_is_read_as_its_enum_however_it_was_given() -> None:
    """[Note: choices typed as their enums]: a string becomes the member once, when the config is made (by the
    constructor and by ``dataclasses.replace``); pickled and copied, the config is the same."""
    choices = _run_choices()
    assert set(_choice_fields(PipelineConfig)) == {
        "policy", "admission", "on_nonfinite", "precision", "data_parallel", "microbatch_order", "transport"
    }  # fmt: skip
    assert set(choices) - set(_choice_fields(PipelineConfig)) == {"optimizer", "lr_schedule", "forming"}
    for name, field in choices.items():
        other = next(member for member in type(field.default) if member is not field.default)
        # forming other than crop forms documents: a corpus's (and its byte vocabulary)
        text: dict[str, Any] = {"data": "stdlib"} if name == "forming" else {}
        model = ModelConfig(vocab=256) if text else ModelConfig()
        config = TrainConfig.of(model=model, ranks=2, microbatches=4, **({name: other.value} | text))
        assert _read(config, name) is other, name
        assert _read(config.replaced(**{name: field.default.value}), name) is field.default, name
        assert pickle.loads(pickle.dumps(config)) == config, name
        nonsense: dict[str, Any] = {name: "nonsense"}
        with pytest.raises(ValueError, match=rf"^{name} 'nonsense' is unknown: choose one of "):
            TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4, **nonsense)


def test_the_runtime_is_given_the_config_object() -> None:
    """The assembly, the options' agreement and the planned stages take the :class:`PipelineConfig`, never a
    mapping of option names (whose values a type checker cannot see), nor spread one into a config (but the
    public constructors' own keyword arguments, which ``configured`` applies to a given config)."""
    runtime = Path(hintpipe.runtime.__file__).parent
    untyped = [
        f"{path.relative_to(runtime)}:{number}"
        for path in sorted(runtime.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"options\[\"|options: (Mapping|dict)\[str, Any\]|replace\([\w.]+, \*\*(?!keywords\))", line)
    ]
    assert untyped == []


#: Where a mapping of option names may be: the config's own check of its fields, and a config file's keys as
#: they are read into the parser's defaults (the file's form, before any flag is parsed).
MAPPING_OF_OPTIONS_ALLOWED = ("options.py", "cli/config_file.py")


def test_the_command_line_reads_checked_flags_not_a_mapping_of_them() -> None:
    """The commands check their flags in place (:func:`hintpipe.cli.common.check_flags`) and read them as the
    namespace's attributes, typed by their options; a ``dict`` of checked values, read by key and passed to the
    checks and the data's preparation, was the command line's untyped copy of the options."""
    package = Path(hintpipe.runtime.__file__).parent.parent
    untyped = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        if str(path.relative_to(package)) not in MAPPING_OF_OPTIONS_ALLOWED
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\b(values|options|checked)(\[\"|\.get\(\")|\b(values|options): (Mapping|dict)\[str, Any\]", line)
    ]
    assert untyped == []


def test_the_run_config_has_every_train_option_with_its_default() -> None:
    """Each option of ``hintpipe train`` has its place in a run's config (see [Note: a key per field] in
    hintpipe.apps.run_sections), whose default is the option's."""
    config = TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4)
    for name, option in OPTIONS.items():
        if "train" not in option.commands or option.required:
            continue
        assert place_of(name) is not None, name
        default = _read(config, name)
        if option.name == "activation_budget":  # per rank in the config: a tuple, or None
            assert default is None
        else:
            assert default == _default(option.default), name


def test_the_planner_takes_the_plan_options_by_the_same_names() -> None:
    signature = inspect.signature(plan).parameters
    for name, option in OPTIONS.items():
        if "plan" in option.commands and name not in ("seed", "stage_memory", "microbatch_size", *DATA):
            assert name in signature, name
    assert signature["stage_memory"].default == math.inf  # the command line requires it; Python plans without


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"timeout": 0.5}, "timeout must be between 1 and 604800, got 0.5 (1 s: a busy machine delays messages"),
        ({"microbatches": 0}, "microbatches must be at least 1, got 0"),
        ({"microbatches": 2.5}, "microbatches must be an integer, got 2.5"),
        ({"slack_microbatches": math.nan}, "slack_microbatches must be finite, got nan"),
        ({"device_budget_fraction": -0.5}, "device_budget_fraction must be >= 0, got -0.5"),
        ({"activation_budget": "lots"}, "activation_budget: bad size 'lots'"),
        ({"policy": "eager"}, "policy 'eager' is unknown: choose one of fixed, greedy, ready"),
        (
            {"slack_microbatches": 1.0, "activation_budget": 1e6},
            "give one of slack_microbatches, activation_budget, device_budget_fraction",
        ),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_option(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        check_options(values)
    assert str(info.value).startswith(message)


def test_the_command_line_names_the_flag() -> None:
    with pytest.raises(ValueError, match=r"^--slack-microbatches must be >= 0, got -3$"):
        check_options({"slack_microbatches": -3.0}, cli=True)
    assert check_options({"activation_budget": "2GiB"})["activation_budget"] == 2.0 * 2**30
