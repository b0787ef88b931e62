"""What a task costs inside the pipeline against the same computation alone, on the same shapes.

A small GPT (gpt-mini: 8 blocks, hidden 128, 4 heads, vocabulary 512) cut
into 2 stages, 8 micro-batches of 2 sequences a step, every sequence 64
tokens (``equal``) or lognormal(64, 0.5) per micro-batch (``variable``):

- **inside**: 2 real ranks, fixed 1F1B; each stage's forward (F) and
  backward (B) timed around the executor's call (wall clock and the
  thread's CPU time), and the step's tokens per second;
- **alone**: one process, one thread, the same stages with the same
  weights, each micro-batch's F and B of both stages in plain torch
  (``stage(x)``, ``loss.backward()``, ``out.backward(grad)``) on the same
  shapes, timed the same way: the unsplit model, stage by stage.

- **replay** (``--where replay``): each stage's tasks in the pipeline's
  1F1B order with no runtime at all (inputs and output gradients made up,
  no messages), both stages at once in two processes; **replay1**: the
  same in one process, one stage after the other: what the order alone
  costs, apart from the runtime and from the second process.

``--lengths formed`` forms the ``variable`` step's sequences into
micro-batches by cost (:func:`hintpipe.form_batch`); ``--lengths sorted``
runs ``variable``'s micro-batches longest-first (``microbatch_order``).

A ratio of 1.00 means a task costs in the pipeline what the model costs on
its shapes. Every measurement is a process of its own with ``PYTHONPATH``
set to one source tree (``--tree LABEL=SRC``, repeatable: before and after
a change), and they alternate (trees, lengths, inside and alone), so that
other work on the machine slows every variant alike; the table sums every
repeat and lists each repeat's ratio.

Run from the repository root::

    .venv/bin/python benchmarks/shape-tax/shape_tax.py [--tree after=src --tree before=OTHER/src]
        [--repeats 3] [--steps 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HIDDEN = 128
CONFIG = {"name": "gpt-mini", "layers": 8, "hidden": HIDDEN, "heads": 4, "vocab": 512, "max_seq_len": 512}
MICROBATCHES = 8
SEQUENCES = 2  # per micro-batch
LENGTHS = {"equal": (64, 0.0), "variable": (64, 0.5)}  # and "formed": variable's sequences formed by cost
#: Lengths whose data are another's: ``formed`` and ``sorted`` run ``variable``'s sequences.
SAME_DATA = {"formed": "variable", "sorted": "variable"}

#: (stage, kind, micro-batch, wall seconds, CPU seconds) of one computation.
Timing = tuple[int, str, int, float, float]


def batch(lengths: str, step: int) -> tuple[list[Any], list[Any], list[int]]:
    """Step ``step``'s micro-batches (inputs, targets, tokens each): the same in every run. ``formed``: the
    ``variable`` step's sequences, formed into micro-batches by cost (:func:`hintpipe.form_batch`, cost
    proportional to tokens), padded to each micro-batch's longest."""
    from hintpipe.apps.models import ModelConfig, SeqLenDist, make_batch

    mean, sigma = LENGTHS[SAME_DATA.get(lengths, lengths)]
    config = ModelConfig(**CONFIG)  # type: ignore[arg-type]
    drawn = make_batch(config, MICROBATCHES, SEQUENCES, SeqLenDist(mean, sigma), step, data_seed=0)
    if lengths != "formed":
        return drawn
    import torch

    from hintpipe import form_batch

    inputs, targets, _ = drawn
    sequences = [torch.cat([x[r], y[r, -1:]]) for x, y in zip(inputs, targets, strict=True) for r in range(len(x))]
    formed = form_batch(sequences, MICROBATCHES, seed=step)
    counts = [int((y != -100).sum()) for y in formed.targets]
    return list(formed.inputs), formed.targets, counts


def stages() -> list[Any]:
    from hintpipe.apps.models import ModelConfig, build_layers, split_layers

    return split_layers(build_layers(ModelConfig(**CONFIG)), 2)  # type: ignore[arg-type]


def timed(log: list[Timing], stage: int, kind: str, mb: int, fn: Callable[[], Any]) -> Any:
    wall, cpu = time.perf_counter(), time.thread_time()
    result = fn()
    log.append((stage, kind, mb, time.perf_counter() - wall, time.thread_time() - cpu))
    return result


