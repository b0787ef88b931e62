"""The rules between a run's model and its options: what the model, its data and its parallelism can honour.

[Note: the model's rules are the config's]
These were the command line's alone (``hintpipe train``'s checks before any rank starts), so that the same run
made in Python, ``TrainConfig(model=ModelConfig("gpt-mini"), tp=3)`` or ``seq_len_dist=SeqLenDist(5000)`` on a
model whose positions end at 255, was taken as it was and failed later in every rank (or, for a fault in a step
the run never reaches, not at all). Each rule is now one function here that
:class:`~hintpipe.apps.train_config.TrainConfig` calls as it is made, and only it: the command line makes its
config before the expensive parts (the plan, the sequence cost; the data's preparation is the command line's,
with its progress bar, and comes first, since a built-in model's vocabulary is the data's), within
:func:`~hintpipe.option.said_as_flags`, so that one rule names ``--tp`` there and ``tp`` in Python. Before, the
command line called each rule itself too, earlier, and the config again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.model_spec import ModelSpec
from hintpipe.forming.form import Forming
from hintpipe.option import said, said_as_flags_now
from hintpipe.runtime.injection import Injection
from hintpipe.units import format_size


def check_tensor_parallel(tp: int, spec: ModelSpec, *, planned: bool) -> None:
    """Refuse ``tp`` above 1 for a model without a tensor-parallel plan, or for the stages of a plan."""
    if tp > 1 and (not spec.tensor_parallel or planned):
        raise ValueError(
            f"{said('tp')} has a tensor-parallel plan for the built-in gpt-mini only (not {said('plan')} or other "
            "models)"
        )


def check_model_options(
    model: ModelConfig,
    data: str | tuple[str, ...],
    tp: int,
    forming: Forming,
    injection: Injection,
    steps: int,
    eval_data: str | tuple[str, ...] | None = None,
) -> None:
    """Refuse options the model, the data or the run cannot honour: faults in steps the run never reaches, a
    tensor-parallel size that does not divide the heads, text (to train or to evaluate on) for a model that reads
    none, forming without documents, packing for a model without document masks."""
    if injection.steps and max(injection.steps) >= steps:
        raise ValueError(
            f"{said('faults')} names step {max(injection.steps)}, the run has steps 0..{steps - 1}: it would never fire"
        )
    if tp > 1 and model.heads % tp:
        raise ValueError(f"{said('tp')} {tp} must divide {model.label}'s {model.heads} attention heads")
    if data != "synthetic" and not model.spec.reads_text:
        raise ValueError(f"{said_data(data)} is text: use a language model (gpt-mini, hf-gpt2, a model folder)")
    if eval_data is not None and not model.spec.reads_text:
        raise ValueError(
            f"{said_data(eval_data, 'eval_data')} is text: use a language model (gpt-mini, hf-gpt2, a model folder)"
        )
    if forming is not Forming.CROP and data == "synthetic":
        whole = "whole documents" if forming.by_cost else "documents end to end"
        raise ValueError(
            f"{said('forming')} {forming} forms micro-batches from {whole}: use it with {said('data')} "
            f"stdlib or {said('data')} PATH"
        )
    if forming is Forming.PACKED and not model.spec.document_masks:
        raise ValueError(
            f"{said('forming')} packed needs a model that takes document masks (gpt-mini), not {model.label}; "
            f"{said('forming')} concat lays documents end to end without masks, for any model"
        )


def said_data(data: str | tuple[str, ...], option: str = "data") -> str:
    """The run's data (or its ``option``'s, ``eval_data``) as the caller gave it: ``--data a.txt --data b.txt``
    on the command line, ``data 'stdlib'`` or ``data ('a.txt', 'b.txt')`` in Python."""
    if said_as_flags_now():
        return " ".join(f"{said(option)} {entry}" for entry in ((data,) if isinstance(data, str) else data))
    return f"{said(option)} {data!r}"


def check_vocabulary(
    model: ModelConfig, data: str | tuple[str, ...], tokenizer: str, data_vocab: int | None, option: str = "data"
) -> None:
    """Refuse data (given as ``option``) whose token ids (up to ``data_vocab`` - 1, by ``tokenizer``) reach past
    the model's vocabulary, advising what fixes it for this kind of model: a larger vocabulary for a built-in one;
    another tokenizer, or the model resized, for a folder's or a factory's, whose vocabulary is its own (its
    embedding would be indexed past its end). Checked before the model is planned."""
    if data_vocab is None or model.vocab >= data_vocab:
        return
    if model.source is None:
        fix = f"--vocab {data_vocab}" if said_as_flags_now() else f"ModelConfig(vocab={data_vocab})"
    elif model.spec.resize:
        fix = (
            f"a tokenizer of at most {model.vocab} ids, or the model resized to hold them "
            f"({model.spec.resize.format(vocab=data_vocab)})"
        )
    else:
        fix = f"a tokenizer of at most {model.vocab} ids, or a model of {data_vocab} or more"
    raise ValueError(
        f"{said_data(data, option)} has token ids up to {data_vocab - 1} ({said('tokenizer')} {tokenizer}); "
        f"{model.label}'s vocabulary is {model.vocab}: use {fix}"
    )


def check_sequence_lengths(model: ModelConfig, data: str | tuple[str, ...], lengths: SeqLenDist) -> None:
    """Refuse counting text (``data`` synthetic) whose mean length is past the model's last position."""
    last = model.max_seq_len - 1
    if model.spec.reads_text and data == "synthetic" and lengths.mean > last:
        fits = dataclasses.replace(lengths, mean=last)
        fix = str(fits) if said_as_flags_now() else repr(fits)
        raise ValueError(
            f"{said('seq_len_dist')} {lengths}: {model.label}'s positions end at {last} tokens; use a mean of at "
            f"most {last} ({said('seq_len_dist')} {fix})"
        )


