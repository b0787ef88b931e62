"""The GPU check's Hugging Face part (checks 8 to 11): the user's path, a ``transformers`` model on the GPU.

8. **Planned on the GPU and on the CPU, trained on the GPU**: GPT-2 and a Llama-like model (tied embeddings)
   planned with the model on the device and on the host, the device's plan saved and loaded for the model on
   the host, each trained by 2 ranks sharing the GPU (``fixed``, ``ready``; ``bf16``), gradients against the
   unsplit model.
9. **Predicted against measured stage times**: plans of 2 and 4 stages made on the device, each built stage's
   forward + backward measured (:func:`hintpipe.measure_stages`); within 15% and balanced within 1.1 on CUDA.
10. **Throughput of GPT-2**: 2 ranks sharing the GPU, hintpipe ``fixed`` and ``ready`` (float32 and bf16)
    against the unsplit model in one process (the bound for ranks that time-share one GPU) and torch's
    ``Schedule1F1B`` on the same two stages.
11. **The largest micro-batch under a memory cap** (DawnPiper's figure, on real memory): per stage, under
    ``torch.cuda.set_per_process_memory_fraction``, the plan's stages with its recompute and offload against
    the compute-balanced cuts without them.

Sizes on CUDA: GPT-2 and Llama 12 layers, hidden 768 (the issue's GPT-2), vocabularies 50,257 and 32,000
(check 8: 4 layers); on CPU (the dry run), 2 layers of hidden 32. The rows' judgements are :mod:`judge`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers
from judge import (
    BALANCE_BOUND,
    BF16_GRAD_REL,
    GRAD_TOLERANCE,
    LOSS_REL,
    PREDICTION_BOUND,
    check,
    judge_hf_run,
    judge_memory_cap,
    judge_stage_times,
    judge_throughput,
    max_abs_diff,
)
from tables import TIMEOUT_S, configure, mib, synchronize
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.plan_file import load_plan, save_plan
from hintpipe.planner.search import PlanError
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


# -- 10. throughput of GPT-2 ----------------------------------------------------------------------------------


class HostStaged(nn.Module):
    """torch's stage on the host, its module on the device (torch's gloo moves no CUDA tensors): every boundary
    tensor moves to the device on the way in and back to the host on the way out, but the last stage's."""

    def __init__(self, inner: nn.Module, device: torch.device, last: bool) -> None:
        super().__init__()
        self.inner, self.device, self.last = inner.to(device), device, last

    def forward(self, *values: torch.Tensor) -> Any:
        out = self.inner(*(v.to(self.device) for v in values))
        if self.last:
            return out
        return tuple(t.to("cpu") for t in out) if isinstance(out, tuple) else out.to("cpu")


class TensorsOnly(nn.Module):
    """A built stage as torch's ``PipelineStage`` takes it, tensors in and out: the numbers a stage passes on
    (a sequence length for the next stage's positions) are the same for every micro-batch of one length, so
    they stay here as constants, put back among the inputs and left out of the outputs."""

    def __init__(self, inner: nn.Module, constants: dict[int, Any], last: bool) -> None:
        super().__init__()
        self.inner, self.constants, self.last = inner, constants, last

    def forward(self, *tensors: torch.Tensor) -> Any:
        values: list[Any] = list(tensors)
        for index in sorted(self.constants):
            values.insert(index, self.constants[index])
        out = self.inner(*values)
        if self.last:
            return out
        kept = tuple(t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor))
        return kept if len(kept) > 1 else kept[0]


def tensor_stages(planned: Plan, world: int, example: torch.Tensor) -> list[nn.Module]:
    """The plan's built stages wrapped in :class:`TensorsOnly`, each with the numbers it receives for
    micro-batches shaped like ``example`` (found by running the stages once on it, on the host)."""
    modules = [copy.deepcopy(planned).build_stage(i) for i in range(world)]
    values: tuple[Any, ...] = (example,)
    wrapped: list[nn.Module] = []
    with torch.no_grad():
        for index, module in enumerate(modules):
            constants = {i: v for i, v in enumerate(values) if not isinstance(v, torch.Tensor)}
            wrapped.append(TensorsOnly(module, constants, index == world - 1))
            if index < world - 1:
                out = module(*values)
                values = out if isinstance(out, tuple) else (out,)
    return wrapped


