"""Forming micro-batches from a global batch of sequences: packing, padding, sorting, balancing.

A step's global batch is ``N`` sequences of lognormal lengths, cut into ``M``
micro-batches. How they are formed sets each micro-batch's cost and its
wasted work (padding, attention across packed documents):

- ``packed``: the sequences back to back, cut into ``M`` equal runs of tokens
  (documents split at the cuts), attention over the whole run, as plain
  packing does: every micro-batch costs the same, ``a T + b T^2``.
- ``packed, masked``: the same runs, attention only within each document
  (block-diagonal masks): ``a T + b sum(l_i^2)``.
- ``padded``: ``N / M`` sequences per micro-batch in arrival order, padded to
  the longest: ``k (a L + b L^2)``, ``L`` the longest of the ``k``.
- ``sorted``: the same after sorting by length (little padding, costs spread).
- ``balanced``: sorted by length, then cut into ``M`` runs of consecutive
  lengths (any count per run) that minimise the largest run's padded cost:
  similar lengths together and costs evened out, as DynaPipe forms them.

The cost model ``a * tokens + b * tokens^2`` per sequence (one transformer
block's forward) is fitted by least squares to gpt-mini blocks timed here at
several lengths. Each formation then runs in the event simulator (costs in
that model's seconds; B = 2F, W split as the hint says) under fixed 1F1B in
the given order, under the configuration the README recommends (bfw,
``ready``, per-device budget, given order) and with shortest-first order. Throughput is real tokens
(padding and cut-off attention excluded) per simulated second.

Run from the repository root::

    .venv/bin/python benchmarks/readiness-at-scale/forming.py [--ranks 16] [--microbatches 64] [--per-microbatch 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from hintpipe.apps.models import Block, ModelConfig
from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.schedule.generators import generate_hint
from hintpipe.sim.simulator import Sample, Simulator

Costs = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]


def fit_cost_model(hidden: int, lengths: Sequence[int], repeats: int = 5) -> tuple[float, float, list[list[float]]]:
    """``(a, b)`` of ``a * t + b * t^2`` seconds for one block's forward on a sequence of ``t`` tokens,
    and the timings it was fitted to."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    block = Block(ModelConfig("gpt-mini", layers=1, hidden=hidden, heads=4, max_seq_len=max(lengths) + 1))
    measured = []
    with torch.no_grad():
        for t in lengths:
            x = torch.randn(1, t, hidden)
            block(x)  # warm-up
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                block(x)
                times.append(time.perf_counter() - began)
            measured.append([float(t), statistics.median(times)])
    data = np.asarray(measured)
    design = np.stack([data[:, 0], data[:, 0] ** 2], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, data[:, 1], rcond=None)
    return float(a), float(b), measured


def formations(lengths: npt.NDArray[np.int64], m: int, a: float, b: float) -> dict[str, npt.NDArray[np.float64]]:
    """Per formation, each micro-batch's forward cost (seconds, in arrival order of the micro-batches)."""
    n = len(lengths)
    k = n // m

    def padded(groups: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.float64]:
        return np.array([len(g) * (a * g.max() + b * g.max() ** 2) for g in groups])

    total = int(lengths.sum())
    run = total / m
    cuts = np.cumsum(lengths)
    masked = []
    for i in range(m):  # the documents' pieces inside tokens [i * run, (i + 1) * run)
        lo, hi = i * run, (i + 1) * run
        starts = cuts - lengths
        pieces = np.clip(np.minimum(cuts, hi) - np.maximum(starts, lo), 0, None)
        masked.append(a * run + b * float((pieces**2).sum()))
    order = np.sort(lengths)
    return {
        "packed": np.full(m, a * run + b * run**2),
        "packed, masked": np.array(masked),
        "padded": padded([lengths[i * k : (i + 1) * k] for i in range(m)]),
        "sorted": padded([order[i * k : (i + 1) * k] for i in range(m)]),
        "balanced": padded(balanced_groups(order, m, a, b)),
    }


