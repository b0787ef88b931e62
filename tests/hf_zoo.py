"""Tiny Hugging Face causal language models of many architectures (mixtures of experts among them), saved as
users have them: a folder written by ``save_pretrained`` with a tokenizer beside the weights (no download:
configs in code, weights from a seed, a BPE tokenizer trained here on the corpus it will tokenize).

Dropout is off in every config, so that a pipeline and the unsplit model compute the same numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

VOCAB = 96
#: Every architecture by name: the config of a 2-layer model of width 32.
ARCHITECTURES: dict[str, Callable[[], Any]] = {
    "gpt2": lambda: transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    ),
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
        pad_token_id=0,
    ),
    "mistral": lambda: transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
    "qwen3": lambda: transformers.Qwen3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
    "phi3": lambda: transformers.Phi3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
    ),
    "gemma2": lambda: transformers.Gemma2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
    "gpt-neox": lambda: transformers.GPTNeoXConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=VOCAB,
        max_position_embeddings=64, bos_token_id=0, eos_token_id=0, hidden_dropout=0.0, attention_dropout=0.0,
    ),
    "opt": lambda: transformers.OPTConfig(
        hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2, word_embed_proj_dim=32,
        vocab_size=VOCAB, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, bos_token_id=0,
        eos_token_id=0, pad_token_id=1,
    ),
    "mixtral": lambda: transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
        eos_token_id=0, pad_token_id=0,
    ),
    "qwen2-moe": lambda: transformers.Qwen2MoeConfig(
        hidden_size=32, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
}  # fmt: skip


#: The keyword inputs every zoo model is captured with: logits alone, no key-value cache.
KWARGS = {"use_cache": False}
_PLANS: dict[tuple[str, int], tuple[torch.nn.Module, Any]] = {}
#: The test session's folder of zoo plans, shared by its workers (set by tests/conftest.py; see [Note: zoo plans
#: are made once per test session]).
PLANS_ENV = "HINTPIPE_TEST_ZOO_PLANS"

# [Note: zoo plans are made once per test session]
# A zoo model's capture costs seconds of CPU (torch.export), and test_zoo_stages and test_zoo_autocast plan all
# eleven architectures alike, on other workers of the same session when pytest-xdist runs them. So a plan is
# saved, with its model in one pickle, to the session's folder the first time any worker makes it, and every
# test process, the maker too, takes it from that file: each test sees the plan as a rank receives one (pickled:
# the captured graph re-traced from its code), whichever worker made it. The folder belongs to one session (the
# code under test cannot change within it), so the name and the stages are all that determine a plan. A file is
# written whole, then renamed into place; a worker that finds another planning the same model waits for its
# file (no CPU), within a bound, and plans it itself past that.


def planned(name: str, stages: int) -> tuple[torch.nn.Module, Any]:
    """Architecture ``name`` from its config (weights from seed 0) and its plan into ``stages`` stages from a real
    profile, made once per test session (several test files share it), on a batch of 2 rows of 9 ids."""
    if (name, stages) not in _PLANS:
        folder = os.environ.get(PLANS_ENV)
        _PLANS[name, stages] = _made(name, stages) if folder is None else _shared(Path(folder), name, stages)
    return _PLANS[name, stages]


def _made(name: str, stages: int) -> tuple[torch.nn.Module, Any]:
    from hintpipe.planner.plan import plan

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(ARCHITECTURES[name]())  # type: ignore[no-untyped-call]
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    return model, plan(model, ids, ranks=stages, microbatches=stages, repeats=1, kwargs=KWARGS)


def _shared(folder: Path, name: str, stages: int) -> tuple[torch.nn.Module, Any]:
    """The plan from the session's folder, made and saved there first if no process has."""
    from conftest import allow  # here: a run's ranks import this module for ``hf_zoo:user_model``

    path = folder / f"{name}-{stages}.pt"
    try:
        claim = os.open(folder / f"{path.name}.making", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:  # another process makes it: wait for its file
        deadline = time.monotonic() + allow(300)
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if path.exists():
            return _load(path)
        return _made(name, stages)
    os.close(claim)
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    torch.save(_made(name, stages), partial)
    os.replace(partial, path)
    return _load(path)


def _load(path: Path) -> tuple[torch.nn.Module, Any]:
    loaded: tuple[torch.nn.Module, Any] = torch.load(path, weights_only=False)
    return loaded


def corpus(path: Path) -> Path:
    """A small plain-text corpus (documents separated by blank lines)."""
    words = ["pipeline", "stage", "rank", "tensor", "model", "token", "batch", "step", "loss", "grad"]
    documents = [" ".join(words[(i * 7 + j) % len(words)] for j in range(8 + i % 13)) for i in range(120)]
    path.write_text("\n\n".join(documents) + "\n")
    return path


def save_tokenizer(folder: Path, text_file: Path) -> int:
    """A BPE tokenizer trained on ``text_file``, saved into ``folder`` as ``save_pretrained`` does; returns its
    vocabulary (at most :data:`VOCAB`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([str(text_file)], trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")  # type: ignore[no-untyped-call]
    fast.save_pretrained(folder)
    return len(fast)


def save_model(name: str, folder: Path, text_file: Path, *, seed: int = 0) -> Path:
    """Architecture ``name`` with weights from ``seed``, saved into ``folder`` with a tokenizer."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(ARCHITECTURES[name]())  # type: ignore[no-untyped-call]
    model.save_pretrained(folder)
    save_tokenizer(folder, text_file)
    return folder


class UserLM(torch.nn.Module):
    """A user's own module: a Hugging Face Llama body under a head of its own, tied to the body's embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.body = transformers.LlamaModel(ARCHITECTURES["llama"]())
        self.head = torch.nn.Linear(32, VOCAB, bias=False)
        self.head.weight = self.body.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.body(ids, use_cache=False).last_hidden_state
        logits: torch.Tensor = self.head(hidden)
        return logits


def mean_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def user_model() -> tuple[torch.nn.Module, torch.Tensor, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """``--model hf_zoo:user_model``: the user's module, an example batch of ids and the loss."""
    torch.manual_seed(0)
    return UserLM(), torch.zeros(2, 32, dtype=torch.int64), mean_token_loss
