"""Planner accuracy on a GPU: predicted activation bytes against ``torch.cuda.max_memory_allocated``.

On CPU the planner's predictions are checked against saved-tensor accounting
(tests/test_planner.py). On a CUDA device this script measures what the
allocator actually holds: for each planned stage, the peak memory allocated by
one micro-batch's forward (activations kept for backward plus outputs), with
the stage's recompute choices applied, against the plan's prediction.

Run on a machine with a GPU:  python benchmarks/planner-gpu-memory/planner_gpu_memory.py [--budget 64MiB]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch
from hintpipe.planner.plan import plan
from hintpipe.runtime.executor import as_input


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", default="1GiB", help="memory budget per stage for the plan")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--microbatch-size", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script measures GPU memory; on CPU see tests/test_planner.py", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    config = ModelConfig(
        "gpt-mini", layers=args.layers, hidden=args.hidden, heads=8, vocab=256, max_seq_len=args.seq_len + 1
    )
    model = nn.Sequential(*build_layers(config)).to(device)
    inputs, targets, _ = make_batch(config, 1, args.microbatch_size, SeqLenDist(args.seq_len), 0)
    x, y = inputs[0].to(device), targets[0].to(device)
    planned = plan(model, x, stages=4, microbatches=8, memory_budget=args.budget, repeats=3)
    print(
        f"gpt-mini {args.layers} blocks, hidden {args.hidden}, {args.microbatch_size} x {args.seq_len} tokens, "
        f"budget {args.budget}"
    )
    print("| stage | recomputed nodes | predicted MiB / micro-batch | measured MiB | ratio |")
    print("|---|---:|---:|---:|---:|")
    values: list[torch.Tensor] = [x]
    for index, stage in enumerate(planned.partition.stages):
        module = planned.build_stage(index).to(device)
        stage_inputs = [as_input(v) if index else v for v in values]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = module(*stage_inputs)
        outputs = list(out) if isinstance(out, tuple) else [out]
        if index == len(planned.partition.stages) - 1:
            outputs = [lm_loss(outputs[0], y)]
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - base + sum(t.numel() * t.element_size() for t in stage_inputs)
        predicted = stage.activation_bytes
        print(
            f"| {index} | {len(stage.recompute)} | {predicted / 2**20:.2f} | {held / 2**20:.2f} | "
            f"{held / max(predicted, 1):.3f} |"
        )
        torch.autograd.backward(outputs[0].sum() if outputs[0].dim() else outputs[0])
        values = [o.detach() for o in outputs] if index < len(planned.partition.stages) - 1 else []
    return 0


if __name__ == "__main__":
    sys.exit(main())
