"""The run's model as the ranks need it beyond their stages: described for the checkpoints (with the tokenizer
the run read its data with), what rank 0 measured shared with every rank, and the whole model that
``--check-grads`` compares with."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
import torch.distributed as dist

from hintpipe.apps.model_description import describe_model
from hintpipe.apps.model_spec import tokenizer_of
from hintpipe.apps.models import build_layers, split_layers, whole_model
from hintpipe.apps.text_files import BYTES
from hintpipe.apps.train_config import TrainConfig
from hintpipe.data.tokenizer_record import tokenizer_record
from hintpipe.runtime.checkpoint.description import HF


def run_description(config: TrainConfig) -> dict[str, Any] | None:
    """The model's description for the run's checkpoints, with the tokenizer the run used where it is a folder
    (``--tokenizer``, or a model folder's own): ``hintpipe export`` hands it on.

    A plan's model is described as the plan says (a Hugging Face model's class and config, the one planned),
    and with its ModelConfig where the config's model is the planned one; a plan of another model given in
    Python beside a built-in ModelConfig is not described (None: ``hintpipe export`` says to export it by
    hand) rather than described as the model it is not."""
    planned = config.plan.hf_model if config.plan is not None else None
    if config.plan is not None and not config.model.spec.planned and planned is None:
        return None
    if planned is None:
        description = describe_model(config.model)
    else:  # the planned model itself (a folder it came from may be gone: --plan FILE needs none)
        architecture, said = planned
        description = {"kind": HF, "architecture": architecture, "config": json.loads(said)}
        if config.model.spec.planned:
            description["hintpipe_model"] = dataclasses.asdict(config.model)
    folder = config.data.tokenizer if config.data.tokenizer != BYTES else None
    if folder is None and config.model.spec.own_tokenizer and config.model.source is not None:
        folder = tokenizer_of(config.model.source)
    if folder is not None:
        description["tokenizer"] = tokenizer_record(folder)
    return description


def share_measured(config: TrainConfig) -> TrainConfig:
    """``config`` with rank 0's plan, sequence cost and emulated costs (call on every rank of the default group):
    under ``torchrun`` only rank 0 measures and plans (see [Note: plan once] in :mod:`hintpipe.cli.train_model`)."""
    box: list[Any] = [
        (config.plan, config.data.sequence_cost, config.pipeline.emulate) if dist.get_rank() == 0 else None
    ]
    dist.broadcast_object_list(box, src=0)
    plan, cost, emulate = box[0]
    return config.replaced(plan=plan, sequence_cost=cost, emulate=emulate, shared=False)


#: A whole model and the keyword inputs of every call of it.
Whole = tuple[torch.nn.Module, dict[str, Any]]


def unsplit_model(config: TrainConfig) -> Whole:
    """The whole model as its source builds it (a folder's, a factory's, a built-in Hugging Face model), holding
    the plan's starting weights: the reference ``--check-grads`` runs for a planned model.

    Raises:
        ValueError: the plan holds tensors the model has no name for (it was planned for another model).
    """
    assert config.plan is not None
    model, kwargs = whole_model(config.model)
    # The parameters only: the plan's module also holds the buffers a model does not save (rotary frequencies).
    planned = dict(config.plan.graph.module.named_parameters())
    missing, unexpected = model.load_state_dict(planned, strict=False)
    if unexpected:
        raise ValueError(f"--check-grads: the plan holds tensors the model does not have: {sorted(unexpected)[:3]}")
    del missing  # a tied tensor's other names, filled by the tie
    return model.train(), kwargs


def unsplit_stages(config: TrainConfig) -> list[torch.nn.Module]:
    """The built-in model's stages as every rank builds them before any sharding or tensor parallelism: the
    reference ``--check-grads`` runs unsplit, on one process."""
    return split_layers(build_layers(config.model), config.resolved_hint.stages)
