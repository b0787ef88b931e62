"""What a model folder must be for hintpipe to fine-tune it: its weights, all of them, of a causal language model.

[Note: a folder holds a causal language model]
``AutoModelForCausalLM.from_pretrained`` builds its model type's causal language model from any folder of that
type, and says what does not fit in log lines a run's output buries:

- a ``LlamaForSequenceClassification``'s folder loads as ``LlamaForCausalLM``, its classifier's ``score.weight``
  dropped ("unexpected") and, where the head is not tied to the embedding, ``lm_head.weight`` drawn at random
  ("missing"): the run fine-tuned a model of which part was never trained, from a folder it read as pretrained;
- a ``LlamaModel``'s (no head) likewise, and a folder short of a shard's tensors;
- a ``BertForMaskedLM``'s loads whole, as ``BertLMHeadModel``, whose attention sees every position unless its
  config says ``is_decoder``: each position sees the token it is to predict, and the loss falls towards nothing
  while the model learns nothing of next-token prediction.

So a folder's model is refused, in one line saying what it is, when its weights leave a tensor of the causal
model unfilled, or when it was saved from another head whose weights the causal model drops
(:func:`check_loaded`); and when a position's logits change with a later token (:func:`check_causal`, one
forward of a few tokens twice, on the model as built: any architecture, whatever its config says). Tensors a
causal model's own folder holds beyond it are taken: the hub's GPT-2 keeps each block's ``attn.masked_bias``
buffer, which ``from_pretrained`` reports unused, and it is the model every GPT-2 fine-tune starts from.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hintpipe.planner.state_kept import state_kept

#: The tokens of :func:`check_causal`'s probe.
_PROBE = 8


def check_loaded(folder: str, saved: str, built: str, info: dict[str, Any]) -> None:
    """Refuse weights that leave a tensor of the causal model ``built`` unfilled, or that another head's class
    ``saved`` (the class the folder was saved from, as its config names it) holds beside it (``info``:
    ``from_pretrained``'s ``output_loading_info``).

    Raises:
        ValueError: naming the tensors missing (drawn at random) or unused (another head's), and the fix.
    """
    missing, unused = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    causal = saved == built or saved.endswith(("ForCausalLM", "LMHeadModel"))
    if not missing and (causal or not unused):
        return
    said = "; ".join(
        f"{what} {', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
        for what, names in (("it lacks", missing), ("it holds", unused))
        if names
    )
    raise ValueError(
        f"--model {folder} holds a {saved}, not the weights of {built} ({said}): hintpipe fine-tunes a causal "
        "language model from all of its weights; give the folder of a causal LM's save_pretrained, or --init random"
    )


def check_causal(model: nn.Module, folder: str, vocab: int, positions: int, kwargs: dict[str, Any]) -> None:
    """Refuse a model whose logits at a position change with a later token: one that sees what it is to predict.

    Raises:
        ValueError: naming the folder and what to change.
    """
    length = max(2, min(_PROBE, positions))
    ids = torch.arange(1, length + 1).remainder(vocab).unsqueeze(0)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % vocab
    training = model.training
    model.eval()  # dropout off: the two forwards differ by the last token alone
    try:  # a model that changes itself in eval mode (RWKV) put back: [Note: a probe leaves the model as it was]
        with torch.no_grad(), state_kept(model):
            first, second = (_logits(model(x, **kwargs)) for x in (ids, changed))
    except Exception as exc:  # the model's own code, whatever it raises: said in a line, not a traceback
        message = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(
            f"--model {folder}: its own forward fails on {length} tokens, before hintpipe cuts it: "
            f"{type(exc).__name__}: {message}; check the folder's config.json (its sizes agree?) with "
            "AutoModelForCausalLM.from_pretrained(folder)(ids)"
        ) from exc
    finally:
        model.train(training)
    if not torch.allclose(first[:, :-1], second[:, :-1], rtol=1e-4, atol=1e-5):
        raise ValueError(
            f"--model {folder} is not a causal language model: its logits at one position change with a later token "
            "(its attention sees the tokens it is to predict; a BERT-like model wants is_decoder in its config.json)"
        )


def _logits(output: Any) -> torch.Tensor:
    """A model's logits from what its forward returns (a Hugging Face output, or a tuple whose first is)."""
    found = getattr(output, "logits", None)
    if found is None:
        found = output[0] if isinstance(output, tuple) else output
    assert isinstance(found, torch.Tensor)
    return found
