"""Identical work through torch.distributed.pipelining's schedules and through hintpipe's hints.

The same model (a GPT of hintpipe's own layers: embedding, ``--layers`` blocks of width ``--hidden``, norm and
head, cut into even stages), the same packed rows (every micro-batch ``--rows`` rows of ``--seq`` tokens, the
same on every step, so nothing varies), the same AdamW, the same launcher (:func:`hintpipe.run_ranks`, gloo,
one thread per rank). Each run trains ``--steps`` steps and times the last ``--steps - --warmup``; runs are
interleaved round by round (every configuration once per round) so that a noisy machine's drift falls on all
of them alike, and the table gives each configuration's median tokens/s over the rounds, its spread (min-max)
and its ratio to torch's ``Schedule1F1B``.

Torch's interleaved schedules need two stages per rank; hintpipe's matching hints (``interleaved-1f1b``,
``zbv``) run the same two-stages-per-rank cut. ``--emulate`` adds the simulator's prediction of each
hintpipe row from the stage costs measured by the runtime itself.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import hintpipe
from hintpipe import run_ranks
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.models import gpt_layers, layer_bounds, lm_loss
from hintpipe.apps.prediction import predict_step_time
from hintpipe.apps.split_costs import measure_stage_costs
from hintpipe.dispatch.policy import Policy
from hintpipe.sim.hint_choice import choose_hint, predicted_steps


@dataclass(frozen=True)
class Run:
    """One configuration: which library, which schedule or hint, which policy, stages per rank."""

    library: str  # "torch" or "hintpipe"
    schedule: str  # torch's class name, or hintpipe's hint
    policy: str = ""  # hintpipe only: fixed, ready
    per_rank: int = 1
    send_thread: bool = False  # hintpipe only: a CPU rank's sends posted by a thread of their own (not the default)

    @property
    def name(self) -> str:
        if self.library == "torch":
            return f"torch {self.schedule}"
        return f"hintpipe {self.schedule}, {self.policy}" + (", send thread" if self.send_thread else "")


TORCH_RUNS = [
    Run("torch", "Schedule1F1B"),
    Run("torch", "ScheduleInterleaved1F1B", per_rank=2),
    Run("torch", "ScheduleInterleavedZeroBubble", per_rank=2),
]
HINTPIPE_RUNS = [
    Run("hintpipe", hint, policy, per_rank)
    for hint, per_rank in (("1f1b", 1), ("zb-h1", 1), ("bfw", 1), ("interleaved-1f1b", 2), ("zbv", 2))
    for policy in ("fixed", "ready")
] + [
    Run("hintpipe", hint, policy, per_rank, send_thread=True)
    for hint, per_rank in (("1f1b", 1), ("zb-h1", 1), ("bfw", 1), ("interleaved-1f1b", 2), ("zbv", 2))
    for policy in ("fixed", "ready")
]


def stages(args: argparse.Namespace, count: int) -> list[nn.Module]:
    """The model cut into ``count`` even stages: embedding with the first, norm and head with the last."""
    if args.model == "hf-gpt2":
        layers = hf_gpt2_layers(args)
    else:
        config = ModelConfig(
            name="gpt-mini", layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab, seed=0
        )
        layers = gpt_layers(config)
    bounds = layer_bounds(len(layers), count)
    return [nn.Sequential(*layers[a:b]) for a, b in itertools.pairwise(bounds)]


class GPT2Embedding(nn.Module):
    """A ``GPT2LMHeadModel``'s token and position embeddings, as a layer of its own."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.wte, self.wpe = model.transformer.wte, model.transformer.wpe

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[-1], device=ids.device)
        hidden: torch.Tensor = self.wte(ids) + self.wpe(positions)
        return hidden


class GPT2Layer(nn.Module):
    """One of Hugging Face's ``GPT2Block``s taking and giving the hidden states alone (causal: no mask given,
    so attention is causal, as the whole model's is on rows without padding)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.block(hidden)
        given: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return given


class GPT2Head(nn.Module):
    """The final norm and the language-model head."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.norm, self.head = model.transformer.ln_f, model.lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.norm(hidden))
        return logits


def hf_gpt2_layers(args: argparse.Namespace) -> list[nn.Module]:
    """Hugging Face's ``GPT2LMHeadModel`` (from a config of these widths, dropout 0, weights from seed 0) as a list
    of layers: the embeddings, each ``GPT2Block`` and the head. The head's weight is not tied to the embedding,
    which torch's ``PipelineStage`` cannot share across ranks; both libraries train the same untied model."""
    import transformers

    config = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq,
        n_embd=args.hidden,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    return [GPT2Embedding(model), *(GPT2Layer(block) for block in model.transformer.h), GPT2Head(model)]


