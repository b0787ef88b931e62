"""hintpipe on micro-batches formed by cost against torch.distributed.pipelining on packed rows.

The same model (gpt-mini: 8 blocks, hidden 128, 4 heads, vocabulary 512),
the same documents and the same tokens every step: documents of
lognormal(64, 0.5) lengths (a synthetic counting language) drawn until the
step holds exactly 8 micro-batches x 2 rows x 64 = 1,024 tokens (the last
one cropped to fit), on 2 real ranks (gloo, one thread each):

- **torch, packed**: the documents back to back, cut into rows of 64 tokens
  (documents split at the row ends, attention across them, as plain packing
  does), 2 rows a micro-batch: ``Schedule1F1B`` (one stage per rank) and
  ``ScheduleInterleaved1F1B`` (two per rank).
- **torch, padded**: the documents whole, formed as hintpipe forms them,
  every micro-batch padded to the largest rows x length of the run (torch's
  schedules fix the shapes): ``Schedule1F1B``.
- **hintpipe** on the documents whole, formed by
  :func:`hintpipe.forming.collate.form_batch` (cost fitted once from the
  planner's profile at two lengths): rows of one document each (padded to
  each micro-batch's longest), or packed rows with document masks; fixed
  1F1B, and the recommended configuration (``bfw`` hint, ``ready``,
  ``device_budget_fraction=0``). Also hintpipe fixed 1F1B on torch's packed rows (the
  runtimes on identical work).

``--row R --rows N`` packs torch's rows ``R`` tokens long, ``N`` a
micro-batch (default 64 x 2: rows of the documents' mean length); the step
then holds ``8 x N x R`` tokens, the same for every variant. Rows of the
model's context length (``--row 512 --rows 1``) are what packing for
language-model training usually does.

Tokens per second count the step's tokens for every variant; a step
is timed on every rank from a barrier to the end of its call (the slowest
rank's time is the step's); the first step warms up. Peak memory: each
rank's peak resident set over the measured steps (``VmHWM``, reset after the
first step). CPU: each rank's CPU time a measured step, the calling
(computing) thread's and the whole process's. Variants alternate (repeat
``i`` runs them in turn, reversed on odd repeats), each run spawning its
own 2 ranks; ratios compare pooled tokens per second of runs side by side.

Run from the repository root::

    .venv/bin/python benchmarks/vs-packing/vs_packing.py [--repeats 3] [--steps 10] [--ranks 2]
        [--row 64 --rows 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

import hintpipe
from hintpipe.apps.models import ModelConfig, build_layers, counting_text, lm_loss_sum, split_layers, whole_model
from hintpipe.dispatch.variability import mean_one_lognormal
from hintpipe.forming.collate import IGNORE_INDEX, FormedBatch, form_batch
from hintpipe.forming.cost import SequenceCost
from hintpipe.forming.profiled import profile_sequence_cost

CONFIG = ModelConfig("gpt-mini", layers=8, hidden=128, heads=4, vocab=512, max_seq_len=512)
MICROBATCHES = 8
MEAN = 64  # the documents' mean length in tokens
SEED = 0


@dataclasses.dataclass(frozen=True)
class Rows:
    """torch's packed rows: ``rows`` rows of ``row`` tokens a micro-batch (the step's tokens for every variant)."""

    rows: int = 2
    row: int = MEAN

    @property
    def tokens(self) -> int:
        return MICROBATCHES * self.rows * self.row


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str
    runtime: str  # "torch", "hintpipe", or "unsplit" (the whole model in one process: the shapes' own cost)
    data: str  # "packed" (rows of 64, documents cut), "padded" (formed, one document a row), "masked" (packed whole)
    schedule: str = "1f1b"  # torch: "1f1b" or "interleaved"; hintpipe: its hint
    chunks: int = 1  # stages per rank
    policy: str = "fixed"
    device_budget_fraction: float | None = None


#: torch's and hintpipe's runs; "formed": whole documents, one per row; "formed, masks": packed rows of whole
#: documents with document masks; "recommended": the bfw hint, ready, device_budget_fraction=0; "x2": two stages a rank.
VARIANTS = [
    Variant("torch 1F1B, packed rows", "torch", "packed"),
    Variant("torch interleaved 1F1B x2, packed rows", "torch", "packed", "interleaved", 2),
    Variant("torch 1F1B, formed, padded to the run's largest", "torch", "padded"),
    Variant("hintpipe fixed 1F1B, packed rows", "hintpipe", "packed"),
    Variant("hintpipe fixed 1F1B, formed", "hintpipe", "padded"),
    Variant("hintpipe fixed 1F1B, formed, masks", "hintpipe", "masked"),
    Variant("hintpipe fixed interleaved 1F1B x2, formed, masks", "hintpipe", "masked", "interleaved-1f1b", 2),
    Variant("hintpipe recommended, formed", "hintpipe", "padded", "bfw", 1, "ready", 0.0),
    Variant("hintpipe recommended, formed, masks", "hintpipe", "masked", "bfw", 1, "ready", 0.0),
    Variant("hintpipe recommended x2, formed, masks", "hintpipe", "masked", "bfw", 2, "ready", 0.0),
    Variant("unsplit model, one process, packed rows", "unsplit", "packed"),
    Variant("unsplit model, one process, formed", "unsplit", "padded"),
    Variant("unsplit model, one process, formed, masks", "unsplit", "masked"),
]


def documents(step: int, tokens: int) -> list[torch.Tensor]:
    """Step ``step``'s documents (``n + 1`` ids for ``n`` tokens each), ``tokens`` tokens in all."""
    rng = np.random.default_rng([SEED, step])
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    docs, total = [], 0
    while total < tokens:
        n = int(np.clip(np.round(MEAN * mean_one_lognormal(rng, 0.5, (1,))[0]), 8, CONFIG.max_seq_len - 1))
        n = min(n, tokens - total)
        if tokens - total - n == 1:  # never leave a single token for a last document
            n += 1
        start = torch.randint(0, CONFIG.vocab, (1, 1), generator=generator)
        docs.append(counting_text(start, n, CONFIG.vocab, generator)[0])
        total += n
    return docs


