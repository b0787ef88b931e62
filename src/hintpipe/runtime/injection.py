"""What a run injects: variability (``--variability``, the simulator's words, same meaning) and faults
(``--faults``).

=============================  ===============================================
``iid:SIGMA``                  every task's cost times an independent
                               lognormal factor ``X`` with mean 1
``mb:SIGMA``                   one factor per micro-batch, shared by every
                               stage: what varying document mix does to a
                               packed fixed-shape batch
``mm:SIGMA_ENC:SIGMA_DEC[:FRACTION[:RHO]]``
                               a multimodal model: the first FRACTION of the
                               stages (default 0.25) an encoder with one factor
                               per micro-batch, the rest a decoder with
                               another, their logarithms correlated by RHO
``straggler:FACTOR[:STAGE[:FIRST:LAST]]``
                               STAGE's tasks on micro-batches FIRST..LAST
                               cost FACTOR times as much
``comm:LATENCY[:JITTER]``      every message is delivered LATENCY (plus an
                               exponential extra with mean JITTER) late; times
                               with a unit: ``comm:2ms``, ``comm:1ms:500us``
``tp:MEMBERS:SIGMA``           each member of a tensor-parallel group gets its
                               own lognormal factor per task (MEMBERS is the
                               mesh's tp); the group's collectives make the
                               slowest member set the pace, as in the simulator
                               (whose DECISION is real here, so not given)
The faults, for tests of failure handling:

=============================  ===============================================
``crash:RANK:STEP``            RANK exits abruptly in step STEP
``hang:RANK:STEP``             RANK stops making progress in step STEP
``nan:STEP``                   the loss of micro-batch 0 in step STEP is NaN
``savefail:RANK:STEP``         RANK's checkpoint save after step STEP fails
                               as a full disk would
``savestop:RANK:STEP``         RANK's process stops (SIGSTOP) inside its
                               checkpoint save after step STEP, as a frozen
                               machine would
=============================  ===============================================

Crashes, hangs and failing saves fire in the first attempt of a job only: an
elastic restart (``torchrun --max-restarts``) resumes and runs past them.

The simulator treats ``mb`` and ``mm`` factors as sizes known when the batch
is loaded (its micro-batch order uses them); injected here they are noise the
runtime does not know in advance: the runtime orders by the sizes of the real
inputs (sequence lengths, image counts).

Factors are drawn from ``(seed, step, stage, kind, micro-batch)``, so every
policy sees exactly the same injected work. :mod:`hintpipe.runtime.faults`
applies them. This module is torch-free (the command line checks specs
without importing torch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hintpipe.dispatch.variability import (
    CommDelay,
    IidNoise,
    MicrobatchNoise,
    Multimodal,
    Straggler,
    TensorParallel,
    Variability,
    comm_delay,
    mean_one_lognormal,
    parse_variability,
    straggler_window,
)
from hintpipe.schedule.task import Kind
from hintpipe.spec import Spec, SpecError

_VARIABILITY = ("iid", "mb", "mm", "straggler", "comm", "tp")
_FAULTS = ("crash", "hang", "nan", "savefail", "savestop")
_FAULT_USAGE = "crash:RANK:STEP, hang:RANK:STEP, nan:STEP, savefail:RANK:STEP or savestop:RANK:STEP"


@dataclasses.dataclass(frozen=True)
class Injection:
    """All injected variability and faults of a run."""

    variability: tuple[Variability, ...] = ()
    crash: tuple[tuple[int, int], ...] = ()  # (rank, step)
    hang: tuple[tuple[int, int], ...] = ()
    nan_steps: tuple[int, ...] = ()
    save_failures: tuple[tuple[int, int], ...] = ()  # (rank, step)
    save_stops: tuple[tuple[int, int], ...] = ()  # (rank, step)
    seed: int = 0

    @property
    def steps(self) -> list[int]:
        """The steps the faults fire in."""
        steps = [step for _, step in (*self.crash, *self.hang, *self.save_failures, *self.save_stops)]
        return steps + list(self.nan_steps)

    @classmethod
    def parse(cls, variability: Sequence[str] = (), faults: Sequence[str] = (), seed: int = 0) -> Injection:
        """A run's ``--variability`` and ``--faults`` specs, parsed once.

        Raises:
            SpecError: naming the spec and what is wrong with it.
        """
        crash, hang, nan_steps, save_failures, save_stops = _faults(faults)
        return cls(
            tuple(_variability(text) for text in variability), crash, hang, nan_steps, save_failures, save_stops, seed
        )

    def check(self, ranks: int, stages: int, microbatches: int, tp: int = 1) -> None:
        """Refuse ranks, stages, micro-batches or tensor-parallel members the run does not have."""
        for model in self.variability:
            if isinstance(model, TensorParallel) and model.members != tp:
                raise SpecError(
                    f"tp:{model.members}:{model.sigma:g} is for tensor-parallel groups of {model.members} members, "
                    f"this run's have {tp}"
                )
        named = [("crash", r) for r, _ in self.crash] + [("hang", r) for r, _ in self.hang]
        named += [("savefail", r) for r, _ in self.save_failures] + [("savestop", r) for r, _ in self.save_stops]
        for what, rank in named:
            if rank >= ranks:
                raise SpecError(f"{what} rank {rank} does not exist: the run has ranks 0..{ranks - 1}")
        self.factors(stages, microbatches)  # resolves the stragglers, refusing stages that do not exist

    @property
    def varies(self) -> bool:
        """Whether task costs are scaled (iid, mb, mm, tp or straggler)."""
        return any(not isinstance(v, CommDelay) for v in self.variability)

    @property
    def comm(self) -> CommDelay | None:
        delay = comm_delay(list(self.variability))
        return delay if delay.latency or delay.jitter else None

    @property
    def faulty(self) -> bool:
        return bool(self.crash or self.hang or self.nan_steps)

    def factors(self, stages: int, microbatches: int) -> CostFactors:
        """The per-task cost factors of this injection on a pipeline of this size."""
        rng = np.random.default_rng([self.seed, 3])
        windows = [
            (v.factor, *straggler_window(v, stages, microbatches, rng))
            for v in self.variability
            if isinstance(v, Straggler)
        ]
        kinds = (IidNoise, MicrobatchNoise, TensorParallel)
        sigmas = {type(v): v.sigma for v in self.variability if isinstance(v, kinds)}
        multimodal = [v for v in self.variability if isinstance(v, Multimodal)]
        return CostFactors(
            self.seed,
            sigmas.get(IidNoise, 0.0),
            sigmas.get(MicrobatchNoise, 0.0),
            tuple(windows),
            sigmas.get(TensorParallel, 0.0),
            multimodal=multimodal[-1] if multimodal else None,
            encoder_stages=multimodal[-1].encoder_stages(stages) if multimodal else 0,
        )


@dataclasses.dataclass(frozen=True)
class CostFactors:
    """``factor(step, stage, kind, mb)``: the product of the injected cost factors of one task."""

    seed: int
    iid_sigma: float
    mb_sigma: float
    stragglers: tuple[tuple[float, int, int, int], ...]  # (factor, stage, first, last)
    member_sigma: float = 0.0
    member: int = 0  # this rank's place in its tensor-parallel group: its own draw of the member factor
    multimodal: Multimodal | None = None
    encoder_stages: int = 0  # the leading stages that take the multimodal encoder's factor

    def __call__(self, step: int, stage: int, kind: Kind, mb: int) -> float:
        factor = 1.0
        if self.iid_sigma:
            rng = np.random.default_rng([self.seed, 1, step, stage, int(kind), mb])
            factor *= float(mean_one_lognormal(rng, self.iid_sigma, (1,))[0])
        if self.mb_sigma:
            rng = np.random.default_rng([self.seed, 2, step, mb])
            factor *= float(mean_one_lognormal(rng, self.mb_sigma, (1,))[0])
        if self.member_sigma:
            rng = np.random.default_rng([self.seed, 4, step, stage, int(kind), mb, self.member])
            factor *= float(mean_one_lognormal(rng, self.member_sigma, (1,))[0])
        if self.multimodal is not None:
            mm = self.multimodal
            z = np.random.default_rng([self.seed, 5, step, mb]).standard_normal(2)
            if stage < self.encoder_stages:
                sigma, x = mm.sigma_encoder, z[0]
            else:
                sigma, x = mm.sigma_decoder, mm.rho * z[0] + np.sqrt(max(0.0, 1.0 - mm.rho * mm.rho)) * z[1]
            factor *= float(np.exp(sigma * x - 0.5 * sigma * sigma))
        for slow, s, first, last in self.stragglers:
            if s == stage and first <= mb <= last:
                factor *= slow
        return factor


def _variability(text: str) -> Variability:
    """One ``--variability`` spec as the runtime takes it (times with a unit; no simulated DECISION)."""
    spec = Spec.split(text)
    kind = "variability"
    if spec.word in _FAULTS:
        raise spec.fail(f"{spec.word} is a fault, not variability: give it with --faults", kind)
    if spec.word == "tp" and len(spec.args) == 3:
        raise spec.fail(
            "expected tp:MEMBERS:SIGMA (the runtime's decisions are real: DECISION is the simulator's)", kind
        )
    if spec.word == "straggler" and len(spec.args) == 2 and not spec.args[1].isdigit():
        raise spec.fail("expected straggler:FACTOR[:STAGE[:FIRST:LAST]] (STAGE, not RANK, follows FACTOR)", kind)
    return parse_variability(text, seconds=True)


_Faults = tuple[
    tuple[tuple[int, int], ...],
    tuple[tuple[int, int], ...],
    tuple[int, ...],
    tuple[tuple[int, int], ...],
    tuple[tuple[int, int], ...],
]


def _faults(specs: Sequence[str]) -> _Faults:
    """The ``--faults`` specs: crashes, hangs, NaN steps, failing saves and stopping saves."""
    kind = "fault"
    found: dict[str, list[tuple[int, int]]] = {"crash": [], "hang": [], "savefail": [], "savestop": []}
    nan_steps: list[int] = []
    for text in specs:
        spec = Spec.split(text)
        if spec.word in _VARIABILITY:
            raise spec.fail(f"{spec.word} is variability, not a fault: give it with --variability", kind)
        if spec.word in found:
            spec.expect((2,), f"{spec.word}:RANK:STEP", kind)
            found[spec.word].append((spec.integer(0, "RANK", kind=kind), spec.integer(1, "STEP", kind=kind)))
        elif spec.word == "nan":
            spec.expect((1,), "nan:STEP", kind)
            nan_steps.append(spec.integer(0, "STEP", kind=kind))
        else:
            raise spec.fail(f"unknown fault {spec.word!r}; use {_FAULT_USAGE}", kind)
    found_nan = tuple(nan_steps)
    return tuple(found["crash"]), tuple(found["hang"]), found_nan, tuple(found["savefail"]), tuple(found["savestop"])
