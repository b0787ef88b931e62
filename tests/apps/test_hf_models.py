"""Hugging Face models end to end: captured through torch.export, planned, trained on ranks.

GPT-2 and Llama (embeddings tied to the LM head) from small configs built in
code, weights random, no download. Planned into 2 and 3 stages for float32 alone (``autocast=False``: one
torch.export capture, not two; under ``precision="bf16"`` such a plan is refused on every rank), trained three
AdamW steps on micro-batches of different lengths under ``fixed`` and
``ready``: losses and every parameter equal the unsplit model trained on the
same micro-batches (rtol 1e-4, atol 1e-5: float32 sums in another order), and
the tied copies on the first and last stage's ranks equal each other exactly.
AdamW runs with ``eps=1e-4``: some gradients are zero in exact arithmetic (the
attention keys' bias) and rounding noise in float32, and Adam's first step,
``lr * g / (|g| + eps)``, would turn noise of 1e-9 into updates of either
sign at the default ``eps=1e-8``.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch
import transformers
from torch import nn

from groups import Case, failure_text, run_cases, succeeded
from hintpipe.apps.hf_models import build_hf_model
from hintpipe.apps.models import SeqLenDist, make_batch
from hintpipe.apps.training import TrainConfig, _train_rank
from hintpipe.cli import build_parser, main
from hintpipe.cli.train import config_from, result_json
from hintpipe.planner.plan import Plan, plan
from hintpipe.runtime.pipeline import Pipeline

RTOL, ATOL = 1e-4, 1e-5
VOCAB = 64
KWARGS = {"use_cache": False}
EPS = 1e-4


def _gpt2(dropout: float = 0.0) -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )  # fmt: skip
    model: nn.Module = transformers.GPT2LMHeadModel(config)
    return model


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
        pad_token_id=0,
    )  # fmt: skip
    model: nn.Module = transformers.LlamaForCausalLM(config)
    return model


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _steps(seed: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(3):
        ids = [torch.randint(0, VOCAB, (2, n + 1), generator=g) for n in (5, 11, 8, 3)]
        steps.append(([x[:, :-1] for x in ids], [x[:, 1:] for x in ids]))
    return steps


def _train_worker(rank: int, world: int, planned: Plan, steps: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for policy in ("fixed", "ready"):
        # Stages built from one plan share its captured weights: a fresh copy for each run.
        pipe = Pipeline.from_plan(copy.deepcopy(planned), loss_fn=causal_lm_loss, policy=policy)
        params = list({id(p): p for m in pipe.modules.values() for p in m.parameters()}.values())
        assert params, f"rank {rank}'s stages {pipe.stages} hold no parameters: a lopsided plan"
        optimizer = torch.optim.AdamW(params, lr=0.01, eps=EPS)
        losses, states = [], []
        for xs, ys in steps:
            loss = pipe.step(xs, ys, broadcast_loss=True)
            assert loss is not None
            losses.append(float(loss))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            states.append({n: p.detach().clone() for m in pipe.modules.values() for n, p in m.named_parameters()})
        pipe.close()
        out[policy] = (losses, states)
    return out


BUILDERS = {"gpt2": _gpt2, "llama": _llama}


@functools.cache
def _planned(name: str, stages: int) -> tuple[nn.Module, Plan]:
    """The model and its plan, made once for the module: the ranks' fixture and the test share them (planning
    leaves the model untouched; each user copies what it changes)."""
    torch.manual_seed(0)
    model = BUILDERS[name]()
    example = torch.randint(0, VOCAB, (2, 9))
    planned = plan(model, example, ranks=stages, microbatches=4, repeats=1, kwargs=KWARGS, autocast=False)
    return model, planned


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("stages", [2, 3])
def test_a_planned_hugging_face_model_trains_like_the_unsplit_model(
    two_ranks: dict[str, list[Any]], three_ranks: dict[str, list[Any]], name: str, stages: int
) -> None:
    model, planned = _planned(name, stages)
    assert not planned.graph.follows_autocast
    head, embedding = planned.tied[0]
    assert head == "lm_head.weight" and embedding in ("transformer.wte.weight", "model.embed_tokens.weight")
    assert planned.tied_stages == ((0, stages - 1),)
    steps = _steps(stages)
    results = succeeded((two_ranks if stages == 2 else three_ranks)[f"{name} on {stages}"])
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01, eps=EPS)
    for step, (xs, ys) in enumerate(steps):
        loss = sum(causal_lm_loss(reference(x, **KWARGS).logits, y) / len(xs) for x, y in zip(xs, ys, strict=True))
        assert isinstance(loss, torch.Tensor)
        torch.autograd.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        expected = dict(reference.named_parameters())
        for policy in ("fixed", "ready"):
            losses, _ = results[0][policy]
            assert losses[step] == pytest.approx(float(loss.detach()), rel=RTOL)
            first, last = results[0][policy][1][step], results[-1][policy][1][step]
            torch.testing.assert_close(first[embedding], last[embedding], rtol=0, atol=0)  # one tensor, two copies
            for rank_result in results:
                for name_, value in rank_result[policy][1][step].items():
                    torch.testing.assert_close(value, expected[name_], rtol=RTOL, atol=ATOL, msg=f"{policy} {name_}")


def test_every_stage_of_a_planned_hugging_face_model_starts_without_gradients() -> None:
    planned = plan(_gpt2(), torch.randint(0, VOCAB, (2, 9)), ranks=2, microbatches=2, repeats=1, kwargs=KWARGS)
    for index in range(planned.stages):
        assert all(p.grad is None for p in planned.build_stage(index).parameters())


SPEC = "lognormal:12:0.5"


def _cli_run(name: str) -> TrainConfig:
    """``hintpipe train --model NAME`` as the command line parses it (the parent plans the model)."""
    argv = ["train", "--model", name, "--layers", "2", "--hidden", "32", "--ranks", "2", "--microbatches", "4"]
    args = build_parser().parse_args([*argv, "--steps", "3", "--seq-len-dist", SPEC, "--policy", "ready", "--json"])
    return config_from(args, args.policy)


@pytest.mark.parametrize("name", ["hf-gpt2", "hf-llama", "hf-gpt2 plan file"])
def test_hintpipe_train_runs_a_hugging_face_model_as_the_unsplit_model_would(
    two_ranks: dict[str, list[Any]], name: str
) -> None:
    result = succeeded(two_ranks[f"train {name}"])[0]
    losses = result_json(result)["losses"]
    config = result.config.model  # from the plan file, for the last: the model `hintpipe plan --model` planned
    assert config.name == name.split()[0] and (config.layers, config.hidden) == (2, 32)
    model = build_hf_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    expected = []
    for step in range(3):
        xs, ys, _ = make_batch(config, 4, 4, SeqLenDist.parse(SPEC), step, 0)
        loss = sum(causal_lm_loss(model(x, **KWARGS).logits, y) / len(xs) for x, y in zip(xs, ys, strict=True))
        assert isinstance(loss, torch.Tensor)
        expected.append(float(loss.detach()))
        torch.autograd.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert losses == pytest.approx(expected, rel=1e-4)


def test_a_tensor_keyword_input_becomes_a_first_stage_input() -> None:
    torch.manual_seed(0)
    model = _gpt2()
    ids = torch.randint(0, VOCAB, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.int64)
    planned = plan(model, ids, ranks=2, microbatches=2, repeats=1, kwargs={"attention_mask": mask, **KWARGS})
    x = torch.randint(0, VOCAB, (2, 12))
    padded = torch.ones(2, 12, dtype=torch.int64)
    padded[1, 8:] = 0  # the second row is 8 tokens long
    values: tuple[torch.Tensor, ...] = (x, padded)
    for index in range(planned.stages):
        out = planned.build_stage(index)(*values)
        values = out if isinstance(out, tuple) else (out,)
    expected = model(x, attention_mask=padded, **KWARGS).logits
    torch.testing.assert_close(values[0], expected, rtol=1e-5, atol=1e-5)


def _dropout_worker(rank: int, world: int, planned: Plan, steps: list[Any]) -> dict[str, list[float]]:
    """Two evaluations and two training steps (no optimizer step between them) of one batch."""
    pipe = Pipeline.from_plan(planned, loss_fn=causal_lm_loss, policy="ready")
    xs, ys = steps[0]
    evaluations = [float(pipe.eval_step(xs, ys, broadcast_loss=True)) for _ in range(2)]  # type: ignore[arg-type]
    trainings = []
    for _ in range(2):
        trainings.append(float(pipe.step(xs, ys, broadcast_loss=True)))  # type: ignore[arg-type]
        for module in pipe.modules.values():
            module.zero_grad(set_to_none=True)
    pipe.close()
    return {"eval": evaluations, "train": trainings}


@functools.cache
def _planned_in_eval_mode() -> tuple[nn.Module, Plan]:
    """GPT-2 with dropout 0.1 planned in eval mode, as after ``from_pretrained``."""
    torch.manual_seed(0)
    model = _gpt2(dropout=0.1).eval()
    return model, plan(model, torch.randint(0, VOCAB, (2, 9)), ranks=2, microbatches=4, repeats=1, kwargs=KWARGS)


def test_dropout_trains_and_evaluation_does_not_whatever_mode_the_model_was_planned_in(
    two_ranks: dict[str, list[Any]],
) -> None:
    """Planned in eval mode, the pipeline still trains with dropout (two steps on one batch give two losses);
    ``eval_step`` runs without it (twice the same loss, the unsplit model's in eval mode)."""
    model, _ = _planned_in_eval_mode()
    xs, ys = _steps(2)[0]
    with torch.no_grad():
        loss = sum(causal_lm_loss(model(x, **KWARGS).logits, y) / len(xs) for x, y in zip(xs, ys, strict=True))
    result = succeeded(two_ranks["dropout"])[0]
    first, second = result["eval"]
    assert first == second == pytest.approx(float(loss), rel=1e-5)
    a, b = result["train"]
    assert a != b and first not in (a, b)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """The 2-rank trainings of this module on one spawned group."""
    cases = {f"{n} on 2": Case(_train_worker, (_planned(n, 2)[1], _steps(2))) for n in BUILDERS}
    cases |= {f"train {n}": Case(_train_rank, (_cli_run(n),)) for n in ("hf-gpt2", "hf-llama")}
    cases["train hf-gpt2 plan file"] = Case(_train_rank, (_from_plan_file(tmp_path_factory),))
    cases["dropout"] = Case(_dropout_worker, (_planned_in_eval_mode()[1], _steps(2)))
    cases["float32 plan under bf16"] = Case(_under_bf16, (_planned("gpt2", 2)[1],))
    return run_cases(2, cases, timeout=300)


def _under_bf16(rank: int, world: int, planned: Plan) -> None:
    Pipeline.from_plan(copy.deepcopy(planned), loss_fn=causal_lm_loss, precision="bf16").close()


def test_a_plan_for_float32_alone_is_refused_under_bf16_on_every_rank(two_ranks: dict[str, list[Any]]) -> None:
    assert failure_text(two_ranks["float32 plan under bf16"]) == (
        "ranks 0, 1: ValueError: the plan was captured for float32 alone (plan(..., autocast=False)), and precision "
        "bf16 runs its stages under a bfloat16 autocast: plan with autocast=True"
    )


def _from_plan_file(tmp_path_factory: pytest.TempPathFactory) -> TrainConfig:
    """``hintpipe plan --model hf-gpt2 --save FILE``, then ``hintpipe train --plan FILE`` (the file says the
    model, its sizes, the ranks and the micro-batches)."""
    path = str(tmp_path_factory.mktemp("hf-plan") / "gpt2.plan")
    planning = ["plan", "--model", "hf-gpt2", "--layers", "2", "--hidden", "32", "--ranks", "2", "--microbatches"]
    assert main([*planning, "4", "--stage-memory", "1GiB", "--repeats", "1", "--save", path, "--json"]) == 0
    args = build_parser().parse_args(["train", "--plan", path, "--steps", "3", "--seq-len-dist", SPEC, "--json"])
    return config_from(args, args.policy)


@pytest.fixture(scope="module")
def three_ranks() -> dict[str, list[Any]]:
    """The 3-rank trainings of this module on one spawned group."""
    return run_cases(3, {f"{n} on 3": Case(_train_worker, (_planned(n, 3)[1], _steps(3))) for n in BUILDERS})
