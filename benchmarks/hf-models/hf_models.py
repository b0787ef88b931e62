"""Hugging Face GPT-2 on real text: hintpipe against torch.distributed.pipelining.

GPT-2 (4 layers, hidden 128, 4 heads, byte vocabulary 256, positions 512),
random weights, captured through torch.export and cut into 2 stages by
``hintpipe.plan``; the same 2 stage modules run under every runtime. Data:
the Python standard library's source files (``--data stdlib``), 8
micro-batches of 2 documents per step, each micro-batch cropped to its
shorter document (at most 511 tokens): real, heavy-tailed lengths. 2 CPU
ranks, gloo, one thread each. Tokens/s counts real tokens only.

- hintpipe ``fixed`` and ``ready`` (1F1B hint, 2 micro-batches of slack): the
  micro-batches as they are.
- torch ``Schedule1F1B``, padded: every micro-batch padded to 511 tokens (torch
  fixes shapes at its first step), padding ignored by the loss.
- torch ``Schedule1F1B``, packed: the step's tokens concatenated and cut into
  8 micro-batches of 2 equal rows (the stronger baseline a careful torch user
  picks; attention then crosses document boundaries).

Then the planner: the largest micro-batch each partition fits under a stage
memory budget, for hintpipe's plan and the time- and parameter-balanced cuts.

    .venv/bin/python benchmarks/hf-models/hf_models.py [--steps N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from hintpipe.apps.corpus import stdlib_batch
from hintpipe.apps.hf_models import CALL_KWARGS, build_hf_model
from hintpipe.apps.model_config import ModelConfig
from hintpipe.planner.plan import Plan, plan
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline

MODEL = ModelConfig("hf-gpt2", layers=4, hidden=128, heads=4, vocab=256, max_seq_len=512)
MICROBATCHES, SIZE, LONGEST = 8, 2, 511
PACKED = 256  # packed row width: about the mean micro-batch length (263 tokens)
IGNORE = -100


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def step_data(step: int, layout: str) -> tuple[list[torch.Tensor], list[torch.Tensor], int, int]:
    """The step's micro-batches in ``layout`` (as is, padded, packed): inputs, targets, real and sent tokens."""
    xs, ys, counts = stdlib_batch(MICROBATCHES, SIZE, step, 0, MODEL.max_seq_len)
    real = sum(counts)
    if layout == "padded":
        xs = [F.pad(x, (0, LONGEST - x.shape[1]), value=0) for x in xs]
        ys = [F.pad(y, (0, LONGEST - y.shape[1]), value=IGNORE) for y in ys]
    elif layout == "packed":
        # Rows of a fixed width (torch fixes shapes at its first step), filled from the stream of this
        # and the following steps' documents: every token real, the step a fixed size.
        stream_x, stream_y = _stream(step)
        xs = list(stream_x.reshape(MICROBATCHES, SIZE, PACKED))
        ys = list(stream_y.reshape(MICROBATCHES, SIZE, PACKED))
        real = stream_x.numel()
    return xs, ys, real, sum(x.numel() for x in xs)


