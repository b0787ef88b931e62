"""Runtime variability models for the simulator, parsed from short specs.

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
                               an exponential extra with mean JITTER
=============================  ===============================================

Sampling is seeded, so policies can be compared on identical costs.
This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt


class SpecError(ValueError):
    """A ``--variability`` (or ``--inject``) spec that cannot be parsed."""


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
    latency: float
    jitter: float = 0.0


Variability = IidNoise | MicrobatchNoise | Straggler | CommDelay

_USAGE = "iid:SIGMA, mb:SIGMA, straggler:FACTOR[:STAGE[:FIRST:LAST]] or comm:LATENCY[:JITTER]"


def _number(spec: str, text: str, what: str, *, minimum: float = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"bad variability {spec!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise SpecError(f"bad variability {spec!r}: {what} must be a finite number >= {minimum:g}")
    return value


def _integer(spec: str, text: str, what: str) -> int:
    if not text.isdigit():
        raise SpecError(f"bad variability {spec!r}: {what} {text!r} is not a non-negative integer")
    return int(text)


def parse_variability(spec: str) -> Variability:
    """Parse one spec (see the module docstring).

    Raises:
        SpecError: naming the spec and what is wrong with it.
    """
    name, _, rest = spec.strip().partition(":")
    args = rest.split(":") if rest else []
    if name in ("iid", "mb"):
        if len(args) != 1:
            raise SpecError(f"bad variability {spec!r}: expected {name}:SIGMA")
        sigma = _number(spec, args[0], "SIGMA")
        return IidNoise(sigma) if name == "iid" else MicrobatchNoise(sigma)
    if name == "straggler":
        if len(args) not in (1, 2, 4):
            raise SpecError(f"bad variability {spec!r}: expected straggler:FACTOR[:STAGE[:FIRST:LAST]]")
        factor = _number(spec, args[0], "FACTOR", minimum=1.0)
        stage = _integer(spec, args[1], "STAGE") if len(args) >= 2 else None
        first = last = None
        if len(args) == 4:
            first = _integer(spec, args[2], "FIRST")
            last = _integer(spec, args[3], "LAST")
            if last < first:
                raise SpecError(f"bad variability {spec!r}: LAST {last} is before FIRST {first}")
        return Straggler(factor, stage, first, last)
    if name == "comm":
        if len(args) not in (1, 2):
            raise SpecError(f"bad variability {spec!r}: expected comm:LATENCY[:JITTER]")
        latency = _number(spec, args[0], "LATENCY")
        jitter = _number(spec, args[1], "JITTER") if len(args) == 2 else 0.0
        return CommDelay(latency, jitter)
    raise SpecError(f"bad variability {spec!r}: unknown model {name!r}; use {_USAGE}")


def comm_delay(models: list[Variability]) -> CommDelay:
    """The combined message delay (latencies and jitters add up)."""
    comms = [m for m in models if isinstance(m, CommDelay)]
    return CommDelay(sum(c.latency for c in comms), sum(c.jitter for c in comms))


def _lognormal(rng: np.random.Generator, sigma: float, size: tuple[int, ...]) -> npt.NDArray[np.float64]:
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
            costs *= _lognormal(rng, model.sigma, costs.shape)
        elif isinstance(model, MicrobatchNoise):
            costs *= _lognormal(rng, model.sigma, (1, mbs, 1))
        elif isinstance(model, Straggler):
            stage = int(rng.integers(stages)) if model.stage is None else model.stage
            if stage >= stages:
                raise SpecError(f"straggler stage {stage} does not exist: the pipeline has {stages} stages")
            if model.first is None or model.last is None:
                width = max(1, mbs // 4)
                first = int(rng.integers(mbs - width + 1))
                last = first + width - 1
            else:
                first, last = model.first, model.last
                if last >= mbs:
                    raise SpecError(f"straggler window {first}..{last} exceeds the {mbs} micro-batches")
            costs[stage, first : last + 1, :] *= model.factor
    return costs


def sample_message_delays(comm: CommDelay, count: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """``count`` message delays: latency plus exponential jitter."""
    if comm.jitter == 0.0:
        return np.full(count, comm.latency)
    return comm.latency + rng.exponential(comm.jitter, size=count)
