"""The model a ``hintpipe train`` run trains, before any rank starts (:mod:`hintpipe.cli.train_model`): what a
``--plan`` file says and the flags that contradict it, the flags a run needs without one, and the tokenizer its
data are read with."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from hintpipe.apps.model_config import ModelConfig
from hintpipe.cli.train_model import answered_by_plan, bad_fields, plan_model, resolve_tokenizer

PLANNED = ModelConfig("gpt-mini", layers=2, hidden=32)


def _args(**given: Any) -> argparse.Namespace:
    flags: dict[str, Any] = {"plan": None, "ranks": None, "microbatches": None, "hint": None, "chunks": None, "seed": 0}
    flags |= {"model": None, "init": None, "layers": None, "hidden": None, "heads": None, "vocab": None}
    flags |= {"max_seq_len": None, "dropout": None, "data": "synthetic", "tokenizer": None}
    return argparse.Namespace(**(flags | given))


def test_without_a_plan_the_run_says_its_ranks_and_micro_batches() -> None:
    args = _args(ranks=2, microbatches=4)
    assert answered_by_plan(args) is None
    assert (args.hint, args.chunks) == ("1f1b", None)  # the usual defaults
    with pytest.raises(ValueError, match=r"^--ranks and --microbatches must be given \(or --plan FILE, which says"):
        answered_by_plan(_args())
    with pytest.raises(ValueError, match=r"^--microbatches must be given"):
        answered_by_plan(_args(ranks=2))


def test_under_torchrun_the_ranks_are_torchrun_s_over_dp_and_tp(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    for given, ranks in (({}, 4), ({"dp": 2}, 2), ({"dp": 2, "tp": 2}, 1), ({"ranks": 2, "dp": 1}, 2)):
        args = _args(microbatches=4, **given)
        assert answered_by_plan(args) is None
        assert args.ranks == ranks, given
    with pytest.raises(ValueError) as refused:
        answered_by_plan(_args(microbatches=4, dp=3))
    said = "--ranks must be given: torchrun started 4 ranks, which --dp 3 x --tp 1 does not divide"
    assert str(refused.value) == said
    monkeypatch.delenv("MASTER_ADDR")  # not under torchrun: the flag is needed
    with pytest.raises(ValueError, match=r"^--ranks must be given \(or --plan FILE, which says them\)$"):
        answered_by_plan(_args(microbatches=4))


def test_a_folder_given_as_a_plan_is_refused_pointing_to_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        answered_by_plan(_args(plan=str(tmp_path)))
    assert str(refused.value) == (
        f"--plan {tmp_path} is a folder: a plan is a file `hintpipe plan ... --save FILE` writes; to train a model "
        "folder, give it to --model"
    )


def test_the_plan_files_model_is_the_runs_and_a_flag_that_says_otherwise_is_refused() -> None:
    payload = {"model": {"config": dataclasses.asdict(PLANNED)}}
    assert plan_model(_args(layers=2, model="gpt-mini"), "run.plan", payload) == PLANNED  # the same: fine
    with pytest.raises(ValueError) as refused:
        plan_model(_args(hidden=64), "run.plan", payload)
    assert str(refused.value) == (
        "run.plan is planned for --hidden 32, this run asks for --hidden 64; leave --hidden out (the plan file says "
        "it) or plan again"
    )
    with pytest.raises(ValueError, match=r"^run.plan is planned for --model gpt-mini, this run asks for --model mlp;"):
        plan_model(_args(model="mlp"), "run.plan", payload)
    with pytest.raises(ValueError, match=r"^run.plan does not say which model it was planned for: plan it with "):
        plan_model(_args(), "run.plan", {"model": {}})


def test_a_plan_file_of_wrong_fields_is_said_as_such() -> None:
    assert str(bad_fields("run.plan", KeyError("ranks"))) == (
        "run.plan says it is a hintpipe plan file but its fields are not a plan's (no field 'ranks'); write it again "
        "with `hintpipe plan ... --save FILE`"
    )


def test_the_tokenizer_is_the_one_given_else_bytes_for_data_without_a_tokenizer_of_its_own() -> None:
    given = _args(data="stdlib", tokenizer="/tok")
    resolve_tokenizer(given)
    assert given.tokenizer == "/tok"
    for data in ("stdlib", "synthetic", ["a.txt", "b.txt"]):
        args = _args(data=data)
        resolve_tokenizer(args)
        assert args.tokenizer == "bytes"
    assert args.data == ("a.txt", "b.txt")  # the option's value: several entries a tuple


def test_help_calls_required_only_the_flags_a_run_cannot_go_without() -> None:
    """``--chunks`` defaults to the hint's own, which ``--help`` once called required."""
    text = " ".join(_train_help().split())
    for flag in ("--ranks P", "--microbatches M"):
        assert f"{flag} " in text and "(required, unless --plan FILE says it)" in text.split(flag, 1)[1][:200]
    chunks = text.split("--chunks V", 1)[1].split("--admission", 1)[0]
    assert "required" not in chunks
    assert chunks.strip().endswith("default: the hint's own (1); with --plan, the plan file's")
    hint = text.split("--hint H", 1)[1].split("--policy", 1)[0]
    assert hint.strip().endswith("(default 1f1b; with --plan, the plan file's)")


def _train_help() -> str:
    from hintpipe.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text: str = commands.choices["train"].format_help()
    return text.split("options:", 1)[1]
