"""The GPU check's Hugging Face part (checks 8 to 11): the user's path, a ``transformers`` model on the GPU.

8. **Planned on the GPU and on the CPU, trained on the GPU**: GPT-2 and a Llama-like model (tied embeddings)
   planned with the model on the device and on the host, the device's plan saved and loaded for the model on
   the host, each trained by 2 ranks sharing the GPU (``fixed``, ``ready``; ``bf16``), gradients against the
   unsplit model.
9. **Predicted against measured stage times**: plans of 2 and 4 stages made on the device, each built stage's
   forward + backward measured (:func:`hintpipe.measure_stages`); within 15% and balanced within 1.1 on CUDA.
10. **Throughput of GPT-2** and 11. **the largest micro-batch under a memory cap** are :mod:`hf_speed`'s.

Sizes on CUDA: GPT-2 and Llama 12 layers, hidden 768 (the issue's GPT-2), vocabularies 50,257 and 32,000
(check 8: 4 layers); on CPU (the dry run), 2 layers of hidden 32. The rows' judgements are :mod:`judge`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from judge import (
    BALANCE_BOUND,
    BF16_GRAD_REL,
    GRAD_TOLERANCE,
    LOSS_REL,
    PREDICTION_BOUND,
    check,
    judge_hf_run,
    judge_stage_times,
    max_abs_diff,
)
from tables import TIMEOUT_S, configure
from torch import nn

from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.plan_file import load_plan, save_plan
from hintpipe.planner.stage_timing import measure_stages
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline

KWARGS = {"use_cache": False}
MODELS = ("gpt2", "llama")
#: Check 11's budgets, as fractions of the compute-balanced cuts' busiest stage, tightest first.
BUDGET_FRACTIONS = (0.6, 0.7, 0.8, 0.9, 1.0)


@dataclasses.dataclass(frozen=True)
class HfSizes:
    """The Hugging Face checks' sizes on one device."""

    layers: int
    hidden: int
    heads: int
    vocab: dict[str, int]
    microbatch_size: int
    seq_len: int
    microbatches: int
    steps: int
    repeats: int


def hf_sizes(device: str) -> HfSizes:
    if device == "cuda":
        return HfSizes(12, 768, 12, {"gpt2": 50257, "llama": 32000}, 4, 256, 8, 4, 5)
    return HfSizes(2, 32, 2, {"gpt2": 64, "llama": 64}, 2, 16, 4, 2, 2)


def build(name: str, sizes: HfSizes, seed: int = 0) -> nn.Module:
    """GPT-2 or a Llama-like model (tied embeddings) from a config, dropout off, weights from ``seed``."""
    torch.manual_seed(seed)
    positions = 4 * sizes.seq_len
    model: nn.Module
    if name == "gpt2":
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                n_layer=sizes.layers, n_embd=sizes.hidden, n_head=sizes.heads, vocab_size=sizes.vocab[name],
                n_positions=positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                eos_token_id=0,
            )
        )  # fmt: skip
    else:
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                hidden_size=sizes.hidden, intermediate_size=4 * sizes.hidden, num_hidden_layers=sizes.layers,
                num_attention_heads=sizes.heads, num_key_value_heads=sizes.heads, vocab_size=sizes.vocab[name],
                max_position_embeddings=positions, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                pad_token_id=0,
            )
        )  # fmt: skip
    return model


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten().to(logits.device))


