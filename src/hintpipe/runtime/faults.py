"""Injected variability for runtime experiments (``hintpipe train --inject``).

=============================  ===============================================
``compute:SIGMA``              after every task, sleep ``X * t`` where ``t`` is
                               the task's measured compute time and ``X`` an
                               independent lognormal factor with mean 1
``mb:SIGMA``                   the same, with one factor per micro-batch shared
                               by every stage: what varying document mix does
                               to a packed fixed-shape batch
``straggler:RANK:FACTOR``      every task on RANK takes FACTOR times as long
``comm:MS``                    every message is delivered MS milliseconds late
``crash:RANK:STEP``            RANK exits abruptly in step STEP (faults, tests)
``hang:RANK:STEP``             RANK stops making progress in step STEP
``nan:STEP``                   the loss of micro-batch 0 in step STEP is NaN
=============================  ===============================================

Factors are drawn from ``(seed, step, stage, kind, micro-batch)``, so every
policy sees exactly the same injected work. This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hintpipe.sim.variability import SpecError

_USAGE = "compute:SIGMA, mb:SIGMA, straggler:RANK:FACTOR, comm:MS, crash:RANK:STEP, hang:RANK:STEP or nan:STEP"
_KINDS = {"F": 0, "B": 1, "W": 2}


@dataclasses.dataclass(frozen=True)
class Injection:
    """All injected variability of a run (the sum of the ``--inject`` specs)."""

    compute_sigma: float = 0.0
    mb_sigma: float = 0.0
    stragglers: tuple[tuple[int, float], ...] = ()
    comm_ms: float = 0.0
    seed: int = 0
    crash: tuple[tuple[int, int], ...] = ()  # (rank, step)
    hang: tuple[tuple[int, int], ...] = ()
    nan_steps: tuple[int, ...] = ()

    @classmethod
    def parse(cls, specs: list[str], seed: int = 0) -> Injection:
        """Combine ``--inject`` specs.

        Raises:
            SpecError: naming the spec and what is wrong with it.
        """
        values: dict[str, float] = {"compute": 0.0, "mb": 0.0, "comm": 0.0}
        stragglers: list[tuple[int, float]] = []
        faults: dict[str, list[tuple[int, int]]] = {"crash": [], "hang": []}
        nan_steps: list[int] = []
        for spec in specs:
            name, _, rest = spec.strip().partition(":")
            args = rest.split(":") if rest else []
            if name in ("compute", "mb", "comm"):
                if len(args) != 1:
                    what = "MS" if name == "comm" else "SIGMA"
                    raise SpecError(f"bad injection {spec!r}: expected {name}:{what}")
                values[name] += _number(spec, args[0])
            elif name == "straggler":
                if len(args) != 2 or not args[0].isdigit():
                    raise SpecError(f"bad injection {spec!r}: expected straggler:RANK:FACTOR")
                factor = _number(spec, args[1])
                if factor < 1:
                    raise SpecError(f"bad injection {spec!r}: FACTOR must be >= 1")
                stragglers.append((int(args[0]), factor))
            elif name in ("crash", "hang"):
                if len(args) != 2 or not all(a.isdigit() for a in args):
                    raise SpecError(f"bad injection {spec!r}: expected {name}:RANK:STEP")
                faults[name].append((int(args[0]), int(args[1])))
            elif name == "nan":
                if len(args) != 1 or not args[0].isdigit():
                    raise SpecError(f"bad injection {spec!r}: expected nan:STEP")
                nan_steps.append(int(args[0]))
            else:
                raise SpecError(f"bad injection {spec!r}: unknown kind {name!r}; use {_USAGE}")
        return cls(
            values["compute"],
            values["mb"],
            tuple(stragglers),
            values["comm"],
            seed,
            tuple(faults["crash"]),
            tuple(faults["hang"]),
            tuple(nan_steps),
        )

    def check_ranks(self, ranks: int) -> None:
        named = [("straggler", r) for r, _ in self.stragglers]
        named += [("crash", r) for r, _ in self.crash] + [("hang", r) for r, _ in self.hang]
        for what, rank in named:
            if rank >= ranks:
                raise SpecError(f"{what} rank {rank} does not exist: the run has ranks 0..{ranks - 1}")

    @property
    def active(self) -> bool:
        return bool(self.compute_sigma or self.mb_sigma or self.stragglers or self.comm_ms)

    def extra_seconds(self, rank: int, step: int, stage: int, kind: str, mb: int, elapsed: float) -> float:
        """How long to sleep after a task that computed for ``elapsed`` seconds."""
        extra = 0.0
        if self.compute_sigma:
            extra += elapsed * _lognormal(self.compute_sigma, (self.seed, 1, step, stage, _KINDS[kind], mb))
        if self.mb_sigma:
            extra += elapsed * _lognormal(self.mb_sigma, (self.seed, 2, step, mb))
        for straggler, factor in self.stragglers:
            if straggler == rank:
                extra += elapsed * (factor - 1.0)
        return extra


def _number(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"bad injection {spec!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise SpecError(f"bad injection {spec!r}: {text!r} must be a finite number >= 0")
    return value


def _lognormal(sigma: float, key: tuple[int, ...]) -> float:
    rng = np.random.default_rng(list(key))
    return float(rng.lognormal(-0.5 * sigma * sigma, sigma))
