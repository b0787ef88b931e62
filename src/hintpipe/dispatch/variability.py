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
``mm:SIGMA_ENC:SIGMA_DEC[:FRACTION[:RHO]]``
                               a multimodal model: the first FRACTION of the
                               stages (default 0.25) are an encoder whose cost
                               per micro-batch has its own lognormal factor
                               (SIGMA_ENC: image count), the rest a decoder
                               with another (SIGMA_DEC: text length), both
                               mean 1, correlated by RHO (default 0; -0.8:
                               image-heavy samples carry short text)
``tp:MEMBERS:SIGMA[:DECISION]`` simulator only: every stage is split over
                               MEMBERS tensor-parallel ranks, each with its
                               own lognormal factor (mean 1) per task; a task
                               takes the slowest member's time, plus DECISION
                               (the leader's announcement) under greedy and
                               ready, which coordinate (fixed does not)
``moe:EXPERTS:TOPK[:SKEW[:SHARE]]``
                               simulator only: every stage is a
                               mixture-of-experts layer whose tokens each go
                               to TOPK of EXPERTS experts; per stage and
                               micro-batch the experts' loads are drawn (SKEW,
                               default 0.5) and the SHARE of the stage's cost
                               in its experts (default 1) takes the busiest
                               expert's load over the balanced one (see
                               [Note: expert load])
=============================  ===============================================

The words mean the same in ``hintpipe simulate --variability`` and ``hintpipe
train --inject``: a task whose cost is ``t`` costs ``X t`` (see
:mod:`hintpipe.runtime.faults` for how the runtime realises that).
Sampling is seeded, so policies can be compared on identical costs.
This module is torch-free.

