"""A model of the command line, without building it (:mod:`hintpipe.apps.model_config`): its sizes checked in one
line each, and its sequence lengths drawn from a spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hintpipe.apps.model_config import MODELS, PLANNED_MODELS, ModelConfig, SeqLenDist
from hintpipe.apps.model_spec import model_kind
from hintpipe.spec import SpecError


def test_built_in_models_need_no_source_and_the_others_are_labelled_by_theirs() -> None:
    assert MODELS == ("mlp", "gpt-mini", "mm-mini", "hf-gpt2", "hf-llama")
    assert PLANNED_MODELS == ("hf-gpt2", "hf-llama", "hf-folder", "factory")
    assert ModelConfig("gpt-mini").label == "gpt-mini"
    assert ModelConfig("factory", source="models:build").label == "models:build"
    assert ModelConfig("hf-gpt2", dropout=0.1).spec.dropout


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "gpt-max"}, "unknown model 'gpt-max': choose one of mlp, gpt-mini, mm-mini, hf-gpt2, hf-llama, "
         "hf-folder, factory"),
        ({"layers": 0}, "layers and hidden must be at least 1, got 0 and 64"),
        ({"vocab": 1}, "heads must be at least 1, vocab and max_seq_len at least 2, got 4, 1 and 256"),
        ({"hidden": 30}, "hidden 30 must be a multiple of heads 4"),
        ({"dropout": 1.0}, "dropout must be in [0, 1), got 1.0"),
        ({"dropout": 0.1}, "gpt-mini has no dropout; leave dropout out (the hf-* models take it)"),
        ({"init": "zeros"}, "init 'zeros' is unknown: choose one of pretrained, random"),
        ({"source": "/models/x"}, "model 'gpt-mini' takes no source"),
        ({"name": "hf-folder"}, "model 'hf-folder' needs a source"),
    ],
)  # fmt: skip
def test_a_model_that_cannot_be_is_refused_in_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        ModelConfig(**fields)  # type: ignore[arg-type]
    assert str(refused.value) == message


def test_an_mlp_has_no_heads_to_divide_its_width() -> None:
    assert ModelConfig("mlp", hidden=30).hidden == 30


def test_sequence_lengths_are_fixed_or_drawn_and_clipped() -> None:
    assert SeqLenDist.parse("fixed:48") == SeqLenDist(48)
    assert SeqLenDist(48).sample(3, np.random.default_rng(0), 32) == [32, 32, 32]  # at most the model's limit
    drawn = SeqLenDist.parse("lognormal:64:3").sample(200, np.random.default_rng(0), 100)
    assert min(drawn) == 8 and max(drawn) == 100 and len(set(drawn)) > 10  # wide: clipped at both ends
    again = SeqLenDist(64, 3.0).sample(200, np.random.default_rng(0), 100)
    assert drawn == again


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("fixed:0", "T '0' is not an integer >= 1"),
        ("lognormal:64", "expected fixed:T or lognormal:MEAN:SIGMA"),
        ("uniform:3", "expected fixed:T or lognormal:MEAN:SIGMA"),
        ("lognormal:64:-1", "SIGMA must be a finite number >= 0, got '-1'"),
    ],
)
def test_a_bad_distribution_is_refused_naming_it(text: str, why: str) -> None:
    with pytest.raises(SpecError) as refused:
        SeqLenDist.parse(text)
    assert str(refused.value) == f"bad sequence length distribution {text!r}: {why}"


def test_a_folder_that_holds_no_model_is_refused_saying_what_it_is(tmp_path: Path) -> None:
    """A PEFT adapter's folder (what fine-tuning with LoRA saves) was refused as any folder without config.json."""
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "base_model_name_or_path": "gpt2"}')
    with pytest.raises(ValueError) as refused:
        model_kind(str(adapter))
    assert str(refused.value) == (
        f"--model {adapter}: a PEFT adapter folder (adapter_config.json), not a model; merge the adapter into its "
        "base model (merge_and_unload) and give the folder save_pretrained writes of that"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r": the folder has no config.json; give a folder written by"):
        model_kind(str(empty))
    (adapter / "config.json").write_text("{}")  # a model folder with its adapter beside it: a model folder
    assert model_kind(str(adapter)) == ("hf-folder", str(adapter.resolve()))


def test_a_hub_model_is_read_from_this_machines_cache_and_never_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--model gpt2`` (a Hub id, as ``from_pretrained`` takes it offline) was refused as not a folder."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    assert model_kind("acme/tiny") == ("hf-folder", str(snapshot.resolve()))
    with pytest.raises(ValueError) as refused:
        model_kind("acme/other")
    assert str(refused.value) == (
        "--model acme/other: not a built-in model (mlp, gpt-mini, mm-mini, hf-gpt2, hf-llama), a model folder "
        "(save_pretrained) or module:function; a Hugging Face Hub model is read from this machine's cache: "
        "huggingface-cli download acme/other first"
    )
    with pytest.raises(ValueError, match=r"or module:function$"):
        model_kind("./no/such/folder")  # not a Hub id: nothing to download