def _stream(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``step * n`` to ``(step + 1) * n`` of all steps' documents concatenated (``n`` a packed step)."""
    need = (step + 1) * MICROBATCHES * SIZE * PACKED
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    source = 0
    while sum(x.numel() for x in xs) < need:
        bx, by, _ = stdlib_batch(MICROBATCHES, SIZE, source, 0, MODEL.max_seq_len)
        xs += [x.reshape(-1) for x in bx]
        ys += [y.reshape(-1) for y in by]
        source += 1
    begin = step * MICROBATCHES * SIZE * PACKED
    return torch.cat(xs)[begin:need], torch.cat(ys)[begin:need]


def rank_run(rank: int, world: int, planned: Plan, runtime: str, steps: int) -> dict[str, Any]:
    torch.manual_seed(0)
    first, last = rank == 0, rank == world - 1
    pipe: Pipeline | None = None
    schedule: Schedule1F1B | None = None
    if runtime.startswith("hintpipe"):
        pipe = Pipeline.from_plan(
            planned, loss_fn=lm_loss, policy=runtime.split()[1], slack_microbatches=2, timeout=300
        )
        params = [p for m in pipe.modules.values() for p in m.parameters()]
    else:
        module = planned.build_stage(rank)
        params = list(module.parameters())
        x0, _, _, _ = step_data(0, runtime.split()[1])
        example: tuple[torch.Tensor, ...] = (x0[0],)
        for index in range(rank):
            out = planned.build_stage(index)(*example)
            example = out if isinstance(out, tuple) else (out,)
        outputs = module(*example)
        stage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=example, output_args=outputs)
        schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=lm_loss)
    optimizer = torch.optim.AdamW(list({id(p): p for p in params}.values()), lr=1e-3)
    times, real_tokens, sent_tokens = [], [], []
    for step in range(steps):
        xs, ys, real, sent = step_data(step, "as-is" if pipe is not None else runtime.split()[1])
        dist.barrier()
        began = time.perf_counter()
        if pipe is not None:
            pipe.step(xs if first else None, ys if last else None)
        elif first:
            assert schedule is not None
            schedule.step(torch.cat(xs), return_outputs=False)
        elif last:
            assert schedule is not None
            schedule.step(target=torch.cat(ys), return_outputs=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - began)
        real_tokens.append(real)
        sent_tokens.append(sent)
    if pipe is not None:
        pipe.close()
    return {"times": times, "real": real_tokens, "sent": sent_tokens}


def throughput(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Real tokens/s over the steps after the first (the slowest rank's step time), and the padding factor."""
    steps = range(1, len(runs[0]["times"]))
    seconds = [max(r["times"][s] for r in runs) for s in steps]
    real = [runs[0]["real"][s] for s in steps]
    sent = [runs[0]["sent"][s] for s in steps]
    return sum(real) / sum(seconds), sum(sent) / sum(real)


def planner_part(model: nn.Module, example: torch.Tensor) -> list[tuple[str, int]]:
    ample = plan(model, example, ranks=2, microbatches=MICROBATCHES, repeats=1, kwargs=CALL_KWARGS)
    budget = 0.6 * max(s.memory_bytes for s in ample.baselines["time"].stages)
    tight = plan(
        model, example, ranks=2, microbatches=MICROBATCHES, stage_memory=budget, profiles=ample.profiles,
        kwargs=CALL_KWARGS,
    )  # fmt: skip
    rows = [("budget bytes per stage", int(budget)), ("hintpipe plan", tight.partition.max_microbatch_size)]
    rows += [(f"{name} (memory-blind)", tight.baselines[name].max_microbatch_size) for name in ("time", "params")]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_hf_model(MODEL)
    example, _, _ = stdlib_batch(1, SIZE, 0, 0, MODEL.max_seq_len)
    planned = plan(model, example[0], ranks=2, microbatches=MICROBATCHES, repeats=3, kwargs=CALL_KWARGS)
    results: dict[str, Any] = {}
    for runtime in ("hintpipe fixed", "hintpipe ready", "torch padded", "torch packed"):
        runs = run_ranks(rank_run, 2, planned, runtime, args.steps, timeout=600)
        rate, padding = throughput(runs)
        results[runtime] = {"tokens_per_s": rate, "sent_per_real_token": padding}
        print(f"{runtime:16s} {rate:10,.0f} real tokens/s   sent/real tokens {padding:.2f}", flush=True)
    reference = results["torch packed"]["tokens_per_s"]
    for runtime, row in results.items():
        print(f"{runtime:16s} {row['tokens_per_s'] / reference:.3f}x torch packed")
    planner_rows = planner_part(model, example[0])
    for label, value in planner_rows:
        print(f"{label:28s} {value}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"runtimes": results, "planner": planner_rows, "cuts": list(planned.partition.cuts)}, handle)
    lengths = [x.shape[1] for x in stdlib_batch(256, SIZE, 0, 0, MODEL.max_seq_len)[0]]
    print(f"micro-batch lengths: median {statistics.median(lengths)}, max {max(lengths)}")


if __name__ == "__main__":
    main()