[Note: expert load]
A mixture-of-experts layer sends each token to its TOPK best-scored of EXPERTS experts; the experts run
in parallel (expert parallelism, each on its own devices), so the layer lasts as long as its busiest. With
every expert given the same number of tokens, each holds 1 / EXPERTS of the token-to-expert assignments
(the balanced load). A micro-batch's content makes some experts popular: per stage and micro-batch each
expert's popularity is a lognormal factor with mean 1 and sigma SKEW, and its share of the assignments
follows its popularity, capped at 1 / TOPK (a token counts once per expert: an expert can take every
token, never more); what the cap cuts goes to the others by their popularity. The stage's cost is
``(1 - SHARE) + SHARE x busiest share x EXPERTS`` times its expected cost, on F, B and W alike (backward
follows the forward's routing), so the factor lies in [1, 1 - SHARE + SHARE x EXPERTS / TOPK]: 1 with
SKEW 0 (loads balanced) or TOPK = EXPERTS (every token to every expert). The loads are not known when
the batch is loaded (the router decides in the forward), so they leave the micro-batches' sizes alone.
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
class Multimodal:
    """An encoder (the first ``fraction`` of the stages) and a decoder, each with its own
    per-micro-batch lognormal factor (mean 1); ``rho`` correlates their logarithms."""

    sigma_encoder: float
    sigma_decoder: float
    fraction: float = 0.25
    rho: float = 0.0

    def encoder_stages(self, stages: int) -> int:
        """How many leading stages are the encoder: the nearest whole share, at least one,
        and one fewer than all when there are two stages or more (a decoder too)."""
        return max(1, min(stages - 1, round(self.fraction * stages))) if stages > 1 else 1


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


@dataclasses.dataclass(frozen=True)
class ExpertLoad:
    """Mixture-of-experts routing: ``topk`` of ``experts`` experts per token, expert popularity lognormal with
    sigma ``skew`` per stage and micro-batch, ``share`` of a stage's cost in its experts (see
    [Note: expert load])."""

    experts: int
    topk: int
    skew: float = 0.5
    share: float = 1.0


Variability = IidNoise | MicrobatchNoise | Multimodal | Straggler | CommDelay | TensorParallel | ExpertLoad

_USAGE = (
    "iid:SIGMA, mb:SIGMA, mm:SIGMA_ENC:SIGMA_DEC[:FRACTION[:RHO]], straggler:FACTOR[:STAGE[:FIRST:LAST]], "
    "comm:LATENCY[:JITTER], tp:MEMBERS:SIGMA[:DECISION] or moe:EXPERTS:TOPK[:SKEW[:SHARE]]"
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
    if spec.word == "mm":
        spec.expect((2, 3, 4), "mm:SIGMA_ENC:SIGMA_DEC[:FRACTION[:RHO]]", _KIND)
        encoder, decoder = spec.number(0, "SIGMA_ENC", kind=_KIND), spec.number(1, "SIGMA_DEC", kind=_KIND)
        fraction = spec.number(2, "FRACTION", kind=_KIND) if len(spec.args) >= 3 else 0.25
        if not 0.0 < fraction < 1.0:
            raise spec.fail(
                f"FRACTION is the encoder's share of the stages, between 0 and 1, got {spec.args[2]!r}", _KIND
            )
        rho = spec.number(3, "RHO", minimum=-1.0, kind=_KIND) if len(spec.args) == 4 else 0.0
        if rho > 1.0:
            raise spec.fail(f"RHO is a correlation, between -1 and 1, got {spec.args[3]!r}", _KIND)
        return Multimodal(encoder, decoder, fraction, rho)
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
    if spec.word == "moe":
        return _expert_load(spec, seconds)
    raise spec.fail(f"unknown model {spec.word!r}; use {_USAGE}", _KIND)


def _expert_load(spec: Spec, seconds: bool) -> ExpertLoad:
    """``moe:EXPERTS:TOPK[:SKEW[:SHARE]]`` (the simulator's: a run's experts route its real tokens)."""
    if seconds:
        raise spec.fail("moe is the simulator's (hintpipe simulate): a run's router balances its real tokens", _KIND)
    spec.expect((2, 3, 4), "moe:EXPERTS:TOPK[:SKEW[:SHARE]]", _KIND)
    experts = spec.integer(0, "EXPERTS", minimum=1, kind=_KIND)
    topk = spec.integer(1, "TOPK", minimum=1, kind=_KIND)
    if topk > experts:
        raise spec.fail(f"TOPK {topk} is more than the {experts} experts a token can go to", _KIND)
    skew = spec.number(2, "SKEW", kind=_KIND) if len(spec.args) >= 3 else 0.5
    share = spec.number(3, "SHARE", kind=_KIND) if len(spec.args) == 4 else 1.0
    if share > 1.0:
        raise spec.fail(f"SHARE is the experts' part of a stage's cost, between 0 and 1, got {spec.args[3]!r}", _KIND)
    return ExpertLoad(experts, topk, skew, share)


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


def multimodal_factors(model: Multimodal, stages: int, mbs: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Per ``[stage, mb]``, the multimodal factor: the encoder's on the leading stages, the
    decoder's on the rest; each lognormal with mean 1, their logarithms correlated by rho."""
    z = rng.standard_normal((2, mbs))
    rho = model.rho
    decoder_z = rho * z[0] + np.sqrt(max(0.0, 1.0 - rho * rho)) * z[1]
    encoder = np.exp(model.sigma_encoder * z[0] - 0.5 * model.sigma_encoder**2)
    decoder = np.exp(model.sigma_decoder * decoder_z - 0.5 * model.sigma_decoder**2)
    factors = np.empty((stages, mbs))
    cut = model.encoder_stages(stages)
    factors[:cut] = encoder
    factors[cut:] = decoder
    return factors


def expert_factors(model: ExpertLoad, stages: int, mbs: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Per ``[stage, mb]``, the cost factor of routing ``model``: ``1 - share + share x busiest / balanced``,
    where an expert's load is its share of the token-to-expert assignments (see [Note: expert load])."""
    popularity = mean_one_lognormal(rng, model.skew, (stages, mbs, model.experts))
    load = capped_shares(popularity, 1.0 / model.topk)
    busiest: npt.NDArray[np.float64] = model.experts * load.max(axis=2)  # over the balanced load, 1 / experts
    return (1.0 - model.share) + model.share * busiest


def capped_shares(weights: npt.NDArray[np.float64], cap: float) -> npt.NDArray[np.float64]:
    """``weights`` normalised to shares along the last axis, none above ``cap``: what is over the cap goes to
    the others in proportion to their weights, until none is over (at most one pass per expert)."""
    shares: npt.NDArray[np.float64] = weights / weights.sum(axis=-1, keepdims=True)
    for _ in range(weights.shape[-1]):
        full = shares >= cap
        room = 1.0 - cap * full.sum(axis=-1, keepdims=True)
        free = np.where(full, 0.0, weights)
        total = free.sum(axis=-1, keepdims=True)
        spread = np.divide(free * room, total, out=np.zeros_like(free), where=total > 0)
        updated: npt.NDArray[np.float64] = np.where(full, cap, spread)
        if np.array_equal(updated, shares):
            break
        shares = updated
    return shares


def sample_work(
    expected: npt.NDArray[np.float64],
    models: list[Variability],
    rng: np.random.Generator,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Costs ``[stage, mb, kind]`` drawn around ``expected`` under ``models``, each
    micro-batch's *known size*: its expected work under the factors that are known when
    the batch is loaded (``mb`` and ``mm``: sequence lengths, image counts), relative to
    the work without them, and those known factors per stage and micro-batch (``known[stage,
    mb]``: an ``mm`` micro-batch's encoder factor on the encoder's stages, its decoder factor
    on the rest). Task noise, stragglers, tensor-parallel members and expert loads are not known in advance
    and leave the sizes alone. Micro-batch order uses the sizes (``front-then-back``: the
    known factors at the first and the last stage), ``ready``'s forecast the known factors.

    Raises:
        SpecError: if a straggler names a stage or micro-batch that does not exist.
    """
    stages, mbs, _ = expected.shape
    costs = expected.copy()
    known = np.ones((stages, mbs))
    for model in models:
        if isinstance(model, IidNoise):
            costs *= mean_one_lognormal(rng, model.sigma, costs.shape)
        elif isinstance(model, MicrobatchNoise):
            factor = mean_one_lognormal(rng, model.sigma, (1, mbs, 1))
            costs *= factor
            known *= factor[:, :, 0]
        elif isinstance(model, Multimodal):
            factors = multimodal_factors(model, stages, mbs, rng)
            costs *= factors[:, :, None]
            known *= factors
        elif isinstance(model, Straggler):
            stage, first, last = straggler_window(model, stages, mbs, rng)
            costs[stage, first : last + 1, :] *= model.factor
        elif isinstance(model, TensorParallel):  # the slowest member sets the pace
            costs *= mean_one_lognormal(rng, model.sigma, (model.members, *costs.shape)).max(axis=0)
        elif isinstance(model, ExpertLoad):  # the busiest expert sets the pace
            costs *= expert_factors(model, stages, mbs, rng)[:, :, None]
    work = expected.sum(axis=2)  # [stage, mb]
    base = work.sum(axis=0)
    sizes = np.divide((work * known).sum(axis=0), base, out=np.ones(mbs), where=base > 0)
    return costs, sizes, known


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
