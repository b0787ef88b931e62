"""What a training loop around a pipeline needs, against the unsplit model: gradient clipping across every axis,
bf16 autocast, evaluation steps, the weights out by the model's names, and a scheduler's state in checkpoints.

Every case runs on one spawned group of 4 ranks: pipelines of 4 stages, DP2 x PP2 and TP2 x PP2.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from groups import Case, run_cases, succeeded
from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.apps.tensor_parallel import parallelize_stage
from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
from hintpipe.runtime.parallel.mesh import build_mesh
from hintpipe.runtime.pipeline import Pipeline

MODEL = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)
MICROBATCHES = 4
TIMEOUT = 60.0


def _batch(step: int, replica: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    inputs, targets, _ = make_batch(MODEL, MICROBATCHES, 2, SeqLenDist(16, 0.5), step, 100 + replica)
    return inputs, targets


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the whole tensor (a replicated DTensor's ``full_tensor`` is its local tensor, not a copy)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _pipeline(world: int, dp: int = 1, tp: int = 1, **options: Any) -> tuple[Pipeline, nn.Sequential]:
    """gpt-mini cut into ``world / (dp * tp)`` stages on a DP x TP x PP mesh, and the unsplit model."""
    layers = build_layers(MODEL)
    reference = nn.Sequential(*copy.deepcopy(layers))
    stages = split_layers(layers, world // (dp * tp))
    mesh = build_mesh(world, dp=dp, tp=tp) if dp * tp > 1 else None
    if tp > 1:
        assert mesh is not None
        stages = [parallelize_stage(stage, mesh["tp"], MODEL.heads) for stage in stages]
    if mesh is not None:
        options["mesh"] = mesh
    pipe = Pipeline.from_modules(stages, loss_fn=lm_loss, microbatches=MICROBATCHES, timeout=TIMEOUT, **options)
    return pipe, reference


def _reference_step(reference: nn.Module, step: int, dp: int) -> None:
    """The unsplit model's gradients for the global batch (every replica's micro-batches)."""
    for r in range(dp):
        for x, y in zip(*_batch(step, r), strict=True):
            torch.autograd.backward(lm_loss(reference(x), y) / (dp * MICROBATCHES))


# -- clipping across every axis ------------------------------------------------------------------------------


def _clipped(rank: int, world: int, dp: int, tp: int, max_norm: float, norm_type: float) -> tuple[float, float, float]:
    """One step, clipped; returns the pipeline's norm, torch's on the unsplit model, and the largest relative
    difference between a clipped gradient and the same gradient before clipping times torch's coefficient."""
    pipe, reference = _pipeline(world, dp, tp)
    with pipe:
        inputs, targets = _batch(0, pipe.layout.replica_of(rank))
        pipe.step(inputs, targets)
        params = [p for m in pipe.modules.values() for p in m.parameters()]
        before = [_full(p.grad) for p in params]  # type: ignore[arg-type]
        norm = float(pipe.clip_grad_norm(max_norm, norm_type))
        _reference_step(reference, 0, dp)
        expected = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, norm_type))
        coefficient = min(1.0, max_norm / (expected + 1e-6))
        worst = max(
            ((_full(p.grad) - b * coefficient).abs().max() / (b.abs().max() * coefficient)).item()  # type: ignore[arg-type]
            for p, b in zip(params, before, strict=True)
        )
    return norm, expected, worst


CLIPPED = {
    "pp": (1, 1, 1e-3, 2.0),
    "dp": (2, 1, 1e-3, 2.0),
    "tp": (1, 2, 1e-3, 2.0),
    "pp inf": (1, 1, 1e-3, float("inf")),
    "pp unclipped": (1, 1, 1e6, 2.0),
}


@pytest.mark.parametrize("layout", sorted(CLIPPED))
def test_clipping_is_torchs_on_the_unsplit_model(group: dict[str, list[Any]], layout: str) -> None:
    # The norm: float32 gradients summed in another order (micro-batches, replicas, shards) agree to 1e-5 of the
    # norm. Each gradient is scaled by torch's coefficient (1 where the norm is under max_norm).
    for norm, expected, worst in succeeded(group[f"clip {layout}"]):
        assert norm == pytest.approx(expected, rel=1e-5)
        assert worst < 1e-5


def test_clip_grad_norm_refuses_a_negative_max_norm(group: dict[str, list[Any]]) -> None:
    assert (
        group["clip refused"]
        == ["ValueError: max_norm must be >= 0 and norm_type > 0, got max_norm=-1, norm_type=2.0"] * 4
    )


def _refused(rank: int, world: int) -> str:
    pipe, _ = _pipeline(world)
    with pipe:
        try:
            pipe.clip_grad_norm(-1)
        except ValueError as exc:
            return f"ValueError: {exc}"
    return "accepted"


# -- bf16 autocast --------------------------------------------------------------------------------------------