def packed(docs: list[torch.Tensor], rows: Rows) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The documents back to back in rows of ``rows.row`` tokens, ``rows.rows`` rows a micro-batch."""
    inputs = torch.cat([d[:-1] for d in docs]).view(MICROBATCHES, rows.rows, rows.row)
    targets = torch.cat([d[1:] for d in docs]).view(MICROBATCHES, rows.rows, rows.row)
    return list(inputs), list(targets)


def formed(docs: list[torch.Tensor], cost: SequenceCost, step: int, pack: bool) -> FormedBatch:
    return form_batch(docs, MICROBATCHES, cost, pack=pack, seed=step)


def padded_to(batch: FormedBatch, shape: tuple[int, int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The formed micro-batches padded to one ``(rows, length)`` for all."""
    rows, length = shape
    ids = [x for x in batch.inputs if isinstance(x, torch.Tensor)]  # one document a row: ids alone
    inputs = [F.pad(x, (0, length - x.shape[1], 0, rows - x.shape[0])) for x in ids]
    targets = [F.pad(y, (0, length - y.shape[1], 0, rows - y.shape[0]), value=IGNORE_INDEX) for y in batch.targets]
    return inputs, targets


def token_loss(tokens: int) -> Any:
    """torch's schedules average the micro-batches' losses: each one's summed loss over the step's mean tokens
    per micro-batch makes that average the mean over the step's ``tokens``, as hintpipe's ``loss_divisor``
    does."""
    return lambda logits, targets: lm_loss_sum(logits, targets) * MICROBATCHES / tokens


def step_data(
    v: Variant, step: int, cost: SequenceCost, pad_shape: tuple[int, int], rows: Rows
) -> tuple[list[Any], list[Any]]:
    docs = documents(step, rows.tokens)
    if v.data == "packed":
        return packed(docs, rows)
    batch = formed(docs, cost, step, pack=v.data == "masked")
    if v.runtime == "torch":
        return padded_to(batch, pad_shape)
    return batch.inputs, batch.targets  # hintpipe and the unsplit model take the formed micro-batches as they are


