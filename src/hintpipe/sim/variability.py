"""Variability models, parsed from short specs, shared by the simulator and the runtime.

=============================  ===============================================
``iid:SIGMA``                  every task's cost times an independent
                               lognormal factor with mean 1
``mb:SIGMA``                   one lognormal factor (mean 1) per micro-batch,
                               the same on every stage: variable sequence length
``straggler:FACTOR[:STAGE[:FIRST:LAST]]``
                               one stage runs FACTOR times slower for the
                               micro-batches FIRST..LAST (inclusive); stage and
                               window default to a seeded random stage and a
                               random quarter of the micro-batches
``comm:LATENCY[:JITTER]``      every message between ranks takes LATENCY plus
                               an exponential extra with mean JITTER: bare
                               numbers in cost units (the simulator), or times
                               with a unit, ``comm:2ms:1ms`` (the runtime)
``tp:MEMBERS:SIGMA[:DECISION]`` simulator only: every stage is split over
                               MEMBERS tensor-parallel ranks, each with its
                               own lognormal factor (mean 1) per task; a task
                               takes the slowest member's time, plus DECISION
                               (the leader's announcement) under greedy and
                               ready, which coordinate (fixed does not)
=============================  ===============================================

The words mean the same in ``hintpipe simulate --variability`` and ``hintpipe
train --inject``: a task whose cost is ``t`` costs ``X t`` (see
:mod:`hintpipe.runtime.faults` for how the runtime realises that).
Sampling is seeded, so policies can be compared on identical costs.
This module is torch-free.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from hintpipe.spec import Spec, SpecError, quantity


@dataclasses.dataclass(frozen=True)
class IidNoise:
    sigma: float


@dataclasses.dataclass(frozen=True)
class MicrobatchNoise:
    sigma: float


@dataclasses.dataclass(frozen=True)
class Straggler:
    factor: float
    stage: int | None = None
    first: int | None = None
    last: int | None = None


@dataclasses.dataclass(frozen=True)
class CommDelay:
    """Message delay: ``latency`` plus an exponential extra with mean ``jitter``,
    in seconds when ``in_seconds`` (the runtime), else in cost units (the simulator)."""

    latency: float
    jitter: float = 0.0
    in_seconds: bool = False


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """Stages split over ``members`` ranks: a task waits for the slowest; ``decision`` in cost units."""

    members: int
    sigma: float
    decision: float = 0.0


Variability = IidNoise | MicrobatchNoise | Straggler | CommDelay | TensorParallel

_USAGE = (
    "iid:SIGMA, mb:SIGMA, straggler:FACTOR[:STAGE[:FIRST:LAST]], comm:LATENCY[:JITTER] or tp:MEMBERS:SIGMA[:DECISION]"
)
__all__ = ["SpecError", "parse_variability"]


_KIND = "variability"


def parse_variability(text: str, *, seconds: bool = False) -> Variability:
    """Parse one spec (see the module docstring).

    Args:
        text: the spec.
        seconds: whether message delays are times (the runtime) rather than
            cost units (the simulator).

    Raises:
        SpecError: naming the spec and what is wrong with it.
    """
    spec = Spec.split(text)
    if spec.word in ("iid", "mb"):
        spec.expect((1,), f"{spec.word}:SIGMA", _KIND)
        sigma = spec.number(0, "SIGMA", kind=_KIND)
        return IidNoise(sigma) if spec.word == "iid" else MicrobatchNoise(sigma)
    if spec.word == "straggler":
        spec.expect((1, 2, 4), "straggler:FACTOR[:STAGE[:FIRST:LAST]]", _KIND)
        factor = spec.number(0, "FACTOR", minimum=1.0, kind=_KIND)
        stage = spec.integer(1, "STAGE", kind=_KIND) if len(spec.args) >= 2 else None
        first = last = None
        if len(spec.args) == 4:
            first, last = spec.integer(2, "FIRST", kind=_KIND), spec.integer(3, "LAST", kind=_KIND)
            if last < first:
                raise spec.fail(f"LAST {last} is before FIRST {first}", _KIND)
        return Straggler(factor, stage, first, last)
    if spec.word == "comm":
        spec.expect((1, 2), "comm:LATENCY[:JITTER]", _KIND)
        parts = [quantity(spec, i, name, _KIND) for i, name in enumerate(("LATENCY", "JITTER")[: len(spec.args)])]
        if any(is_time != seconds for _, is_time in parts):
            fix = "a time with a unit, e.g. comm:2ms" if seconds else "cost units, a bare number such as comm:0.2"
            where = "the runtime delays messages in time" if seconds else "the simulator counts in cost units"
            raise spec.fail(f"{where}: write {fix}", _KIND)
        return CommDelay(parts[0][0], parts[1][0] if len(parts) == 2 else 0.0, seconds)
    if spec.word == "tp":
        spec.expect((2, 3), "tp:MEMBERS:SIGMA[:DECISION]", _KIND)
        members = spec.integer(0, "MEMBERS", minimum=1, kind=_KIND)
        decision = spec.number(2, "DECISION", kind=_KIND) if len(spec.args) == 3 else 0.0
        return TensorParallel(members, spec.number(1, "SIGMA", kind=_KIND), decision)
    raise spec.fail(f"unknown model {spec.word!r}; use {_USAGE}", _KIND)


def decision_latency(models: list[Variability]) -> float:
    """What one tensor-parallel decision adds to each task under a coordinating policy (cost units)."""
    return sum(m.decision for m in models if isinstance(m, TensorParallel))


def comm_delay(models: list[Variability]) -> CommDelay:
    """The combined message delay (latencies and jitters add up)."""
    comms = [m for m in models if isinstance(m, CommDelay)]
    seconds = any(c.in_seconds for c in comms)
    return CommDelay(sum(c.latency for c in comms), sum(c.jitter for c in comms), seconds)


def mean_one_lognormal(rng: np.random.Generator, sigma: float, size: tuple[int, ...]) -> npt.NDArray[np.float64]:
    """Lognormal factors with mean 1 (``mu = -sigma^2 / 2``): noise that scales costs
    without changing their expectation. The one definition every caller uses."""
    if sigma == 0.0:
        return np.ones(size)
    return rng.lognormal(mean=-0.5 * sigma * sigma, sigma=sigma, size=size)


def sample_costs(
    expected: npt.NDArray[np.float64],
    models: list[Variability],
    rng: np.random.Generator,
) -> npt.NDArray[np.float64]:
    """Costs ``[stage, mb, kind]`` drawn around ``expected`` under ``models``.

    Raises:
        SpecError: if a straggler names a stage or micro-batch that does not exist.
    """
    stages, mbs, _ = expected.shape
    costs = expected.copy()
    for model in models:
        if isinstance(model, IidNoise):
            costs *= mean_one_lognormal(rng, model.sigma, costs.shape)
        elif isinstance(model, MicrobatchNoise):
            costs *= mean_one_lognormal(rng, model.sigma, (1, mbs, 1))
        elif isinstance(model, Straggler):
            stage, first, last = straggler_window(model, stages, mbs, rng)
            costs[stage, first : last + 1, :] *= model.factor
        elif isinstance(model, TensorParallel):  # the slowest member sets the pace
            costs *= mean_one_lognormal(rng, model.sigma, (model.members, *costs.shape)).max(axis=0)
    return costs


def straggler_window(model: Straggler, stages: int, mbs: int, rng: np.random.Generator) -> tuple[int, int, int]:
    """``(stage, first, last)`` of a straggler: as given, or drawn from ``rng``.

    Raises:
        SpecError: if the straggler names a stage or micro-batch that does not exist.
    """
    stage = int(rng.integers(stages)) if model.stage is None else model.stage
    if stage >= stages:
        raise SpecError(f"straggler stage {stage} does not exist: the pipeline has {stages} stages")
    if model.first is None or model.last is None:
        width = max(1, mbs // 4)
        first = int(rng.integers(mbs - width + 1))
        return stage, first, first + width - 1
    if model.last >= mbs:
        raise SpecError(f"straggler window {model.first}..{model.last} exceeds the {mbs} micro-batches")
    return stage, model.first, model.last


def sample_message_delays(comm: CommDelay, count: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """``count`` message delays: latency plus exponential jitter."""
    if comm.jitter == 0.0:
        return np.full(count, comm.latency)
    return comm.latency + rng.exponential(comm.jitter, size=count)