def batch(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's packed rows, ``(microbatches * rows, seq)`` token ids and next-token targets."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.microbatches * args.rows, args.seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def torch_step(run: Run, rank: int, world: int, args: argparse.Namespace) -> Callable[[], None]:
    """One training step of ``run`` through torch's own schedule, on a model of its own."""
    from torch.distributed.pipelining import PipelineStage, schedules

    count = world * run.per_rank
    all_stages = stages(args, count)
    mine = [s for s in range(count) if s % world == rank]  # torch's loop placement
    pipeline_stages = [PipelineStage(all_stages[s], s, count, torch.device("cpu")) for s in mine]
    optimizer = torch.optim.AdamW([p for s in mine for p in all_stages[s].parameters()], lr=1e-4)
    schedule_class = getattr(schedules, run.schedule)
    given = pipeline_stages[0] if run.per_rank == 1 else pipeline_stages
    schedule = schedule_class(given, args.microbatches, loss_fn=lm_loss)
    inputs, targets = batch(args)
    first, last = 0 in mine, count - 1 in mine

    def one_step() -> None:
        kwargs = {"target": targets, "losses": []} if last else {}
        if first:
            schedule.step(inputs, **kwargs)
        else:
            schedule.step(**kwargs)
        optimizer.step()
        optimizer.zero_grad()

    return one_step


def run_torch(rank: int, world: int, run: Run, args: argparse.Namespace) -> Figures:
    """Seconds per step of ``run`` through torch's own schedule (this rank's view)."""
    return timed(torch_step(run, rank, world, args), args)


def hintpipe_step(
    run: Run, world: int, args: argparse.Namespace, stack: contextlib.ExitStack, *, report_every: int, timelines: bool
) -> tuple[hintpipe.Pipeline, Callable[[], None]]:
    """A hintpipe pipeline of ``run`` (closed with ``stack``) and one training step through it."""
    import hintpipe.runtime.transport.mailbox as mailbox

    mailbox.SEND_THREAD_ON_CPU = run.send_thread  # (read as each pipeline's transport is built)
    pipe = stack.enter_context(
        hintpipe.Pipeline.from_modules(
            stages(args, world * run.per_rank),
            loss_fn=lm_loss,
            microbatches=args.microbatches,
            hint=run.schedule,
            policy=run.policy,
            chunks=run.per_rank,
            timelines=timelines,
            report_every=report_every,
        )
    )
    optimizer = torch.optim.AdamW([p for m in pipe.modules.values() for p in m.parameters()], lr=1e-4)
    inputs, targets = batch(args)

    def one_step() -> None:
        pipe.step(inputs, target=targets)
        optimizer.step()
        optimizer.zero_grad()

    return pipe, one_step


def run_hintpipe(rank: int, world: int, run: Run, args: argparse.Namespace) -> Figures:
    """Seconds and CPU seconds per step of ``run`` through hintpipe (this rank's view); with ``--predict``, the
    simulator's prediction of the last step from the runtime's own measured task times, beside that step's
    measured time (rank 0, which gathers every rank's timeline)."""
    with contextlib.ExitStack() as stack:
        report_every = 1 if args.predict else 0
        pipe, one_step = hintpipe_step(run, world, args, stack, report_every=report_every, timelines=args.predict)
        figures = timed(one_step, args)
        if args.predict and rank == 0:
            report = pipe.reports[-1]
            predicted = predict_step_time(pipe.hint, report, Policy(run.policy))
            figures = dataclasses.replace(figures, predicted=predicted, measured=report.makespan)
        return figures


@dataclass(frozen=True)
class Figures:
    """One rank's figures of one run: seconds per step, its process's CPU seconds per step (every thread),
    and, with ``--predict`` on rank 0, the last step's predicted and measured times."""

    seconds: float
    cpu: float
    predicted: float = math.nan
    measured: float = math.nan


def timed(one_step: Any, args: argparse.Namespace) -> Figures:
    """Seconds and CPU seconds per step over the steps after the warm-up, the ranks lined up before and after."""
    for _ in range(args.warmup):
        one_step()
    torch.distributed.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.steps - args.warmup):
        one_step()
    torch.distributed.barrier()
    steps = args.steps - args.warmup
    return Figures((time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps)


def rank_main(rank: int, world: int, run: Run, args: argparse.Namespace) -> Figures:
    torch.set_num_threads(1)
    if run.library == "torch":
        return run_torch(rank, world, run, args)
    return run_hintpipe(rank, world, run, args)


def measure(run: Run, args: argparse.Namespace) -> Figures:
    """The run's figures: the slowest rank's seconds per step, the ranks' mean CPU, rank 0's prediction."""
    ranks: list[Figures] = run_ranks(rank_main, args.ranks, run, args, timeout=args.timeout, device="cpu")
    cpu = statistics.mean(r.cpu for r in ranks)
    return Figures(max(r.seconds for r in ranks), cpu, ranks[0].predicted, ranks[0].measured)


def split_choice(args: argparse.Namespace) -> str:
    """The stages' costs measured as the runtime runs them (the whole backward and the split one), and what the
    simulator predicts for 1F1B and ZB-H1 on them: the choice ``hint="auto"`` makes."""
    torch.set_num_threads(1)
    inputs, targets = batch(args)
    rows = args.rows
    costs = measure_stage_costs(stages(args, args.ranks), [inputs[:rows]], targets[:rows], lm_loss)
    predicted = predicted_steps(
        args.ranks,
        args.microbatches,
        costs.forward,
        costs.backward,
        costs.backward_input,
        costs.weight,
        split_forward=costs.split_forward,
    )
    ms = {name: ", ".join(f"{v * 1e3:.2f}" for v in getattr(costs, name)) for name in dataclasses.asdict(costs)}
    steps = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in predicted.items())
    speed = predicted["1f1b"] / predicted["zb-h1"]
    chosen = choose_hint(predicted)
    return f"per stage, ms: {ms}; predicted step: {steps} (zb-h1 at {speed:.3f}x 1f1b); auto chooses {chosen}"