def rank_main(
    rank: int, world: int, v: Variant, steps: int, cost: SequenceCost, pad: tuple[int, int], rows: Rows, warmup: int
) -> dict[str, Any]:
    chunks = v.chunks
    modules = split_layers(build_layers(CONFIG), world * chunks)
    mine = {s: modules[s] for s in range(world * chunks) if s % world == rank}
    optimizer = torch.optim.AdamW([p for m in mine.values() for p in m.parameters()], lr=1e-3)
    first, last = rank == 0, rank == world - 1
    pipe: hintpipe.Pipeline | None = None
    if v.runtime == "unsplit":
        (model,) = mine.values()

        def run(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> float | None:
            total = torch.zeros(())
            for x, y in zip(inputs, targets, strict=True):  # each micro-batch's forward and backward in turn
                loss = lm_loss_sum(model(*x) if isinstance(x, tuple) else model(x), y) / rows.tokens
                torch.autograd.backward(loss)
                total += loss.detach()
            return float(total)

    elif v.runtime == "torch":
        x0, _ = step_data(v, 0, cost, pad, rows)
        stages: list[Any] = []
        for s, module in sorted(mine.items()):
            example = x0[0]
            for before in modules[:s]:
                example = before(example)
            example = example.detach().requires_grad_(s > 0)
            out = module(example)
            stages.append(PipelineStage(module, s, world * chunks, torch.device("cpu"), example, out))
        schedule: Any = (
            Schedule1F1B(stages[0], MICROBATCHES, loss_fn=token_loss(rows.tokens))
            if v.schedule == "1f1b"
            else ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=token_loss(rows.tokens))
        )

        def run(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> float | None:
            losses: list[torch.Tensor] = []
            kwargs: dict[str, Any] = {"return_outputs": False}
            if last:
                kwargs |= {"target": torch.cat(targets), "losses": losses}
            if first:
                schedule.step(torch.cat(inputs), **kwargs)
            else:
                schedule.step(**kwargs)
            return float(torch.stack([loss.detach() for loss in losses]).mean()) if last else None

    else:
        options: dict[str, Any] = {"hint": v.schedule, "chunks": v.chunks, "policy": v.policy, "timeout": 120.0}
        if v.device_budget_fraction is not None:
            options["device_budget_fraction"] = v.device_budget_fraction
        pipe = hintpipe.Pipeline.from_modules(
            modules, loss_fn=lm_loss_sum, microbatches=MICROBATCHES, report_every=0, **options
        )

        def run(inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> float | None:
            assert pipe is not None
            loss = pipe.step(inputs if first else None, targets if last else None, loss_divisor=rows.tokens)
            return None if loss is None else float(loss)

    times, losses, caller_cpu, process_cpu, system, faults = [], [], [], [], [], []
    try:
        for step in range(steps):
            inputs, targets = step_data(v, step, cost, pad, rows)
            if step == warmup:
                Path("/proc/self/clear_refs").write_text("5")  # the peak resident set from here on
            dist.barrier()
            usage0 = resource.getrusage(resource.RUSAGE_SELF)
            began, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
            loss = run(inputs, targets)
            times.append(time.perf_counter() - began)
            caller_cpu.append(time.thread_time() - thread0)
            process_cpu.append(time.process_time() - process0)
            usage1 = resource.getrusage(resource.RUSAGE_SELF)
            system.append(usage1.ru_stime - usage0.ru_stime)
            faults.append(usage1.ru_minflt - usage0.ru_minflt)
            if loss is not None:
                losses.append(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        if pipe is not None:
            pipe.close()
    peak = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if "VmHWM" in line)
    return {
        "times": times,
        "losses": losses,
        "peak_kib": peak,
        "caller_cpu": caller_cpu[warmup:],
        "process_cpu": process_cpu[warmup:],
        "system_cpu": system[warmup:],
        "faults": faults[warmup:],
    }


def other_load(fn: Any) -> tuple[Any, float]:
    """``fn()`` and the cores other work kept busy meanwhile (machine busy time minus this process tree's)."""

    def busy() -> tuple[float, float]:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        own = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        return (sum(ticks[:3]) + sum(ticks[5:8])) / os.sysconf("SC_CLK_TCK"), own

    (b0, o0), began = busy(), time.perf_counter()
    result = fn()
    (b1, o1), wall = busy(), time.perf_counter() - began
    return result, max(0.0, (b1 - b0) - (o1 - o0)) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--only", nargs="*", type=int, help="variant numbers (0-based) to run")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--row", type=int, default=MEAN, help="torch's packed rows' tokens (default: the mean length)")
    parser.add_argument("--rows", type=int, default=2, help="packed rows a micro-batch")
    parser.add_argument("--warmup", type=int, default=1, help="steps run before the measured ones (default 1)")
    args = parser.parse_args()
    rows = Rows(args.rows, args.row)
    torch.set_num_threads(1)
    whole, _ = whole_model(CONFIG)
    cost = profile_sequence_cost(whole, lambda t: torch.zeros(2, t, dtype=torch.int64), (16, 64, 256), repeats=3)
    print(f"sequence cost: a = {cost.a:.3e} s/token, b = {cost.b:.3e} s/token^2 (per row)", flush=True)
    shapes = [formed(documents(s, rows.tokens), cost, s, pack=False) for s in range(args.steps)]
    pad = (
        max(b.formation.shape(mb)[0] for b in shapes for mb in range(MICROBATCHES)),
        max(b.formation.shape(mb)[1] for b in shapes for mb in range(MICROBATCHES)),
    )
    padding = [b.formation.padding for b in shapes[1:]]
    print(f"formed: padding {statistics.mean(padding):.3f} of the tokens; torch padded to {pad[0]} x {pad[1]}")
    variants = [VARIANTS[i] for i in args.only] if args.only else VARIANTS
    runs: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    for repeat in range(args.repeats):
        for v in variants if repeat % 2 == 0 else list(reversed(variants)):
            world = 1 if v.runtime == "unsplit" else args.ranks
            spawn = (rank_main, world, v, args.steps, cost, pad, rows, args.warmup)
            ranks, load = other_load(lambda spawn=spawn: hintpipe.run_ranks(*spawn))
            times = [max(t) for t in zip(*(r["times"] for r in ranks), strict=True)][args.warmup :]
            run = {
                "tokens_per_s": rows.tokens * len(times) / sum(times),
                "peak_mib": [r["peak_kib"] / 1024 for r in ranks],
                "loss0": next(r["losses"][0] for r in ranks if r["losses"]),
                "load": load,
                # per rank, CPU ms a measured step: the calling thread's (the computing one), the whole process's
                "caller_cpu_ms": [1e3 * statistics.mean(r["caller_cpu"]) for r in ranks],
                "process_cpu_ms": [1e3 * statistics.mean(r["process_cpu"]) for r in ranks],
                # per rank, the process's system CPU ms and page faults a measured step (see the README's "Memory
                # the machine has not lent yet")
                "system_cpu_ms": [1e3 * statistics.mean(r["system_cpu"]) for r in ranks],
                "faults": [statistics.mean(r["faults"]) for r in ranks],
            }
            runs[v.label].append(run)
            print(f"repeat {repeat}: {v.label}: {run['tokens_per_s']:,.0f} tokens/s (other work {load:.2f} cores)")
    pooled = {label: statistics.mean(r["tokens_per_s"] for r in rs) for label, rs in runs.items()}
    torch_best = max((pooled[v.label] for v in variants if v.runtime == "torch" and v.data == "packed"), default=1.0)
    print(
        f"\n{args.ranks} ranks, {args.steps} steps ({args.steps - args.warmup} measured) x {args.repeats} runs each; "
        f"{rows.tokens:,} tokens a step, torch's packed rows {rows.rows} x {rows.row} a micro-batch\n"
    )
    print(
        "| variant | tokens/s | vs the faster torch on packed rows | each run | peak MiB per rank | "
        "CPU ms a step per rank: caller / process | system CPU ms a step per rank | first loss |"
    )
    print("|---|---:|---:|---|---|---|---|---:|")
    for v in variants:
        rs = runs[v.label]
        each = " ".join(f"{r['tokens_per_s']:,.0f}" for r in rs)
        world = len(rs[0]["peak_mib"])
        peak = " ".join(f"{max(r['peak_mib'][i] for r in rs):.0f}" for i in range(world))
        caller = [statistics.mean(r["caller_cpu_ms"][i] for r in rs) for i in range(world)]
        process = [statistics.mean(r["process_cpu_ms"][i] for r in rs) for i in range(world)]
        cpu = " ".join(f"{c:.0f}/{p:.0f}" for c, p in zip(caller, process, strict=True))
        system = " ".join(f"{statistics.mean(r['system_cpu_ms'][i] for r in rs):.1f}" for i in range(world))
        versus = "(one process)" if v.runtime == "unsplit" else f"{pooled[v.label] / torch_best:.2f}x"
        print(
            f"| {v.label} | {pooled[v.label]:,.0f} | {versus} | {each} | {peak} | {cpu} | {system} | "
            f"{rs[0]['loss0']:.5f} |"
        )
    unsplit = {v.data: pooled[v.label] for v in variants if v.runtime == "unsplit"}
    for data in ("padded", "masked"):
        if "packed" in unsplit and data in unsplit:
            name = "formed, masks" if data == "masked" else "formed"
            print(
                f"\nthe unsplit model, one process: {name} / packed rows {unsplit[data] / unsplit['packed']:.2f}x "
                "(what those shapes cost the model itself, against packed rows)"
            )
    print(f"\nother work: up to {max(r['load'] for rs in runs.values() for r in rs):.2f} cores during a run")
    if args.json:
        payload = {
            "cost": cost.to_json(),
            "pad": pad,
            "runs": runs,
            "padding": padding,
            "ranks": args.ranks,
            "rows": dataclasses.asdict(rows),
        }
        Path(args.json).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
