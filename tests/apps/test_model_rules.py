"""The rules between a run's model and its options (:mod:`hintpipe.apps.model_rules`, [Note: the model's rules are
the config's]): each is the config's, so ``TrainConfig`` refuses in Python what ``hintpipe train`` refuses on the
command line, one rule in the words of each (the command line's flags, Python's keywords)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.model_rules import check_model_options
from hintpipe.apps.train_config import TrainConfig
from hintpipe.cli import main
from hintpipe.forming.form import Forming
from hintpipe.option import said_as_flags
from hintpipe.runtime.injection import Injection

GPT = ModelConfig("gpt-mini")

#: (the config's fields, what Python says, the flags that make the same run, what the command line says)
RULES: list[tuple[dict[str, Any], str, list[str], str]] = [
    (
        {"faults": ("crash:1:99",), "steps": 1},
        "faults names step 99, the run has steps 0..0: it would never fire",
        ["--faults", "crash:1:99", "--steps", "1"],
        "--faults names step 99, the run has steps 0..0: it would never fire",
    ),
    (
        {"tp": 3},
        "tp 3 must divide gpt-mini's 4 attention heads",
        ["--tp", "3"],
        "--tp 3 must divide gpt-mini's 4 attention heads",
    ),
    (
        {"tp": 2, "model": ModelConfig("mlp")},
        "tp has a tensor-parallel plan for the built-in gpt-mini only (not plan or other models)",
        ["--tp", "2", "--model", "mlp"],
        "--tp has a tensor-parallel plan for the built-in gpt-mini only (not --plan or other models)",
    ),
    (
        {"forming": "padded"},
        "forming padded forms micro-batches from whole documents: use it with data stdlib or data PATH",
        ["--forming", "padded"],
        "--forming padded forms micro-batches from whole documents: use it with --data stdlib or --data PATH",
    ),
    (
        {"seq_len_dist": SeqLenDist(5000)},
        "seq_len_dist fixed:5000: gpt-mini's positions end at 255 tokens; use a mean of at most 255 (seq_len_dist "
        "SeqLenDist(mean=255, sigma=0.0))",
        ["--seq-len-dist", "fixed:5000"],
        "--seq-len-dist fixed:5000: gpt-mini's positions end at 255 tokens; use a mean of at most 255 "
        "(--seq-len-dist fixed:255)",
    ),
    (
        {"activation_budget": 1.0, "seq_len_dist": SeqLenDist(64), "model": ModelConfig("gpt-mini", hidden=64)},
        "activation_budget 1 is below one micro-batch's hidden states, 64KiB (4 x 64 tokens x 64 values of 4 bytes)",
        ["--activation-budget", "1", "--hidden", "64"],
        "--activation-budget 1 is below one micro-batch's hidden states, 64KiB (4 x 64 tokens x 64 values of 4 bytes)",
    ),
    (
        {"model": ModelConfig("gpt-mini", layers=1), "ranks": 4},
        "layers 1 makes 3 layers (1 and 2 more of gpt-mini's own), too few for 4 stages; use layers 2 or more",
        ["--layers", "1", "--ranks", "4"],
        "--layers 1 makes 3 layers (1 and 2 more of gpt-mini's own), too few for 4 stages; use --layers 2 or more",
    ),
    (
        {"faults": ("crash:5:0",)},
        "crash rank 5 does not exist: the run has ranks 0..1",
        ["--faults", "crash:5:0"],
        "crash rank 5 does not exist: the run has ranks 0..1",
    ),
    (
        {"variability": ("straggler:2:5",)},
        "straggler stage 5 does not exist: the pipeline has 2 stages",
        ["--variability", "straggler:2:5"],
        "straggler stage 5 does not exist: the pipeline has 2 stages",
    ),
]


@pytest.mark.parametrize(("fields", "python", "flags", "command_line"), RULES, ids=[" ".join(r[2]) for r in RULES])
def test_python_refuses_what_the_command_line_refuses_each_in_its_words(
    fields: dict[str, Any], python: str, flags: list[str], command_line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, ``TrainConfig`` took every one of these runs (the model's rules were the command line's alone): the
    last three failed later, in every rank, once the ranks had started."""
    with pytest.raises(ValueError) as refused:
        base: dict[str, Any] = {"model": GPT, "ranks": 2, "microbatches": 4}
        TrainConfig.of(**(base | fields))
    assert str(refused.value).startswith(python)
    assert main(["train", "--ranks", "2", "--microbatches", "4", *flags]) == 2
    assert command_line in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "data", "tp", "forming", "faults", "message"),
    [
        (ModelConfig("mlp"), ("a.txt", "b.txt"), 1, Forming.CROP, [], "--data a.txt --data b.txt is text: use a "
         "language model (gpt-mini, hf-gpt2, a model folder)"),
        (ModelConfig("hf-gpt2"), "stdlib", 1, Forming.PACKED, [], "--forming packed needs a model that takes "
         "document masks (gpt-mini), not hf-gpt2; --forming concat lays documents end to end without masks, for any "
         "model"),
    ],
)  # fmt: skip
def test_the_model_s_data_rules_name_the_flags_as_given(
    model: ModelConfig, data: str | tuple[str, ...], tp: int, forming: Forming, faults: list[str], message: str
) -> None:
    with said_as_flags(), pytest.raises(ValueError) as refused:
        check_model_options(model, data, tp, forming, Injection.parse(faults=faults), 5)
    assert str(refused.value) == message
    with pytest.raises(ValueError, match=r"^data \('a.txt', 'b.txt'\) is text: use a language model"):
        check_model_options(ModelConfig("mlp"), ("a.txt", "b.txt"), 1, Forming.CROP, Injection(), 5)