def add_work_arguments(parser: argparse.ArgumentParser) -> None:
    """The work both libraries run, as flags (this script's and ``paired.py``'s): ranks, model, batch."""
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument(
        "--model",
        choices=("gpt-mini", "hf-gpt2"),
        default="gpt-mini",
        help="gpt-mini (hintpipe's layers) or Hugging Face's GPT2LMHeadModel cut into the same kind of layers",
    )
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1, help="packed rows per micro-batch")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_work_arguments(parser)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", default="", help="run only these rows, by name, separated by ;")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--predict", action="store_true", help="gather timelines and predict each hintpipe step (costs a gather)"
    )
    parser.add_argument("--choose", action="store_true", help="print the split costs and hint auto's choice first")
    args = parser.parse_args(argv)
    if args.choose:
        print(split_choice(args), flush=True)
    wanted = [name.strip() for name in args.only.split(";") if name.strip()]
    runs = [run for run in TORCH_RUNS + HINTPIPE_RUNS if not wanted or run.name in wanted]
    figures: dict[str, list[Figures]] = {run.name: [] for run in runs}
    tokens = args.microbatches * args.rows * args.seq
    for _ in range(args.rounds):
        for run in runs:
            got = measure(run, args)
            figures[run.name].append(got)
            print(f"{run.name}: {tokens / got.seconds:,.0f} tokens/s", file=sys.stderr, flush=True)
    if args.rounds > 0:  # (``--choose --rounds 0``: the split costs and the choice alone)
        print_table(figures, tokens, args)


def paired(rates: dict[str, list[float]], name: str, base: str) -> str:
    """``name``'s rate over ``base``'s in the same round: the median and the range over rounds (rounds run every
    row back to back, so a ratio within a round leaves out most of the machine's drift between rounds)."""
    if base not in rates or name == base:
        return ""
    ratios = [mine / theirs for mine, theirs in zip(rates[name], rates[base], strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def print_table(figures: dict[str, list[Figures]], tokens: int, args: argparse.Namespace) -> None:
    rates = {name: [tokens / f.seconds for f in values] for name, values in figures.items()}
    if args.json:
        print(json.dumps({name: [dataclasses.asdict(f) for f in values] for name, values in figures.items()}))
        return
    print(
        f"| run ({args.model}, {args.ranks} ranks) | tokens/s, median | min-max | vs torch Schedule1F1B, per round | "
        "ready vs fixed, per round | CPU ms/step/rank | predicted / measured step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, values in figures.items():
        median = statistics.median(rates[name])
        cpu = statistics.median(f.cpu for f in values) * 1e3
        ratios = [f.predicted / f.measured for f in values if math.isfinite(f.predicted)]
        prediction = f"{statistics.median(ratios):.2f}" if ratios else ""
        versus_fixed = paired(rates, name, name.replace(", ready", ", fixed")) if ", ready" in name else ""
        print(
            f"| {name} | {median:,.0f} | {min(rates[name]):,.0f}-{max(rates[name]):,.0f} | "
            f"{paired(rates, name, 'torch Schedule1F1B')} | {versus_fixed} | {cpu:.1f} | {prediction} |"
        )


if __name__ == "__main__":
    main()