def check_activation_budgets(
    budgets: Sequence[float], model: ModelConfig, rows: int, tokens: float, precision: str
) -> None:
    """Refuse an activation budget below one micro-batch's hidden states: what any stage keeps of a micro-batch
    in flight at the least (the hint holds several), so that no rank could ever run."""
    per_value = 4 if precision == "fp32" else 2
    length = tokens if model.spec.reads_text else 1
    floor = rows * length * model.hidden * per_value
    low = min(budgets)
    if low < floor:
        shape = f"{rows} x {tokens:g} tokens x {model.hidden}" if model.spec.reads_text else f"{rows} x {model.hidden}"
        raise ValueError(
            f"{said('activation_budget')} {format_size(low)} is below one micro-batch's hidden states, "
            f"{format_size(floor)} ({shape} values of {per_value} bytes), which every stage keeps while a "
            "micro-batch is in flight; give several times that (the hint holds several micro-batches), or leave "
            "it out"
        )


def layers_and_parameters(model: ModelConfig) -> tuple[int, int]:
    """The layers a built-in list-of-layers model makes (its ``layers`` blocks and its own: an embedding, a head)
    and its parameters, without building it: its models of one and of two blocks are made on the ``meta``
    device (sized, never allocated), and the whole model follows from them, as each block adds like layers."""
    from hintpipe.apps.models import meta_layers

    one, two = (meta_layers(dataclasses.replace(model, layers=n)) for n in (1, 2))
    sizes = [sum(p.numel() for layer in built for p in layer.parameters()) for built in (one, two)]
    layers = len(one) + (len(two) - len(one)) * (model.layers - 1)
    return layers, sizes[0] + (sizes[1] - sizes[0]) * (model.layers - 1)


def check_layer_count(model: ModelConfig, layers: int, stages: int) -> None:
    """Refuse a list of ``layers`` too short for the ``stages``, advising the ``layers`` that fills them."""
    if layers >= stages:
        return
    extra = layers - model.layers
    beside = f" ({model.layers} and {extra} more of {model.name}'s own)" if extra else ""
    raise ValueError(
        f"{said('layers')} {model.layers} makes {layers} layers{beside}, too few for {stages} stages; use "
        f"{said('layers')} {stages - extra} or more, or fewer stages"
    )