def throughput_rank(rank: int, world: int, device_name: str, planned: Plan, runs: list[str]) -> list[list[float]]:
    """Per run, this rank's seconds per step (from a barrier to its device's work done)."""
    device = configure(device_name)
    sizes = hf_sizes(device_name)
    first, last = rank == 0, rank == world - 1
    out = []
    for run in runs:
        runtime, policy, precision = run.split()
        if runtime == "hintpipe":
            pipe = Pipeline.from_plan(
                copy.deepcopy(planned), loss_fn=lm_loss, policy=policy, precision=precision, device=device_name,
                transport="gloo", timeout=TIMEOUT_S, memory_slack=2,
            )  # fmt: skip
            params = [p for m in pipe.modules.values() for p in m.parameters()]

            def step(xs: list[torch.Tensor], ys: list[torch.Tensor], pipe: Pipeline = pipe) -> None:
                pipe.step(xs if first else None, ys if last else None)

        else:
            pipe = None
            step, params = torch_schedule(rank, world, planned, device, sizes)
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        times = []
        for index in range(sizes.steps):
            xs, ys = batch("gpt2", sizes, index, variable=False)
            dist.barrier()
            synchronize(device)
            start = time.perf_counter()
            step(xs, ys)
            synchronize(device)
            times.append(time.perf_counter() - start)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if pipe is not None:
            pipe.close()
        out.append(times)
    return out