def balanced_groups(order: npt.NDArray[np.int64], m: int, a: float, b: float) -> list[npt.NDArray[np.int64]]:
    """Cut the sorted lengths into ``m`` consecutive runs whose largest padded cost is smallest
    (binary search on that cost, filling each run greedily)."""

    def cut(limit: float) -> list[npt.NDArray[np.int64]] | None:
        groups, start = [], 0
        for i in range(1, len(order) + 1):
            longest = order[i - 1]
            if (i - start) * (a * longest + b * longest**2) > limit and i - 1 > start:
                groups.append(order[start : i - 1])
                start = i - 1
        groups.append(order[start:])
        return groups if len(groups) <= m else None

    low, high = 0.0, len(order) * (a * order[-1] + b * order[-1] ** 2)
    for _ in range(60):
        middle = (low + high) / 2
        if cut(middle) is None:
            low = middle
        else:
            high = middle
    groups = cut(high)
    assert groups is not None
    while len(groups) < m:  # split the costliest run in two: m micro-batches, as every formation has
        costs = [len(g) * (a * g[-1] + b * g[-1] ** 2) for g in groups]
        i = int(np.argmax(costs))
        g = groups.pop(i)
        half = max(1, len(g) // 2)
        groups[i:i] = [g[:half], g[half:]] if len(g) > 1 else [g]
        if len(g) == 1:
            break
    return groups


def simulate(
    costs: npt.NDArray[np.float64], ranks: int, hint_name: str, policy: Policy, order: str, by_device: bool
) -> float:
    """The makespan (simulated seconds) of one step whose micro-batch ``i`` has forward cost ``costs[i]``
    on every stage (backward twice that, split into B and W where the hint splits)."""
    m = len(costs)
    hint = generate_hint(hint_name, ranks, m)
    per_stage = costs / hint.stages * ranks  # a rank's stages share its layers
    model = CostModel.uniform(
        hint.stages,
        forward=1.0,
        backward=2.0 if not hint.split_backward else 1.0,
        weight=1.0 if hint.split_backward else 0.0,
    )
    expected = model.expected(m, hint.split_backward)
    mean = float(per_stage.mean())  # the unit: the plan expects every micro-batch to cost the mean
    factor = per_stage / mean
    sample = Sample(expected * factor[None, :, None], np.zeros_like(expected), 0.0, sizes=factor).ordered(order)
    simulator = Simulator(hint, model)
    budgets = simulator.device_budgets() if by_device else None
    return simulator.run(policy, sample, activation_budget=budgets).makespan * mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--per-microbatch", type=int, default=8, help="sequences per micro-batch (N = M x this)")
    parser.add_argument("--mean", type=float, default=512.0, help="mean sequence length (lognormal)")
    parser.add_argument("--sigma", type=float, default=0.7)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    a, b, measured = fit_cost_model(args.hidden, [32, 64, 128, 256, 512, 1024, 2048])
    fitted = [a * t + b * t * t for t, _ in measured]
    worst = max(abs(f - s) / s for f, (_, s) in zip(fitted, measured, strict=True))
    print(
        f"cost model: a = {a:.3e} s/token, b = {b:.3e} s/token^2 (largest misfit {worst:.0%} over "
        f"{len(measured)} lengths; at {args.mean:g} tokens the quadratic term is "
        f"{b * args.mean**2 / (a * args.mean + b * args.mean**2):.0%})"
    )
    setups = [
        ("fixed 1F1B, given", "1f1b", Policy.FIXED, "given", False),
        ("bfw ready, given, device budget", "bfw", Policy.READY, "given", True),
        ("bfw ready, shortest-first, device budget", "bfw", Policy.READY, "shortest-first", True),
    ]
    rows: dict[tuple[str, str], list[float]] = {}
    waste: dict[str, list[float]] = {}
    for trial in range(args.trials):
        rng = np.random.default_rng([trial, 11])
        n = args.microbatches * args.per_microbatch
        mu = np.log(args.mean) - args.sigma**2 / 2
        lengths = np.clip(np.round(rng.lognormal(mu, args.sigma, n)), 8, 16 * args.mean).astype(np.int64)
        real_tokens = float(lengths.sum())
        useful = float((a * lengths + b * lengths**2).sum())  # the work the sequences themselves need
        for name, costs in formations(lengths, args.microbatches, a, b).items():
            waste.setdefault(name, []).append(float(costs.sum()) / useful)
            for label, hint, policy, order, device in setups:
                makespan = simulate(costs, args.ranks, hint, policy, order, device)
                rows.setdefault((name, label), []).append(real_tokens / makespan)
    base = statistics.mean(rows[("packed", setups[0][0])])
    print(
        f"\n{args.ranks} ranks, {args.microbatches} micro-batches of {args.per_microbatch} sequences, lengths "
        f"lognormal:{args.mean:g}:{args.sigma:g}, {args.trials} trials: real tokens per simulated second\n"
    )
    print("| formation | work / the sequences' own | configuration | tokens/s | vs packed, fixed 1F1B |")
    print("|---|---:|---|---:|---:|")
    for (name, label), values in rows.items():
        mean = statistics.mean(values)
        print(f"| {name} | {statistics.mean(waste[name]):.2f} | {label} | {mean:,.0f} | {mean / base:.2f}x |")
    if args.json:
        payload: dict[str, Any] = {
            "a": a,
            "b": b,
            "measured": measured,
            "rows": [{"formation": f, "setup": s, "tokens_per_s": v} for (f, s), v in rows.items()],
        }
        Path(args.json).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
