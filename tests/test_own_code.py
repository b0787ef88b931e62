"""No code from a folder or the Hub (:mod:`hintpipe.own_code`): a folder whose JSON maps to its own Python, and a
config that names a Hub kernel or a quantizer, are refused in one line before transformers reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hintpipe.own_code import refuse_hub_code, refuse_own_code


def _folder(tmp_path: Path, **files: object) -> str:
    for name, data in files.items():
        text = data if isinstance(data, str) else json.dumps(data)
        (tmp_path / f"{name}.json").write_text(text)
    return str(tmp_path)


def test_a_folder_that_maps_to_its_own_code_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = _folder(tmp_path, tokenizer_config={"model_max_length": 8}, config={"auto_map": {"AutoModel": "m.M"}})
    with pytest.raises(ValueError) as refused:
        refuse_own_code(folder, ("tokenizer_config.json", "config.json"), what="tokenizer")
    assert str(refused.value) == (
        f"{folder}: its config.json maps to Python code in the folder (auto_map), and hintpipe runs no code from "
        "a tokenizer folder; use a tokenizer class that transformers ships"
    )


def test_a_missing_or_unreadable_file_is_refused_only_where_it_is_required(tmp_path: Path) -> None:
    folder = _folder(tmp_path, config="{not json", tokenizer_config=[1, 2])
    refuse_own_code(
        folder, ("config.json", "tokenizer_config.json", "absent.json"), what="tokenizer"
    )  # for transformers
    with pytest.raises(ValueError, match=r": its config.json is not JSON \(Expecting property name"):
        refuse_own_code(folder, ("config.json",), what="model", required=True)
    with pytest.raises(ValueError, match=r"^.*: its tokenizer_config.json is not a JSON object$"):
        refuse_own_code(folder, ("tokenizer_config.json",), what="model", required=True)
    with pytest.raises(ValueError, match=r"^.*: its absent.json is not JSON \(\[Errno 2\] No such file"):
        refuse_own_code(folder, ("absent.json",), what="model", required=True)


def test_a_config_with_only_transformers_own_implementations_passes() -> None:
    refuse_hub_code(
        {
            "_attn_implementation": "sdpa",
            "attn_implementation": {"text_config": "eager", "vision_config": None},
            "experts_implementation": "grouped_mm",
            "quantization_config": None,
            "text_config": {"use_kernels": False, "hidden_size": 8},
        },
        "config.json",
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"_attn_implementation_internal": "kernels-community/flash-attn2"},
            "config.json's _attn_implementation_internal is 'kernels-community/flash-attn2', not one of "
            "transformers' own (eager, sdpa, flex_attention): hintpipe builds a model with transformers' own code "
            "only, no kernel from the Hub; use one of those or leave it out",
        ),
        (
            {"text_config": {"attn_implementation": {"text": "flash_attention_2"}}},
            "config.json's text_config.attn_implementation is 'flash_attention_2', not one of transformers' own "
            "(eager, sdpa, flex_attention): hintpipe builds a model with transformers' own code only, no kernel "
            "from the Hub; use one of those or leave it out",
        ),
        (
            {"vision_config": {"quantization_config": {"bits": 4}}},
            "config.json's vision_config.quantization_config is {'bits': 4}: hintpipe builds a model with "
            "transformers' own code only (no code from a folder or the Hub, no quantizer); remove it",
        ),
    ],
)
def test_a_config_that_names_code_is_refused_naming_the_key_and_its_value(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        refuse_hub_code(config, "config.json")
    assert str(refused.value) == message