def _bf16(rank: int, world: int, policy: str) -> tuple[list[tuple[str, float, float]], float | None, float | None]:
    """One step under bf16 autocast; returns, per parameter of this rank's stages, its name, the largest
    difference between its gradient and the unsplit model's under the same autocast, and the largest magnitude
    of the unsplit model's gradient of it (the tensor's own scale); and the two losses (on the last stage's
    rank)."""
    pipe, reference = _pipeline(world, precision="bf16", policy=policy)
    with pipe:
        inputs, targets = _batch(0)
        loss = pipe.step(inputs, targets)
        expected_loss = torch.zeros(())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for x, y in zip(inputs, targets, strict=True):
                part = lm_loss(reference(x), y) / MICROBATCHES
                torch.autograd.backward(part)
                expected_loss += part.detach().float()
        sizes = [len(list(m.children())) for m in split_layers(build_layers(MODEL), world)]
        offsets = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        rows = []
        for s, module in pipe.modules.items():
            for (name, mine), theirs in zip(
                module.named_parameters(), reference[offsets[s] : offsets[s + 1]].parameters(), strict=True
            ):
                assert mine.grad is not None and theirs.grad is not None
                assert mine.grad.dtype == torch.float32  # parameters and gradients stay float32
                difference = (mine.grad - theirs.grad).abs().max().item()
                rows.append((f"stage {s} {name}", difference, theirs.grad.abs().max().item()))
    last = rank == world - 1
    return rows, float(loss) if last and loss is not None else None, float(expected_loss) if last else None


@pytest.mark.parametrize("policy", ["fixed", "ready"])
def test_bf16_gradients_are_the_unsplit_models_under_the_same_autocast(
    group: dict[str, list[Any]], policy: str
) -> None:
    # The same operations in bfloat16 on each stage, in the same order, activations crossing ranks in bfloat16 as
    # they flow in the unsplit model: what may differ is the order in which float32 gradients of the micro-batches
    # add up (the ready policy may run them in another), a few float32 steps of the terms. So each parameter's
    # gradient is compared with the unsplit model's within 2^-16 of its own scale (its largest magnitude there),
    # room for 2^8 such steps; one operation computed in another dtype moves a gradient by about 2^-8 of its
    # scale (bfloat16's step). Measured: no difference at all, both policies. One bound against the model's single
    # largest gradient (2^-8 of it) let a small tensor be wrong by 7% of its own scale (a layer norm's weight).
    results = succeeded(group[f"bf16 {policy}"])
    rows = [row for result in results for row in result[0]]
    assert len(rows) == len({name for name, _, _ in rows}) == 30  # every parameter of the 4 stages, once
    for name, difference, scale in rows:
        assert difference <= scale * 2**-16, f"{name}: {difference} against its scale {scale}"
    loss, expected = results[-1][1:]
    assert loss == pytest.approx(expected, rel=1e-5)


# -- evaluation ------------------------------------------------------------------------------------------------


def _evaluation(rank: int, world: int, policy: str, dp: int) -> tuple[float | None, float, bool, int]:
    """Train a step, then evaluate a batch; returns the evaluation's loss (every rank), the unsplit model's,
    whether the gradients were left as they were, and the step count after."""
    pipe, reference = _pipeline(world, dp, policy=policy)
    with pipe:
        inputs, targets = _batch(0, pipe.layout.replica_of(rank))
        pipe.step(inputs, targets)
        grads = [_full(p.grad) for m in pipe.modules.values() for p in m.parameters()]  # type: ignore[arg-type]
        held = sum(m.training for module in pipe.modules.values() for m in module.modules())
        evaluation = _batch(7, pipe.layout.replica_of(rank))
        loss = pipe.eval_step(*evaluation, broadcast_loss=True)
        same = all(
            torch.equal(_full(p.grad), g)  # type: ignore[arg-type]
            for p, g in zip([p for m in pipe.modules.values() for p in m.parameters()], grads, strict=True)
        )
        same = same and held == sum(m.training for module in pipe.modules.values() for m in module.modules())
        reference.eval()
        with torch.no_grad():
            expected = sum(float(lm_loss(reference(x), y)) for x, y in zip(*evaluation, strict=True)) / MICROBATCHES
        return None if loss is None else float(loss), expected, same, pipe.step_count


@pytest.mark.parametrize("policy", ["fixed", "ready"])
def test_an_evaluation_is_the_unsplit_models_loss_and_changes_nothing(group: dict[str, list[Any]], policy: str) -> None:
    for loss, expected, same, steps in succeeded(group[f"eval {policy}"]):
        assert loss == pytest.approx(expected, rel=1e-6)
        assert same and steps == 1


def test_evaluations_between_steps_on_data_parallel_pipelines(group: dict[str, list[Any]]) -> None:
    # Each replica evaluates its own batch: its pipeline's loss is the unsplit model's on that batch.
    for loss, expected, same, steps in succeeded(group["eval dp"]):
        assert loss == pytest.approx(expected, rel=1e-6)
        assert same and steps == 1


# -- weights out by the model's names -----------------------------------------------------------------------------


