"""How hintpipe.plan cuts Hugging Face models: cuts and profiled stage times, GPT-2 and Llama, 2 to 4 stages.

Both from configs (8 layers, hidden 128, vocabulary 1000, random weights), one micro-batch of 4 x 64
tokens, captured through torch.export, profiled once per model (3 repeats) and planned into 2, 3 and 4
stages from those profiles with no memory budget: the cuts minimise the slowest stage. Prints one row per
model and stage count: the cuts (node positions), each stage's profiled time and parameters, and the
slowest over the fastest stage. With ``--measure``, each built stage's forward + backward is measured too
(:func:`hintpipe.planner.stage_timing.measure_stages`, the fastest of 5 runs, on the profile's clock): the
prediction's error per stage and the measured slowest over the mean. ``--whole-graph`` profiles the nodes
in runs of the whole graph (the GPU's way) instead of one by one.

    .venv/bin/python benchmarks/hf-models/plans.py [--measure] [--whole-graph] [--json FILE]

It runs against older trees too (``PYTHONPATH=/path/to/old/src``): plan()'s ``stages=`` keyword before 0.6.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
from typing import Any

import torch
import transformers
from torch import nn

from hintpipe.planner.capture import capture
from hintpipe.planner.plan import plan
from hintpipe.planner.profile import profile

KWARGS = {"use_cache": False}


def _models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=8, n_embd=128, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0
        )
    )
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=128, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=1000, max_position_embeddings=128, tie_word_embeddings=True,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )
    )  # fmt: skip
    return {"gpt2": gpt2, "llama": llama}


def _plan(model: nn.Module, example: torch.Tensor, stages: int, profiles: Any) -> Any:
    keyword = "ranks" if "ranks" in inspect.signature(plan).parameters else "stages"
    options: dict[str, Any] = {keyword: stages, "microbatches": 8, "profiles": profiles, "kwargs": KWARGS}
    return plan(model, example, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--measure", action="store_true", help="measure each built stage too")
    parser.add_argument("--whole-graph", action="store_true", help="profile in runs of the whole graph")
    args = parser.parse_args()
    torch.set_num_threads(1)
    example = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(0))
    rows: list[dict[str, Any]] = []
    head = "| model | stages | cuts | stage time ms (profiled) | stage parameters | slowest / fastest |"
    rule = "|---|---:|---|---|---|---:|"
    if args.measure:
        head += " stage time ms (measured) | measured / predicted | measured slowest / mean |"
        rule += "---|---|---:|"
    print(head)
    print(rule)
    for name, model in _models().items():
        graph = capture(model, example=(example,), kwargs=KWARGS)
        profiles = profile(graph, (example,), repeats=3, whole_graph=True if args.whole_graph else None)
        for stages in (2, 3, 4):
            planned = _plan(model, example, stages, profiles)
            cuts = list(planned.partition.cuts)
            times = [s.time_ms for s in planned.partition.stages]
            params = [sum(p.param_bytes for p in planned.profiles[a:b]) // 4 for a, b in itertools.pairwise(cuts)]
            ratio = max(times) / max(min(times), 1e-9)
            rows.append({"model": name, "stages": stages, "cuts": cuts, "time_ms": times, "parameters": params})
            shown = " / ".join(f"{t:.1f}" for t in times)
            line = f"| {name} | {stages} | {cuts} | {shown} | {' / '.join(f'{p:,}' for p in params)} | {ratio:.2f} |"
            if args.measure:
                from hintpipe.planner.stage_timing import measure_stages

                measured = [1e3 * t for t in measure_stages(planned, [example])]
                errors = [m / t for m, t in zip(measured, times, strict=True)]
                balance = max(measured) / (sum(measured) / len(measured))
                rows[-1] |= {"measured_ms": measured, "measured_over_predicted": errors, "measured_balance": balance}
                line += f" {' / '.join(f'{m:.1f}' for m in measured)} | {' / '.join(f'{e:.2f}' for e in errors)} |"
                line += f" {balance:.2f} |"
            print(line)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