def torch_schedule(
    rank: int, world: int, planned: Plan, device: torch.device, sizes: HfSizes
) -> tuple[Any, list[nn.Parameter]]:
    """torch's ``Schedule1F1B`` over this rank's built stage (host-staged boundaries on CUDA)."""
    example = batch("gpt2", sizes, 0, variable=False)[0][0]
    modules = tensor_stages(planned, world, example)
    where = torch.device("cpu")
    stages = [HostStaged(m, device, i == world - 1) if device.type == "cuda" else m for i, m in enumerate(modules)]
    values: tuple[torch.Tensor, ...] = (example,)
    for module in stages[:rank]:
        out = module(*values)
        values = out if isinstance(out, tuple) else (out,)
    outputs = stages[rank](*values)
    stage = PipelineStage(stages[rank], rank, world, where, input_args=values, output_args=outputs)
    schedule = Schedule1F1B(stage, sizes.microbatches, loss_fn=lm_loss)

    def step(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
        if rank == 0:
            schedule.step(torch.cat(xs), return_outputs=False)
        elif rank == world - 1:
            schedule.step(target=torch.cat(ys), losses=[], return_outputs=False)
        else:
            schedule.step(return_outputs=False)

    return step, list(stages[rank].parameters())


def unsplit_seconds(model: nn.Module, sizes: HfSizes, device: torch.device, bf16: bool) -> float:
    """The unsplit model's step (forward + backward of every micro-batch, AdamW) in one process: the median over
    the steps after the first."""
    placed = copy.deepcopy(model).to(device)
    optimizer = torch.optim.AdamW(placed.parameters(), lr=1e-4)
    times = []
    for index in range(sizes.steps):
        xs, ys = batch("gpt2", sizes, index, variable=False)
        synchronize(device)
        start = time.perf_counter()
        unsplit_step(placed, xs, ys, device, bf16)
        synchronize(device)
        times.append(time.perf_counter() - start)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return statistics.median(times[1:] or times)


def check_hf_throughput(device_name: str, result: Any, group_timeout_s: float) -> None:
    device = configure(device_name)
    sizes = hf_sizes(device_name)
    model = build("gpt2", sizes)
    planned = plan_for(model, "gpt2", sizes, device)
    planned.graph.module.cpu()  # the ranks build their stages on the device from the host's copy
    runs = [f"hintpipe {p} {x}" for x in ("fp32", "bf16") for p in ("fixed", "ready")]
    measured: dict[str, float | str] = {}
    try:
        per_rank = run_ranks(
            throughput_rank, 2, device_name, planned, runs, timeout=group_timeout_s, device=device_name
        )
        for i, run in enumerate(runs):
            steps = [max(t) for t in zip(*(r[i] for r in per_rank), strict=True)][1:]
            measured[run] = statistics.median(steps)
    except Exception as exc:  # the rows say why
        for run in runs:
            measured[run] = f"could not run: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    torch_run = "torch Schedule1F1B fp32" + (" (host-staged boundaries)" if device_name == "cuda" else "")
    try:
        per_rank = run_ranks(
            throughput_rank, 2, device_name, planned, ["torch 1f1b fp32"], timeout=group_timeout_s, device=device_name
        )
        measured[torch_run] = statistics.median([max(t) for t in zip(*(r[0] for r in per_rank), strict=True)][1:])
    except Exception as exc:  # torch's failing is a finding, not the check's failure
        measured[torch_run] = f"could not run: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    bounds = {precision: unsplit_seconds(model, sizes, device, precision == "bf16") for precision in ("fp32", "bf16")}
    tokens = sizes.microbatches * sizes.microbatch_size * sizes.seq_len
    result.headers = ["run", "step ms", "tokens/s", "over the unsplit model's step"]
    for label, value in [*measured.items(), *((f"unsplit model in one process {p}", s) for p, s in bounds.items())]:
        if isinstance(value, str):
            result.rows.append([label, "-", "-", value])
            continue
        bound = bounds["bf16" if "bf16" in label else "fp32"]
        result.rows.append([label, f"{value * 1e3:.1f}", f"{tokens / value:,.0f}", f"{value / bound:.3f}x"])
    result.data = {"step_s": measured, "unsplit_step_s": bounds}
    run_steps = {label: measured[label] for label in runs}
    run_bounds = {label: bounds[label.split()[-1]] for label in runs}
    fp32 = [label for label in runs if label.endswith("fp32")]
    result.judge(judge_throughput(run_steps, run_bounds, measured[torch_run], fp32, device_name))
    failed = [label for label in runs if isinstance(measured[label], str)]
    result.summary = "Every hintpipe run ran." if not failed else f"hintpipe runs failed: {', '.join(failed)}."
    result.notes += [
        f"GPT-2 {sizes.layers} layers, hidden {sizes.hidden}, 2 stages on 2 ranks sharing one {device_name}; "
        f"{sizes.microbatches} micro-batches of {sizes.microbatch_size} x {sizes.seq_len} tokens, {sizes.steps} steps "
        "with AdamW, the first left out, median step (the slowest rank's); hint 1f1b, memory slack 2, gloo.",
        "The unsplit model in one process runs both stages' work in sequence with no pipeline: the bound for ranks "
        "that time-share one GPU; the last column is each run's step over it (1.000x: no overhead).",
    ]


# -- 11. the largest micro-batch under a memory cap -----------------------------------------------------------


def trains_under_cap(planned: Plan, size: int, name: str, sizes: HfSizes, device: torch.device, cap: float) -> bool:
    """Whether every stage of ``planned`` trains micro-batches of ``size`` rows under ``cap`` bytes of this
    process's device memory: parameters, AdamW state, and 1F1B's in-flight micro-batches (stage s of p holds
    p - s) kept for backward, each stage on its own."""
    values: tuple[Any, ...] | None = (example(name, sizes, torch.device("cpu"), size),)
    stages = planned.num_stages
    for index in range(stages):
        assert values is not None
        values = _one_stage(planned.build_stage(index), values, stages - index, device, cap)
        if values is None:
            return False
    return True


def _one_stage(
    module: nn.Module, values: tuple[Any, ...], inflight: int, device: torch.device, cap: float
) -> tuple[Any, ...] | None:
    """The stage's outputs (the next stage's inputs, on the host) if it trained under the cap, else None."""
    gc.collect()
    torch.cuda.empty_cache()
    placed = copy.deepcopy(module).to(device)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        optimizer = torch.optim.AdamW(placed.parameters(), lr=1e-4)
        kept = []
        for _ in range(inflight):
            leaves = [
                v.to(device).detach().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v
                for v in values
            ]
            out = placed(*leaves)
            outputs = out if isinstance(out, tuple) else (out,)
            kept.append([t for t in outputs if t.requires_grad])
        for grads_from in kept:
            torch.autograd.backward(grads_from, [torch.ones_like(t) for t in grads_from])
        optimizer.step()
        synchronize(device)
        return tuple(t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in outputs)
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        del placed
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def check_memory_cap(device_name: str, result: Any) -> None:
    device = configure(device_name)
    sizes = hf_sizes(device_name)
    model = build("gpt2", sizes)
    ample = plan_for(model, "gpt2", sizes, device)
    ample.graph.module.cpu()  # nothing of the planning stays on the device, under the cap
    reuse: dict[str, Any] = {"captured": ample.graph, "profiles": ample.profiles}
    busiest = max(s.memory_bytes for s in ample.baselines["time"].stages)
    for fraction in BUDGET_FRACTIONS:  # the tightest budget the plan fits at the base size
        budget = fraction * busiest
        try:
            predicted_plan = plan_for(model, "gpt2", sizes, device, stage_memory=budget, **reuse)
            break
        except PlanError:
            continue
    else:
        raise PlanError(f"no budget of {BUDGET_FRACTIONS} x the busiest stage's {mib(busiest)} MiB fits a plan")
    rows: dict[str, dict[str, Any]] = {}
    base = sizes.microbatch_size
    for label in ("hintpipe plan (recompute / offload)", "time-balanced cuts, nothing saved"):
        rows[label] = {"predicted": 0, "measured": 0, "tried": []}
    rows["hintpipe plan (recompute / offload)"]["predicted"] = predicted_plan.partition.max_microbatch_size
    rows["time-balanced cuts, nothing saved"]["predicted"] = predicted_plan.baselines["time"].max_microbatch_size
    if device_name == "cuda":
        for size in sorted({base * k for k in (1, 2, 3, 4, 6, 8, 12, 16)}):
            for label, row in rows.items():
                if row["measured"] < size - base and row["tried"]:
                    continue  # failed at a smaller size already
                try:
                    planned = plan_for(model, "gpt2", sizes, device, stage_memory=budget, microbatch_size=size, **reuse)
                except PlanError:
                    row["tried"].append((size, "no plan"))
                    continue
                if label.startswith("time"):
                    planned = dataclasses.replace(planned, partition=planned.baselines["time"])
                ok = trains_under_cap(planned, size, "gpt2", sizes, device, budget)
                row["tried"].append((size, ok))
                if ok:
                    row["measured"] = size
    result.headers = [
        "partition",
        "largest micro-batch (planner)",
        "largest micro-batch (measured under the cap)",
        "tried",
    ]
    for label, row in rows.items():
        measured = str(row["measured"]) if device_name == "cuda" else "- (CUDA only)"
        tried = ", ".join(f"{s}: {'yes' if ok is True else 'no' if ok is False else ok}" for s, ok in row["tried"])
        result.rows.append([label, str(row["predicted"]), measured, tried or "-"])
    result.data = {"budget_bytes": budget, "fraction": fraction, "rows": rows}
    plan_row, cuts_row = rows.values()
    planned_pair = (plan_row["predicted"], cuts_row["predicted"])
    measured_pair = (plan_row["measured"], cuts_row["measured"]) if device_name == "cuda" else None
    result.judge(judge_memory_cap(planned_pair, measured_pair, device_name))
    ours, theirs = measured_pair or planned_pair
    result.summary = (
        f"Under {mib(budget)} MiB per stage the plan trains micro-batches of up to {ours} rows, the compute-balanced "
        f"cuts {theirs}." + ("" if device_name == "cuda" else " (planner's figures: no cap on a CPU)")
    )
    result.notes += [
        f"GPT-2 {sizes.layers} layers, hidden {sizes.hidden}, 2 stages, 1F1B with {sizes.microbatches} micro-batches; "
        f"rows of {sizes.seq_len} tokens. The cap: the tightest of {BUDGET_FRACTIONS} x the time-balanced cuts' "
        f"busiest stage at {base} rows that the plan fits ({result.data['fraction']:g}) "
        "(parameters, gradients, AdamW state, in-flight activations), set with "
        "`torch.cuda.set_per_process_memory_fraction` while each stage alone trains its in-flight micro-batches.",
    ]