def inside_rank(rank: int, world: int, lengths: str, steps: int) -> dict[str, Any]:
    """One rank of the pipeline: every step's computations (executor calls), step times and tokens."""
    import hintpipe
    from hintpipe.apps.models import lm_loss

    computations: list[list[Timing]] = []
    step_times, tokens = [], []
    order = "longest-first" if lengths == "sorted" else "given"
    with hintpipe.Pipeline.from_modules(
        stages(), loss_fn=lm_loss, microbatches=MICROBATCHES, hint="1f1b", policy="fixed", microbatch_order=order
    ) as pipe:
        executor: Any = pipe.executor
        log: list[Timing] = []
        forward, backward = executor.forward, executor.backward

        def timed_forward(s: int, mb: int, *rest: Any) -> Any:
            return timed(log, s, "F", mb, lambda: forward(s, mb, *rest))

        def timed_backward(s: int, mb: int, grads: Any) -> Any:
            return timed(log, s, "B", mb, lambda: backward(s, mb, grads))

        executor.forward, executor.backward = timed_forward, timed_backward
        for step in range(steps):
            inputs, targets, counts = batch(lengths, step)
            log.clear()
            pipe.step(inputs, target=targets)
            for module in pipe.modules.values():
                module.zero_grad(set_to_none=True)
            computations.append(list(log))
            step_times.append(pipe.reports[-1].makespan)
            tokens.append(sum(counts))
    return {"computations": [computations], "step_times": step_times, "tokens": tokens}


def inside(lengths: str, steps: int) -> dict[str, Any]:
    import hintpipe

    ranks = hintpipe.run_ranks(inside_rank, 2, lengths, steps)
    return {**ranks[0], "computations": [c for r in ranks for c in r["computations"]]}


def alone(lengths: str, steps: int) -> dict[str, Any]:
    """The same computations in one process: per micro-batch F0, F1 (with the loss), B1, B0."""
    import torch

    from hintpipe.apps.models import lm_loss

    torch.set_num_threads(1)
    first, last = stages()
    computations: list[list[Timing]] = []
    step_times, tokens = [], []
    for step in range(steps):
        inputs, targets, counts = batch(lengths, step)
        log: list[Timing] = []
        began = time.perf_counter()
        for mb, (x, y) in enumerate(zip(inputs, targets, strict=True)):
            out: torch.Tensor = timed(log, 0, "F", mb, lambda: first(x))  # noqa: B023
            received = out.detach().requires_grad_(True)
            loss: torch.Tensor = timed(log, 1, "F", mb, lambda: lm_loss(last(received), y) / MICROBATCHES)  # noqa: B023
            timed(log, 1, "B", mb, lambda: torch.autograd.backward(loss))  # noqa: B023
            timed(log, 0, "B", mb, lambda: torch.autograd.backward(out, received.grad))  # noqa: B023
        step_times.append(time.perf_counter() - began)
        tokens.append(sum(counts))
        first.zero_grad(set_to_none=True)
        last.zero_grad(set_to_none=True)
        computations.append(log)
    return {"computations": [computations], "step_times": step_times, "tokens": tokens}


