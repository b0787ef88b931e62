"""The flags that say which model a command trains (:mod:`hintpipe.cli.model_flags`): a built-in model sized by
its flags and the data's vocabulary, a folder or a factory sized by its own, and each wrong mix refused."""

from __future__ import annotations

import argparse

import pytest

from hintpipe.apps.model_config import ModelConfig
from hintpipe.cli.model_flags import add_model_flags, given_sizes, model_config


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    return parser.parse_args(list(argv))


def test_a_built_in_model_is_sized_by_its_flags_then_the_datas_vocabulary() -> None:
    assert model_config(_args(), seed=3, data_vocab=None) == ModelConfig("gpt-mini", seed=3)
    assert model_config(_args("--layers", "2", "--max-seq-len", "64"), seed=0, data_vocab=256) == ModelConfig(
        "gpt-mini", layers=2, vocab=256, max_seq_len=64
    )
    assert model_config(_args("--vocab", "50"), seed=0, data_vocab=256).vocab == 50  # the flag over the data's
    assert given_sizes(_args("--hidden", "32", "--dropout", "0.1")) == {"hidden": 32, "dropout": 0.1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "mlp", "--init", "random"], "--init random: --model mlp is a built-in model, its weights always "
         "start from --seed; --init is for a model folder"),
        (["--model", "mymodels:build", "--layers", "2", "--hidden", "8", "--max-seq-len", "8"], "--layers --hidden: "
         "--model mymodels:build is sized by its own config; leave --layers --hidden out"),  # --max-seq-len: taken
        (["--hidden", "30"], "--model gpt-mini: hidden 30 must be a multiple of heads 4"),
        (["--model", "gpt-mini", "--dropout", "0.1"], "--model gpt-mini: gpt-mini has no dropout; leave dropout out "
         "(the hf-* models take it)"),
    ],
)  # fmt: skip
def test_a_wrong_mix_of_model_flags_is_refused_in_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        model_config(_args(*argv), seed=0, data_vocab=None)
    assert str(refused.value) == message