def batch(name: str, sizes: HfSizes, step: int, variable: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One step's micro-batches (inputs, labels) on the host: fixed length, or lognormal lengths (sigma 0.5) of
    about the same mean."""
    g = torch.Generator().manual_seed(1000 + step)
    xs, ys = [], []
    for _ in range(sizes.microbatches):
        length = sizes.seq_len
        if variable:
            length = max(
                4,
                min(
                    3 * sizes.seq_len, round(sizes.seq_len * math.exp(0.5 * torch.randn(1, generator=g).item() - 0.125))
                ),
            )
        ids = torch.randint(0, sizes.vocab[name], (sizes.microbatch_size, length + 1), generator=g)
        xs.append(ids[:, :-1])
        ys.append(ids[:, 1:])
    return xs, ys


def example(name: str, sizes: HfSizes, device: torch.device, size: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    rows = size or sizes.microbatch_size
    return torch.randint(0, sizes.vocab[name], (rows, sizes.seq_len), generator=g).to(device)


def plan_for(model: nn.Module, name: str, sizes: HfSizes, device: torch.device, ranks: int = 2, **extra: Any) -> Plan:
    """``model`` planned with it on ``device`` (a copy: the caller's model stays where it is); given a capture
    and its profiles (``captured=``, ``profiles=``), nothing is captured or run again."""
    options: dict[str, Any] = {"ranks": ranks, "microbatches": sizes.microbatches, "repeats": sizes.repeats}
    if "captured" in extra:
        return plan(model, example(name, sizes, torch.device("cpu")), kwargs=KWARGS, **(options | extra))
    placed = copy.deepcopy(model).to(device)
    return plan(placed, example(name, sizes, device), kwargs=KWARGS, **(options | extra))


def named_grads(modules: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().cpu() for m in modules for n, p in m.named_parameters() if p.grad is not None}


# -- 8. planned on the GPU and on the CPU, trained on the GPU ----------------------------------------------------


def training_sizes(device: str) -> HfSizes:
    """Check 8's sizes: at most 4 layers (two per stage), as a plan's portability and its gradients do not need
    depth, and the plan made on the host profiles the model on the CPU."""
    sizes = hf_sizes(device)
    return dataclasses.replace(sizes, layers=min(sizes.layers, 4))


def training_rank(rank: int, world: int, device: str, name: str, plans: dict[str, Plan]) -> dict[str, Any]:
    """Per plan and run, one step on variable lengths: the loss (rank 0's, broadcast) and this rank's gradients."""
    configure(device)
    sizes = training_sizes(device)
    xs, ys = batch(name, sizes, 0, variable=True)
    out: dict[str, Any] = {}
    runs = [(where, policy, "fp32") for where in plans for policy in ("fixed", "ready")]
    runs.append(("device", "ready", "bf16"))
    for where, policy, precision in runs:
        pipe = Pipeline.from_plan(
            copy.deepcopy(plans[where]), loss_fn=lm_loss, policy=policy, precision=precision, device=device,
            transport="gloo", timeout=TIMEOUT_S,
        )  # fmt: skip
        with pipe:
            loss = pipe.step(xs if rank == 0 else None, ys if rank == world - 1 else None, broadcast_loss=True)
            grads = named_grads(pipe.modules.values())
        out[f"{where} {policy} {precision}"] = {"loss": float(loss) if loss is not None else math.nan, "grads": grads}
    return out


def unsplit_step(
    model: nn.Module, xs: list[torch.Tensor], ys: list[torch.Tensor], device: torch.device, bf16: bool
) -> float:
    """The step on the unsplit model: each micro-batch's loss over their count, as the pipeline divides it."""
    total = 0.0
    for x, y in zip(xs, ys, strict=True):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = lm_loss(model(x.to(device), **KWARGS).logits, y.to(device)) / len(xs)
        torch.autograd.backward(loss)
        total += float(loss.detach())
    return total


def check_hf_training(device_name: str, result: Any, group_timeout_s: float) -> None:
    device = configure(device_name)
    sizes = training_sizes(device_name)
    result.headers = ["model", "planned on", "policy", "precision", "loss", "unsplit loss", "max abs grad diff"]
    result.left = 4
    for name in MODELS:
        model = build(name, sizes)
        plans = {
            "device": plan_for(model, name, sizes, device),
            "host": plan_for(model, name, sizes, torch.device("cpu")),
        }
        with tempfile.TemporaryDirectory() as folder:
            saved = save_plan(plans["device"], Path(folder) / f"{name}.plan")
            loaded, _ = load_plan(saved, model)  # the device's plan, for the model on the host
        portable = loaded.fingerprint == plans["device"].fingerprint
        shown = f"fingerprint {loaded.fingerprint[:12]} against {plans['device'].fingerprint[:12]}"
        result.judge([check(f"{name}: the device's plan file loads on the host", portable, shown, "same fingerprint")])
        result.data[f"{name} plan file from the device loads on the host"] = portable
        xs, ys = batch(name, sizes, 0, variable=True)
        reference = copy.deepcopy(model).to(device)
        unsplit = {"fp32": unsplit_step(reference, xs, ys, device, bf16=False)}
        expected = {"fp32": named_grads([reference])}
        reference.zero_grad(set_to_none=True)
        unsplit["bf16"] = unsplit_step(reference, xs, ys, device, bf16=True)
        expected["bf16"] = named_grads([reference])
        per_rank = run_ranks(training_rank, 2, device_name, name, plans, timeout=group_timeout_s, device=device_name)
        for label, run in per_rank[0].items():
            where, policy, precision = label.split()
            got = {k: v for r in per_rank for k, v in r[label]["grads"].items()}
            result.judge(
                judge_hf_run(f"{name} {label}", run["loss"], unsplit[precision], got, expected[precision], device_name)
            )
            on = {"device": device_name, "host": "cpu (host)"}[where]
            worst = f"{max_abs_diff(got, expected[precision]):.2e}"
            result.rows.append([name, on, policy, precision, f"{run['loss']:.6f}", f"{unsplit[precision]:.6f}", worst])
    result.summary = (
        "Both models, planned on either device, train on this one as the unsplit model does."
        if result.passed
        else "A Hugging Face run differs from the unsplit model, or a plan did not travel (rows, data)."
    )
    rtol, atol = GRAD_TOLERANCE[device_name]
    result.notes += [
        f"{sizes.layers} layers, hidden {sizes.hidden}; {sizes.microbatches} micro-batches of "
        f"{sizes.microbatch_size} sequences of lognormal lengths about {sizes.seq_len}; 2 ranks on one "
        f"{device_name}, gloo transport; one step.",
        f"float32: every gradient |diff| <= {atol:g} + {rtol:g} x |unsplit|, loss within {LOSS_REL['fp32']:g}; bf16: "
        f"every gradient tensor's max |diff| within {BF16_GRAD_REL:g} of its own max |unsplit|, the loss within "
        f"{LOSS_REL['bf16']:g}, against the unsplit model under the same autocast.",
        "`planned on` the host: the plan made with the model on the CPU, as `hintpipe plan` makes it; every plan also "
        "travels to the ranks pickled. The device's plan was saved and loaded for the model on the host: "
        + ", ".join(f"{k}: {v}" for k, v in result.data.items()),
    ]


# -- 9. predicted against measured stage times ---------------------------------------------------------------


def check_stage_times(device_name: str, result: Any) -> None:
    device = configure(device_name)
    sizes = hf_sizes(device_name)
    result.headers = [
        "model",
        "stages",
        "predicted ms",
        "measured ms",
        "measured / predicted",
        "measured slowest / mean",
    ]
    result.left = 2
    for name in MODELS:
        model = build(name, sizes)
        first = plan_for(model, name, sizes, device)
        for stages in (2, 4):  # one capture and profile for both
            planned = (
                first
                if stages == 2
                else plan_for(model, name, sizes, device, ranks=stages, captured=first.graph, profiles=first.profiles)
            )
            predicted = [s.time_ms for s in planned.partition.stages]
            measured = [1e3 * t for t in measure_stages(planned, [example(name, sizes, device)], repeats=5)]
            ratios = [m / p for m, p in zip(measured, predicted, strict=True)]
            balance = max(measured) / statistics.mean(measured)
            result.judge(judge_stage_times(f"{name} {stages} stages", predicted, measured, device_name))
            result.rows.append(
                [
                    name,
                    str(stages),
                    " / ".join(f"{p:.2f}" for p in predicted),
                    " / ".join(f"{m:.2f}" for m in measured),
                    " / ".join(f"{r:.2f}" for r in ratios),
                    f"{balance:.3f}",
                ]
            )
            result.data[f"{name} {stages}"] = {
                "predicted_ms": predicted,
                "measured_ms": measured,
                "cuts": list(planned.partition.cuts),
            }
    result.summary = (
        f"Bounds: every stage within {PREDICTION_BOUND:.0%} of its prediction, slowest / mean <= {BALANCE_BOUND}"
        + ("." if device_name == "cuda" else "; on CUDA only: a dry run's tiny stages are the machine's noise.")
    )
    result.notes += [
        f"Planned on {device_name} with the model there ({sizes.repeats} profile repeats); measured: each built "
        f"stage's forward + backward on one micro-batch of {sizes.microbatch_size} x {sizes.seq_len} tokens, fed "
        "the previous stage's outputs, the fastest of 5 runs after a warm-up (CUDA events; a CPU thread's clock).",
    ]