class _Wrapped(nn.Module):
    """A user's own module around a Hugging Face GPT-2 (its LM head tied to the token embedding)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        config = GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
        )
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0  # the same maths on both sides
        self.gpt = GPT2LMHeadModel(config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gpt(ids, use_cache=False).logits  # type: ignore[no-any-return]


def _token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def _hugging_face(rank: int, world: int) -> tuple[list[str], float, float, bool]:
    """Train a planned GPT-2 two SGD steps, take its state dict out and load it into a fresh unsplit model;
    returns the state dict's keys, the largest output difference to the unsplit model trained the same way,
    the largest parameter difference, and whether the fresh model's head is still tied."""
    import hintpipe

    model = _Wrapped()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(1))
    planned = hintpipe.plan(model, ids[:2], ranks=world, microbatches=MICROBATCHES) if rank == 0 else None
    with Pipeline.from_plan(hintpipe.share_plan(planned), loss_fn=_token_loss, timeout=TIMEOUT) as pipe:
        optimizer = torch.optim.SGD([p for m in pipe.modules.values() for p in m.parameters()], lr=0.5)
        expected_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
        for _ in range(2):
            pipe.step(ids, ids)
            optimizer.step()
            optimizer.zero_grad()
            for x in ids.chunk(MICROBATCHES):
                torch.autograd.backward(_token_loss(reference(x), x) / MICROBATCHES)
            expected_optimizer.step()
            expected_optimizer.zero_grad()
        state = pipe.state_dict()
    fresh = _Wrapped()
    fresh.load_state_dict(state, strict=True)
    with torch.no_grad():
        outputs = (fresh(ids) - reference(ids)).abs().max().item()
    params = max((p - q).abs().max().item() for p, q in zip(fresh.parameters(), reference.parameters(), strict=True))
    tied = fresh.gpt.lm_head.weight is fresh.gpt.transformer.wte.weight
    return list(state), outputs, params, tied


def test_a_trained_hugging_face_model_goes_back_into_the_unsplit_model(group: dict[str, list[Any]]) -> None:
    expected_keys = list(_Wrapped().state_dict())
    for keys, outputs, params, tied in succeeded(group["hf state_dict"]):
        assert keys == expected_keys  # every rank, the model's own names in its order, the tied head included
        assert outputs < 1e-5 and params < 1e-6  # float32 sums in another order
        assert tied


# -- the scheduler's and the caller's state in checkpoints ----------------------------------------------------------


@dataclasses.dataclass
class _DataPosition:
    """A caller's own state: where its data loader is."""

    position: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


def _scheduled(rank: int, world: int, folder: str) -> tuple[int, list[float], int, float, int]:
    """Three steps with a StepLR and a data position saved every 2 steps and after the last; a new pipeline
    resumes and runs one more step. Returns the step it resumes from, the learning rates before and after, the
    data position, the learning rate, and the step number of the resumed pipeline's first report."""
    steps = 3

    def build() -> tuple[Pipeline, torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR, _DataPosition]:
        pipe, _ = _pipeline(world)
        optimizer = torch.optim.AdamW([p for m in pipe.modules.values() for p in m.parameters()], lr=1e-3)
        return pipe, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5), _DataPosition()

    pipe, optimizer, scheduler, data = build()
    with pipe:
        checkpoints = Checkpointer(folder, pipe, optimizer, every=2, scheduler=scheduler, state=data)
        for step in range(checkpoints.start(), steps):
            pipe.step(*_batch(step))
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            data.position += 8
            checkpoints.after_step(step + 1, last=step + 1 == steps)
        saved_lr = float(scheduler.get_last_lr()[0])
    pipe, optimizer, scheduler, data = build()
    with pipe:
        first = Checkpointer(folder, pipe, optimizer, scheduler=scheduler, state=data).resume()
        rates = [saved_lr, float(scheduler.get_last_lr()[0])]
        lr = float(optimizer.param_groups[0]["lr"])
        pipe.step(*_batch(first))
    return first, rates, data.position, lr, pipe.reports[-1].step


def test_a_scheduler_and_the_callers_state_resume(group: dict[str, list[Any]]) -> None:
    for first, rates, position, lr, counted in succeeded(group["scheduler"]):
        assert first == 3
        assert counted == 3  # the resumed pipeline's steps count on from the checkpoint's
        assert rates == [1e-3 * 0.5**3] * 2
        assert position == 24
        assert lr == 1e-3 * 0.5**3


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    folder = tmp_path_factory.mktemp("scheduler") / "ck"
    cases = {f"clip {name}": Case(_clipped, args) for name, args in CLIPPED.items()}
    cases["clip refused"] = Case(_refused)
    cases |= {f"bf16 {p}": Case(_bf16, (p,)) for p in ("fixed", "ready")}
    cases |= {f"eval {p}": Case(_evaluation, (p, 1)) for p in ("fixed", "ready")}
    cases["eval dp"] = Case(_evaluation, ("ready", 2))
    cases["hf state_dict"] = Case(_hugging_face)
    cases["scheduler"] = Case(_scheduled, (str(folder),))
    return run_cases(4, cases, timeout=180)