def one_f_one_b(stage: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s (of 2) tasks in 1F1B order: the last stage runs each micro-batch's F then B; the
    first runs one forward ahead, so two micro-batches (of different shapes) are alive at once."""
    if stage == 1:
        return [(kind, mb) for mb in range(MICROBATCHES) for kind in "FB"]
    order = [("F", 0)]
    for mb in range(1, MICROBATCHES):
        order += [("F", mb), ("B", mb - 1)]
    return [*order, ("B", MICROBATCHES - 1)]


def replay_stage(stage: int, module: Any, lengths: str, step: int, log: list[Timing]) -> None:
    """One step of ``stage``'s tasks in 1F1B order, without the pipeline: the same shapes, inputs and output
    gradients made up where a neighbour would send them (values do not change what a task costs)."""
    import torch

    from hintpipe.apps.models import lm_loss

    inputs, targets, _ = batch(lengths, step)
    generator = torch.Generator().manual_seed(step)
    alive: dict[int, tuple[Any, Any]] = {}
    for kind, mb in one_f_one_b(stage):
        if kind == "F":
            if stage == 0:
                x = inputs[mb]
            else:
                rows, length = inputs[mb].shape
                x = torch.randn((rows, length, HIDDEN), generator=generator).requires_grad_(True)
            if stage == 1:
                out = timed(log, stage, "F", mb, lambda: lm_loss(module(x), targets[mb]) / MICROBATCHES)  # noqa: B023
            else:
                out = timed(log, stage, "F", mb, lambda: module(x))  # noqa: B023
            alive[mb] = (out, None if stage == 1 else torch.randn(out.shape, generator=generator))
        else:
            out, grad = alive.pop(mb)
            timed(log, stage, "B", mb, lambda: torch.autograd.backward(out, grad))  # noqa: B023
    module.zero_grad(set_to_none=True)


def replay_rank(rank: int, world: int, lengths: str, steps: int) -> dict[str, Any]:
    """Rank ``rank`` replays its stage's 1F1B order alone, while the other rank replays its own (no messages)."""
    import torch.distributed as dist

    module = stages()[rank]
    computations: list[list[Timing]] = []
    step_times, tokens = [], []
    for step in range(steps):
        log: list[Timing] = []
        dist.barrier()
        began = time.perf_counter()
        replay_stage(rank, module, lengths, step, log)
        step_times.append(time.perf_counter() - began)
        tokens.append(sum(batch(lengths, step)[2]))
        computations.append(log)
    return {"computations": [computations], "step_times": step_times, "tokens": tokens}


def replay(lengths: str, steps: int) -> dict[str, Any]:
    """Both stages replayed at once, each in a process of its own (two cores), in 1F1B order, no messages."""
    import hintpipe

    ranks = hintpipe.run_ranks(replay_rank, 2, lengths, steps)
    step_times = [max(pair) for pair in zip(*(r["step_times"] for r in ranks), strict=True)]
    return {**ranks[0], "step_times": step_times, "computations": [c for r in ranks for c in r["computations"]]}


def replay_serial(lengths: str, steps: int) -> dict[str, Any]:
    """Both stages replayed in 1F1B order in one process, one after the other (one core at a time)."""
    import torch

    torch.set_num_threads(1)
    modules = stages()
    computations: list[list[list[Timing]]] = [[], []]
    step_times, tokens = [], []
    for step in range(steps):
        began = time.perf_counter()
        for stage, module in enumerate(modules):
            log: list[Timing] = []
            replay_stage(stage, module, lengths, step, log)
            computations[stage].append(log)
        step_times.append(time.perf_counter() - began)
        tokens.append(sum(batch(lengths, step)[2]))
    return {"computations": computations, "step_times": step_times, "tokens": tokens}


#: Where a measurement runs: the pipeline, the unsplit model stage by stage, and the 1F1B replays.
WHERE = {"inside": inside, "alone": alone, "replay": replay, "replay1": replay_serial}


def machine_busy() -> tuple[float, float]:
    """(CPU seconds the machine has been busy, CPU seconds of this process's finished children)."""
    import resource

    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = (sum(ticks[:3]) + sum(ticks[5:8])) / os.sysconf("SC_CLK_TCK")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, children.ru_utime + children.ru_stime


def measure(src: str, where: str, lengths: str, steps: int) -> tuple[dict[str, Any], float]:
    """One measurement in a process of its own on the tree at ``src``; and the cores other work kept busy."""
    env = dict(os.environ, PYTHONPATH=src)
    busy0, own0 = machine_busy()
    began = time.perf_counter()
    command = [sys.executable, __file__, "--measure", where, lengths, "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} (PYTHONPATH={src}) failed:\n{done.stderr[-3000:]}")
    busy1, own1 = machine_busy()
    load = max(0.0, (busy1 - busy0) - (own1 - own0)) / (time.perf_counter() - began)
    return json.loads(done.stdout.strip().splitlines()[-1]), load


def per_task(run: dict[str, Any], lengths: str) -> dict[tuple[int, str], list[float]]:
    """Per (stage, kind): [wall seconds, CPU seconds, tokens] summed over the measured steps (all but the first)."""
    sums: dict[tuple[int, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for rank_steps in run["computations"]:
        for step, log in enumerate(rank_steps):
            if step < SETTINGS["warmup"]:
                continue
            counts = batch(lengths, step)[2]
            for stage, kind, mb, wall, cpu in log:
                cell = sums[(stage, kind)]
                cell[0] += wall
                cell[1] += cpu
                cell[2] += counts[mb]
    return sums


#: Set from the command line: the steps every figure leaves out (the first, by default).
SETTINGS = {"warmup": 1}


def throughput(run: dict[str, Any]) -> float:
    warmup = SETTINGS["warmup"]
    return float(sum(run["tokens"][warmup:]) / sum(run["step_times"][warmup:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", metavar="LABEL=SRC", help="a source tree (default: this=src)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of every figure (default 1)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument(
        "--where",
        nargs="+",
        choices=[w for w in WHERE if w != "alone"],
        default=["inside"],
        help="what to compare with the unsplit model alone (replay: each stage's 1F1B order, no messages)",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        choices=["equal", "variable", "formed", "sorted"],
        default=["equal", "variable"],
        help="formed: the variable step's sequences formed into micro-batches by cost; sorted: variable's "
        "micro-batches run longest-first (the pipeline's microbatch_order)",
    )
    parser.add_argument("--measure", nargs=2, metavar=("WHERE", "LENGTHS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    SETTINGS["warmup"] = args.warmup
    if args.measure:
        where, lengths = args.measure
        print(json.dumps(WHERE[where](lengths, args.steps)))
        return
    trees = dict(t.split("=", 1) for t in (args.tree or ["this=src"]))
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    loads = []
    for repeat in range(args.repeats):
        labels = list(trees) if repeat % 2 == 0 else list(reversed(trees))
        for lengths in args.lengths if repeat % 2 == 0 else list(reversed(args.lengths)):
            for label in labels:
                for where in [*args.where, "alone"]:
                    run, load = measure(trees[label], where, lengths, args.steps)
                    runs[(label, where, lengths)].append(run)
                    loads.append(load)
                    print(
                        f"repeat {repeat} {label} {lengths} {where}: {throughput(run):,.0f} tokens/s "
                        f"(other work {load:.2f} cores)",
                        flush=True,
                    )
    sys.path.insert(0, next(iter(trees.values())))  # for batch(): the data are the same in every tree
    table = []
    print("\n| tree | lengths | where | stage | task | ms / 1k tokens | alone | / alone (wall) | (CPU) | each |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|---|")
    for label in trees:
        for lengths in args.lengths:
            for where in args.where:
                cells: dict[tuple[int, str], list[list[float]]] = collections.defaultdict(list)
                pairs = zip(runs[(label, where, lengths)], runs[(label, "alone", lengths)], strict=True)
                for a_run, b_run in pairs:
                    a, b = per_task(a_run, lengths), per_task(b_run, lengths)
                    for key in sorted(a):
                        cells[key].append([*a[key], *b[key]])
                for (stage, kind), values in sorted(cells.items()):
                    wall_in = sum(v[0] for v in values) / sum(v[2] for v in values)
                    wall_alone = sum(v[3] for v in values) / sum(v[5] for v in values)
                    cpu = sum(v[1] for v in values) / sum(v[4] for v in values)
                    each = " ".join(f"{v[0] / v[2] / (v[3] / v[5]):.2f}" for v in values)
                    row = {"tree": label, "lengths": lengths, "where": where, "stage": stage, "kind": kind}
                    table.append({**row, "ms_per_1k": 1e6 * wall_in, "alone_ms_per_1k": 1e6 * wall_alone, "cpu": cpu})
                    print(
                        f"| {label} | {lengths} | {where} | {stage} | {kind} | {1e6 * wall_in:.1f} | "
                        f"{1e6 * wall_alone:.1f} | {wall_in / wall_alone:.2f} | {cpu:.2f} | {each} |"
                    )
    print("\n| tree | where | lengths | tokens/s: against equal lengths | each repeat |")
    print("|---|---|---|---:|---|")
    ratios = {}
    for label in trees:
        for where in [*args.where, "alone"]:
            equal = [throughput(r) for r in runs.get((label, where, "equal"), [])]
            for lengths in (x for x in args.lengths if x != "equal" and equal):
                other = [throughput(r) for r in runs[(label, where, lengths)]]
                pooled = sum(other) / sum(equal)
                ratios[f"{label} {where} {lengths}"] = pooled
                each = " ".join(f"{v / e:.2f}" for e, v in zip(equal, other, strict=True))
                print(f"| {label} | {where} | {lengths} | {pooled:.2f} | {each} |")
    print(f"\nother work: up to {max(loads):.2f} cores during a measurement, {sum(loads) / len(loads):.2f} on average")
    if args.json:
        payload = {"table": table, "ratios": ratios, "loads": loads, "trees": trees}
        payload["tokens_per_s"] = {" ".join(k): [throughput(r) for r in v] for k, v in runs.items()}
        Path(args.json).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
