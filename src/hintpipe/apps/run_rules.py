"""The rules between a run's fields, checked once, when its :class:`~hintpipe.apps.training.TrainConfig` is made.

A field's own range is its option's (:mod:`hintpipe.options`); what two fields must say together is here:
checkpoint settings without a folder, a fault that needs a save, a device the machine lacks. Before, the command
line checked these alone, so that ``TrainConfig(resume=True)`` without a folder trained afresh, saying nothing.
Each message names the fields as the caller wrote them (keywords in Python, flags on the command line, which
builds its config within :func:`~hintpipe.option.said_as_flags`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hintpipe.modes import TransportChoice
from hintpipe.option import said
from hintpipe.runtime.injection import Injection


class RunFields(Protocol):
    """The fields of a run the rules read (a :class:`~hintpipe.apps.training.TrainConfig`'s)."""

    @property
    def checkpoint_dir(self) -> str | None: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def resume(self) -> bool: ...
    @property
    def replace_checkpoints(self) -> bool: ...
    @property
    def group_readable(self) -> bool: ...
    @property
    def injection(self) -> Injection: ...
    @property
    def device(self) -> Any: ...
    @property
    def transport(self) -> TransportChoice: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def steps(self) -> int: ...


def check_run_rules(config: RunFields) -> None:
    """Refuse fields that contradict each other, in one line naming them.

    Raises:
        ValueError: the first rule broken.
    """
    _check_checkpointing(config)
    _check_device(config)
    if config.warmup_steps > config.steps:  # see [Note: a resume keeps the schedule] in hintpipe.apps.lr_schedule
        warmup, steps = said("warmup_steps"), said("steps")
        raise ValueError(
            f"{warmup} {config.warmup_steps} is more than {steps} {config.steps}: the warm-up would never end; use "
            f"{warmup} {config.steps} or fewer"
        )


def _check_checkpointing(config: RunFields) -> None:
    if config.checkpoint_dir is None:
        flags = ("resume", "replace_checkpoints", "checkpoint_every", "group_readable")
        given = [said(name) for name in flags if getattr(config, name)]
        if given:
            needs = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{' and '.join(given)} {needs} {said('checkpoint_dir')}")
    elif config.resume and config.replace_checkpoints:
        raise ValueError(
            f"{said('resume')} continues the folder's run, {said('replace_checkpoints')} deletes it: give one"
        )
    injection = config.injection
    if (injection.save_failures or injection.save_stops) and not (config.checkpoint_dir and config.checkpoint_every):
        raise ValueError(
            f"{said('faults')} savefail and savestop need {said('checkpoint_dir')} and {said('checkpoint_every')}"
        )


def _check_device(config: RunFields) -> None:
    nccl = config.transport is TransportChoice.NCCL
    if config.device == "cpu" and not nccl:
        return
    cuda = torch.cuda.is_available()
    if config.device == "cuda" and not cuda:
        raise ValueError(f"{said('device')} cuda was asked for, but torch.cuda.is_available() is False on this machine")
    if nccl and (config.device == "cpu" or not cuda):
        raise ValueError(
            f"{said('transport')} nccl moves tensors between GPUs; it needs {said('device')} cuda on a machine "
            "with CUDA"
        )
