"""A Hugging Face causal language model from its folder (:mod:`hintpipe.apps.hf_folder`): its sizes read from its
config before any rank starts, its description for checkpoints, and a folder that is no such model refused in one
line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from hintpipe.apps.hf_folder import described_sizes, folder_description, folder_sizes
from hintpipe.apps.model_config import ModelConfig

GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 50, "n_positions": 32}


def _folder(tmp_path: Path, config: dict[str, object]) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_a_folders_sizes_are_its_configs(tmp_path: Path) -> None:
    folder = _folder(tmp_path, GPT2)
    sizes = folder_sizes(folder, init="random", seed=4)
    assert sizes == ModelConfig(
        "hf-folder", layers=2, hidden=16, heads=2, vocab=50, max_seq_len=32, seed=4, source=folder, init="random"
    )
    described = folder_description(sizes)
    assert (described["kind"], described["architecture"], described["config"]["n_embd"]) == (
        "hf",
        "GPT2LMHeadModel",
        16,
    )
    assert described["hintpipe_model"]["init"] == "random"
    again = described_sizes({"config": described["config"]}, label="plan.pt")
    assert (again.layers, again.hidden, again.vocab, again.source) == (2, 16, 50, "plan.pt")


def test_a_folder_that_is_no_causal_language_model_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"model_type": "vit", "hidden_size": 8})
    with pytest.raises(ValueError) as refused:
        folder_sizes(folder)
    assert str(refused.value) == (
        f"--model {folder}: its model type 'vit' has no causal language model in transformers "
        f"{transformers.__version__} (AutoModelForCausalLM)"
    )
    with pytest.raises(ValueError, match=r"^--model .*/absent: its config.json is not JSON \(\[Errno 2\]"):
        folder_sizes(str(tmp_path / "absent"))


def test_a_folder_that_asks_for_code_is_refused_before_transformers_reads_it(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {**GPT2, "auto_map": {"AutoModelForCausalLM": "mine.Model"}})
    with pytest.raises(ValueError) as refused:
        folder_sizes(folder)
    assert str(refused.value) == (
        f"--model {folder}: its config.json maps to Python code in the folder (auto_map), and hintpipe runs no code "
        "from a model folder; use a model class that transformers ships"
    )