def test_options_the_model_honours_pass() -> None:
    check_model_options(GPT, "stdlib", 2, Forming.PACKED, Injection.parse(faults=["crash:1:4"]), 5)
    check_model_options(ModelConfig("mlp"), "synthetic", 1, Forming.CROP, Injection(), 5)
    config = TrainConfig.of(
        model=GPT, ranks=2, microbatches=4, tp=2, activation_budget=2**30, steps=5, faults=("crash:1:4",)
    )
    assert config.parallelism.tp == 2


def test_a_folder_model_too_small_for_its_data_is_refused_before_it_is_planned_each_in_its_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the command line planned the model (capture, profiles) and then told a folder's user to write
    ``ModelConfig(vocab=256)``, which a folder's model refuses (its config says its vocabulary)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=100, n_embd=16, n_layer=2, n_head=2, n_positions=64)
    folder = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"document {i}: " + "xy" * i for i in range(40)))
    model = ModelConfig("hf-folder", source=str(folder), vocab=100, max_seq_len=64)
    fix = (
        "use a tokenizer of at most 100 ids, or the model resized to hold them (model.resize_token_embeddings(256), "
        "then save_pretrained)"
    )
    with pytest.raises(ValueError) as refused:
        TrainConfig.of(model=model, ranks=2, microbatches=2, data=str(text), seq_len_dist=SeqLenDist(32))
    assert str(refused.value) == (
        f"data {str(text)!r} has token ids up to 255 (tokenizer bytes); {folder}'s vocabulary is 100: {fix}"
    )
    planned: list[object] = []
    monkeypatch.setattr("hintpipe.cli.train.plan_once", lambda *args: planned.append(args))
    argv = ["train", "--model", str(folder), "--ranks", "2", "--microbatches", "2", "--data", str(text)]
    assert main([*argv, "--seq-len-dist", "fixed:32"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hintpipe train: error: --data {text} has token ids up to 255 (--tokenizer bytes); {folder}'s vocabulary "
        f"is 100: {fix}"
    )
    assert planned == []
