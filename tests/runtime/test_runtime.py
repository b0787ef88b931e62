"""The runtime across processes (CPU, gloo): same maths as the unsplit model.

Tolerances: float32 gradients compared with ``torch.testing.assert_close`` at
``rtol=1e-5, atol=1e-6``: the pipeline runs the same operations per
micro-batch as the reference, only the order in which micro-batch gradients
are summed may differ.

Each test spawns its ranks once and runs many configurations in that group,
since starting processes dominates the time on a small machine.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from conftest import hang_bound
from groups import Case as GroupCase
from groups import failure_text, run_cases, succeeded
from hintpipe.apps.models import Chain, ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.forming.collate import IGNORE_INDEX, form_batch
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.launch import RankFailure, run_ranks
from hintpipe.runtime.loop.emulated import EmulatedCosts
from hintpipe.runtime.loop.microbatch import check_ends
from hintpipe.runtime.parts import Seams
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.runtime.transport.wire import MessageKind
from hintpipe.schedule.microbatch_order import MicrobatchOrder

RTOL, ATOL = 1e-5, 1e-6

# (hint, chunks) pairs the generators support, each run under every policy.
HINTS = [
    ("gpipe", 1),
    ("gpipe", 2),
    ("1f1b", 1),
    ("interleaved-1f1b", 2),
    ("zb-h1", 1),
    ("zbv", 2),
    ("bf", 1),
    ("bf", 2),
    ("bfw", 1),
    ("bfw", 2),
]
POLICIES = ["fixed", "greedy", "ready"]


def _mlp(stages: int) -> list[nn.Module]:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(stages)]
    return layers


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _batches(variable: bool, microbatches: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    sizes = [1 + (i * 3) % 5 for i in range(microbatches)] if variable else [2] * microbatches
    xs = [torch.randn(n, 6, generator=g) for n in sizes]
    return xs, [torch.sin(x) for x in xs]


def _reference(modules: list[nn.Module], xs: list[torch.Tensor], ys: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    model = nn.Sequential(*modules)
    for x, y in zip(xs, ys, strict=True):
        torch.autograd.backward(_mse(model(x), y) / len(xs))
    return {f"{s}.{n}": p.grad.clone() for s, m in enumerate(modules) for n, p in m.named_parameters()}  # type: ignore[union-attr]


def _grads(pipe: Pipeline, modules: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {f"{s}.{n}": p.grad.clone() for s in pipe.stages for n, p in modules[s].named_parameters()}  # type: ignore[union-attr]


Case = tuple[str, int, str, bool, str]  # hint, chunks, policy, variable shapes, micro-batch order


def _matrix_worker(rank: int, world: int, cases: list[Case], m: int) -> list[Any]:
    out = []
    for hint, chunks, policy, variable, order in cases:
        modules = _mlp(world * chunks)
        pipe = Pipeline.from_modules(
            modules,
            loss_fn=_mse,
            microbatches=m,
            hint=hint,
            chunks=chunks,
            policy=policy,
            slack_microbatches=1,
            timeout=60,
            microbatch_order=order,
        )
        xs, ys = _batches(variable, m)
        pipe.step(xs, ys)
        one = _grads(pipe, modules)
        loss = pipe.step(xs, ys, broadcast_loss=True)  # no zeroing: gradients accumulate
        two = _grads(pipe, modules)
        pipe.close()
        out.append((one, two, float(loss) if loss is not None else None))
    return out


def _check_matrix(world: int, m: int, cases: list[Case], results: list[Any]) -> None:
    for i, (hint, chunks, policy, variable, order) in enumerate(cases):
        modules = _mlp(world * chunks)
        xs, ys = _batches(variable, m)
        expected = _reference(modules, xs, ys)
        with torch.no_grad():
            model = nn.Sequential(*modules)
            reference_loss = sum(float(_mse(model(x), y)) for x, y in zip(xs, ys, strict=True)) / m
        seen: set[str] = set()
        for rank_result in results:
            one, two, loss = rank_result[i]
            for name, grad in one.items():
                where = f"{hint} x{chunks} {policy} {'variable' if variable else 'equal'} shapes {order}, {name}"
                torch.testing.assert_close(grad, expected[name], rtol=RTOL, atol=ATOL, msg=_prefixed(where))
                # Two steps without zeroing: exactly twice one step's gradient.
                torch.testing.assert_close(two[name], 2 * expected[name], rtol=RTOL, atol=ATOL)
                seen.add(name)
            assert loss == pytest.approx(reference_loss, rel=1e-5)
        assert seen == set(expected), f"{hint}: gradients missing for {set(expected) - seen}"


def _matrix_cases() -> list[Case]:
    # Variable shapes run in an order by size (the three orders in turn): the gradient is the same sum.
    orders = ["longest-first", "balanced", "shortest-first"]
    return [
        (h, v, p, variable, orders[i % 3] if variable else "given")
        for i, ((h, v), p) in enumerate(itertools.product(HINTS, POLICIES))
        for variable in (False, True)
    ]


def test_every_hint_and_policy_matches_the_unsplit_model_on_two_ranks(two_ranks: dict[str, list[Any]]) -> None:
    _check_matrix(2, 4, _matrix_cases(), succeeded(two_ranks["matrix"]))


def test_four_ranks_with_several_chunks() -> None:
    cases = [
        ("1f1b", 1, "ready", True, "given"),
        ("interleaved-1f1b", 2, "greedy", True, "longest-first"),
        ("zbv", 2, "ready", False, "given"),
        ("zb-h1", 1, "greedy", True, "balanced"),
        ("bfw", 2, "ready", True, "longest-first"),
        ("1f1b", 1, "fixed", True, "shortest-first"),
    ]
    _check_matrix(4, 8, cases, run_ranks(_matrix_worker, 4, cases, 8, timeout=120))


class _Recorder(nn.Module):
    """Records the batch size of every forward it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 6)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.shape[0])
        out: torch.Tensor = self.layer(x)
        return out


def _ordered_worker(rank: int, world: int, order: str) -> list[int]:
    torch.manual_seed(0)
    modules: list[nn.Module] = [_Recorder(), _Recorder()]
    pipe = Pipeline.from_modules(modules, loss_fn=_mse, microbatches=5, policy="fixed", microbatch_order=order)
    with pipe:
        pipe.step(*_batches(True, 5))  # sizes 1, 4, 2, 5, 3
    seen: list[int] = modules[rank].seen  # type: ignore[assignment]
    return seen


def _front_then_back_worker(rank: int, world: int, ends: tuple[list[float], list[float]] | None) -> list[int]:
    torch.manual_seed(0)
    modules: list[nn.Module] = [_Recorder(), _Recorder()]
    pipe = Pipeline.from_modules(
        modules, loss_fn=_mse, microbatches=5, policy="fixed", microbatch_order="front-then-back"
    )
    with pipe:
        pipe.step(*_batches(True, 5), ends=ends if rank == 0 else None)  # sizes 1, 4, 2, 5, 3; ends read on rank 0
    seen: list[int] = modules[rank].seen  # type: ignore[assignment]
    return seen


#: Micro-batches 0-4's first- and last-stage work. Ranks at the front 0 3 1 2 4, at the back 3 1 2 4 0: heavier at
#: the front 1 and 4 (by front rising: 1, 4), then 3, 0, 2 (by back falling): sizes 4, 3, 5, 1, 2.
FRONT_THEN_BACK_ENDS = ([0.5, 3.0, 1.0, 2.0, 9.0], [4.0, 1.0, 2.0, 8.0, 0.1])


def test_front_then_back_runs_by_the_ends_the_caller_gives(two_ranks: dict[str, list[Any]]) -> None:
    assert succeeded(two_ranks["front-then-back"]) == [[4, 3, 5, 1, 2]] * 2
    # without ends each micro-batch's input elements stand for both: shortest-first
    assert succeeded(two_ranks["front-then-back, no ends"]) == [[1, 2, 3, 4, 5]] * 2


def test_ends_that_do_not_fit_are_refused_in_words() -> None:
    front_then_back = MicrobatchOrder.FRONT_THEN_BACK
    other = r"^ends are read only under microbatch_order='front-then-back'; this pipeline's is 'given'$"
    with pytest.raises(ValueError, match=other):
        check_ends(([1.0], [1.0]), MicrobatchOrder.GIVEN, 1)
    last = r"^ends: the last stage's work must be 2 finite numbers, one per micro-batch, got \[1.0, nan\]$"
    with pytest.raises(ValueError, match=last):
        check_ends(([1.0, 2.0], [1.0, float("nan")]), front_then_back, 2)
    first = r"^ends: the first stage's work must be 2 finite numbers, one per micro-batch, got \[1.0\]$"
    with pytest.raises(ValueError, match=first):
        check_ends(([1.0], [1.0, 2.0]), front_then_back, 2)
    check_ends(([1.0, 2.0], [3, 4]), front_then_back, 2)  # any numbers, any unit


@pytest.mark.parametrize(
    ("order", "expected"),
    [("given", [1, 4, 2, 5, 3]), ("longest-first", [5, 4, 3, 2, 1]), ("balanced", [5, 1, 4, 2, 3])],
)
def test_every_stage_runs_the_micro_batches_in_the_chosen_order(
    two_ranks: dict[str, list[Any]], order: str, expected: list[int]
) -> None:
    assert succeeded(two_ranks[f"order {order}"]) == [expected, expected]


def _gpt_worker(rank: int, world: int, policy: str) -> Any:
    config = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)
    modules = split_layers(build_layers(config), world)
    pipe = Pipeline.from_modules(modules, loss_fn=lm_loss, microbatches=4, hint="1f1b", policy=policy, timeout=60)
    inputs, targets, _ = make_batch(config, 4, 2, SeqLenDist(24, 0.6), step=0)
    pipe.step(inputs, targets)
    grads = _grads(pipe, modules)
    pipe.close()
    return grads, [x.shape[1] for x in inputs]


def test_gpt_mini_with_variable_sequence_lengths(two_ranks: dict[str, list[Any]]) -> None:
    results = succeeded(two_ranks["gpt greedy"])
    config = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)
    modules = split_layers(build_layers(config), 2)
    inputs, targets, _ = make_batch(config, 4, 2, SeqLenDist(24, 0.6), step=0)
    assert len({x.shape[1] for x in inputs}) > 1, "the micro-batches should differ in length"
    model = nn.Sequential(*modules)
    for x, y in zip(inputs, targets, strict=True):
        torch.autograd.backward(lm_loss(model(x), y) / 4)
    expected = {f"{s}.{n}": p.grad for s, m in enumerate(modules) for n, p in m.named_parameters()}
    for grads, _ in results:
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected[name], rtol=RTOL, atol=ATOL)


def _restored_worker(rank: int, world: int) -> tuple[int, int, int, bool]:
    """A split hint's pipeline on a user's modules: its layers' patched forwards while it runs, and after."""
    config = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)
    modules = split_layers(build_layers(config), world)
    inputs, targets, _ = make_batch(config, 4, 2, SeqLenDist(24), step=0)
    with Pipeline.from_modules(modules, loss_fn=lm_loss, microbatches=4, hint="zb-h1", timeout=60) as pipe:
        pipe.step(inputs, targets)
        mine = list(pipe.modules.values())
        linears = sum(isinstance(m, nn.Linear) for module in mine for m in module.modules())
        during = sum("forward" in vars(m) for module in mine for m in module.modules())
    after = sum("forward" in vars(m) for module in mine for m in module.modules())
    return linears, during, after, b"weight_deferral" in pickle.dumps(mine)


def test_a_closed_pipeline_gives_the_user_s_layers_their_own_forward(two_ranks: dict[str, list[Any]]) -> None:
    # Before, a split hint left each nn.Linear with hintpipe's forward in its instance: pickling the model
    # (torch.save of the module) then needed hintpipe to load it.
    for linears, during, after, pickled_ours in succeeded(two_ranks["layers restored"]):
        assert linears > 0 and during == linears
        assert after == 0 and not pickled_ours


#: Formed micro-batches: (hint, chunks, policy, packed rows with document masks), each on one pipeline.
FORMED = [
    ("1f1b", 1, "fixed", False),
    ("1f1b", 1, "ready", True),
    ("bfw", 1, "ready", False),
    ("zb-h1", 1, "greedy", True),
    ("interleaved-1f1b", 2, "greedy", False),
    ("bfw", 2, "ready", True),
]
_FORMED_MODEL = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)


def _documents() -> list[torch.Tensor]:
    """Eleven documents of 3 to 40 tokens (a step's sequences as loaded)."""
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(3, 41, (11,), generator=g).tolist()
    return [torch.randint(0, _FORMED_MODEL.vocab, (n,), generator=g) for n in lengths]


def _summed_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the tokens, padding ignored: divided by the step's tokens (``loss_divisor``)."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def _formed_worker(rank: int, world: int) -> list[Any]:
    out = []
    for hint, chunks, policy, pack in FORMED:
        modules = split_layers(build_layers(_FORMED_MODEL), world * chunks)
        batch = form_batch(_documents(), 4, pack=pack, seed=3)
        with Pipeline.from_modules(
            modules, loss_fn=_summed_lm_loss, microbatches=4, hint=hint, chunks=chunks, policy=policy, timeout=60
        ) as pipe:
            loss = pipe.step(batch.inputs, batch.targets, loss_divisor=batch.tokens, broadcast_loss=True)
            out.append((_grads(pipe, modules), float(loss) if loss is not None else None))
    return out


def test_formed_micro_batches_match_the_unsplit_model_on_the_same_sequences(two_ranks: dict[str, list[Any]]) -> None:
    # The reference runs each document alone through the whole model: the mean cross-entropy over every token.
    model = Chain(*build_layers(_FORMED_MODEL))  # the same weights as every split of it (seeded)
    documents = _documents()
    tokens = sum(d.numel() - 1 for d in documents)
    loss = torch.stack([_summed_lm_loss(model(d[None, :-1]), d[None, 1:]) for d in documents]).sum() / tokens
    torch.autograd.backward(loss)
    reference = float(loss.detach())
    expected = {n: p.grad for n, p in model.named_parameters()}
    results = succeeded(two_ranks["formed"])
    formations = {pack: form_batch(documents, 4, pack=pack, seed=3) for pack in (False, True)}
    assert formations[False].formation.padding > 0 and formations[True].formation.padding == 0
    for i, (hint, chunks, policy, pack) in enumerate(FORMED):
        names = {}  # a stage's parameter -> the whole model's name of it (layers in order)
        offset = 0
        for s, module in enumerate(split_layers(build_layers(_FORMED_MODEL), 2 * chunks)):
            layers = list(module.children())
            for j, layer in enumerate(layers):
                for n, _ in layer.named_parameters():
                    names[f"{s}.{j}.{n}"] = f"{offset + j}.{n}"
            offset += len(layers)
        seen = set()
        for grads, got in (rank_result[i] for rank_result in results):
            assert got == pytest.approx(reference, rel=1e-5)
            for name, grad in grads.items():
                where = f"{hint} x{chunks} {policy} {'packed' if pack else 'padded'}, {name}"
                torch.testing.assert_close(grad, expected[names[name]], rtol=RTOL, atol=ATOL, msg=_prefixed(where))
                seen.add(names[name])
        assert seen == set(expected)


class _Fault(nn.Module):
    """A linear layer that misbehaves on its ``call``-th forward: ``crash`` kills
    the process abruptly, ``hang`` stops making progress."""

    def __init__(self, call: int, fault: str) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 6)
        self.calls = 0
        self.call, self.fault = call, fault

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.call:
            if self.fault == "crash":
                os._exit(17)
            time.sleep(120)
        out: torch.Tensor = self.layer(x)
        return out


class _Slow(nn.Module):
    """Sleeps in its forward: the last stage is far slower than the first, so the first
    rank's gradients come late and running ahead does not depend on message timing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.1)
        return x


def _prefixed(where: str) -> Callable[[str], str]:
    """An assert_close message that says which case failed."""
    return lambda message: f"{where}: {message}"


def _byte_budget_worker(rank: int, world: int, budget: float, rows: list[list[int]]) -> Any:
    torch.manual_seed(0)
    modules: list[nn.Module] = [nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 8)) for _ in range(world - 1)]
    modules.append(nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 8), _Slow()))
    pipe = Pipeline.from_modules(
        modules, loss_fn=_mse, microbatches=len(rows[0]), hint="1f1b", policy="greedy", activation_budget=budget
    )
    g = torch.Generator().manual_seed(2)
    for step_rows in rows:
        xs = [torch.randn(n, 8, generator=g) for n in step_rows]
        pipe.step(xs, [torch.sin(x) for x in xs])
    pipe.close()
    return [(r.peak_live[r.ranks.index(rank)], r.peak_live_bytes[r.ranks.index(rank)]) for r in pipe.reports], (
        pipe.parts.admission.bytes_per_element
    )


SMALL, LARGE = 2, 64
ROWS = [[SMALL] * 8, [LARGE, SMALL, LARGE, SMALL, SMALL, SMALL, LARGE, SMALL], [SMALL, LARGE] * 4]


def _byte_budget_case(rank: int, world: int) -> tuple[Any, float, float]:
    """A probe of stage 0's bytes per row (small micro-batches only), then the rows under a budget of room
    for one more large micro-batch than rank 0's two under 1F1B; returns the run's figures, the budget and a
    row's bytes."""
    probe = _byte_budget_worker(rank, world, 1e12, ROWS[:1])
    shared = [probe[1][0] * 8 if rank == 0 else 0.0]  # stage 0's bytes per input element, times 8 elements a row
    torch.distributed.broadcast_object_list(shared, src=0)
    per_row = shared[0]
    budget = 3 * LARGE * per_row
    return _byte_budget_worker(rank, world, budget, ROWS), budget, per_row


def test_a_byte_budget_holds_with_micro_batches_of_different_sizes(two_ranks: dict[str, list[Any]]) -> None:
    # The measuring step sees small micro-batches only; later steps mix in large ones. Admission
    # in slots of the first step's size would run ahead with large micro-batches and overshoot;
    # admission by each micro-batch's own bytes keeps every step within the budget, and still runs
    # ahead where small micro-batches fit.
    (run, budget, per_row), _ = succeeded(two_ranks["byte budget"])
    large = LARGE
    slots, held = zip(*run[0], strict=True)
    assert all(b <= budget for b in held), (held, budget)
    assert max(slots[1:]) > 2  # it did run ahead of 1F1B's two micro-batches
    assert max(held[1:]) > 2 * large * per_row  # ... and spent the room


def _batch_views_worker(rank: int, world: int) -> list[int]:
    batch = torch.randn(64, 16)
    peaks = []
    for given in (batch, [x.clone() for x in batch.chunk(4)]):  # one tensor (split into views), or four
        torch.manual_seed(0)
        modules: list[nn.Module] = [nn.Linear(16, 16) for _ in range(world)]
        pipe = Pipeline.from_modules(modules, loss_fn=_mse, microbatches=4, hint="1f1b", policy="fixed")
        pipe.step(given, torch.sin(batch))
        pipe.close()
        peaks.append(pipe.reports[-1].peak_live_bytes[0])
    return peaks


def test_the_callers_batch_is_not_counted_as_pipeline_memory(two_ranks: dict[str, list[Any]]) -> None:
    # Stage 0's inputs are the caller's; views of one batch must not count the whole batch per micro-batch.
    whole, separate = succeeded(two_ranks["caller's batch"])[0]
    assert whole == separate


def _crash_worker(rank: int, world: int) -> None:
    # Dies in the second step, on micro-batch 2 (4 forwards per step).
    modules: list[nn.Module] = [nn.Linear(6, 6), _Fault(4 + 3, "crash"), nn.Linear(6, 6)]
    pipe = Pipeline.from_modules(modules, loss_fn=_mse, microbatches=4, hint="1f1b", timeout=8)
    xs, ys = _batches(False, 4)
    for _ in range(3):
        pipe.step(xs, ys)
    pipe.close()


def test_a_killed_rank_ends_every_rank_with_an_error() -> None:
    began = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(_crash_worker, 3, timeout=30)
    elapsed = time.monotonic() - began
    message = str(info.value)
    assert "rank 1: exited without a result" in message
    # Both neighbours of the dead rank stop with an error that names rank 1, within the timeout.
    for rank in (0, 2):
        line = next(line for line in message.splitlines() if line.startswith(f"rank {rank}:"))
        assert "rank 1" in line, line
    assert elapsed < hang_bound(8)


def _hang_worker(rank: int, world: int) -> None:
    # Stops in the second step, on micro-batch 1.
    modules: list[nn.Module] = [nn.Linear(6, 6), _Fault(4 + 2, "hang")]
    pipe = Pipeline.from_modules(
        modules, loss_fn=_mse, microbatches=4, hint="1f1b", policy="fixed", timeout=HANG_WATCHDOG
    )
    xs, ys = _batches(False, 4)
    pipe.step(xs, ys)
    pipe.step(xs, ys)


#: The hang test's watchdog: long enough that a healthy first step on a loaded 2-core machine (gloo connects its
#: pairs at the first send) never goes that long without a message, as a 3 s one once did (rank 1 in step 0).
HANG_WATCHDOG = 8


def test_a_stuck_rank_trips_the_watchdog_with_what_was_awaited() -> None:
    began = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(_hang_worker, 2, timeout=HANG_WATCHDOG)
    # Rank 0 gives up after 8 s; the launcher stops the stuck rank 8 + 5 s after that.
    assert time.monotonic() - began < hang_bound(HANG_WATCHDOG)
    lines = str(info.value).splitlines()
    # Rank 0 ran 0F0, 0F1, 0B0 and 0F2 ... it waits for 1B1, which rank 1 never sends.
    assert lines[0].startswith("rank 0: WatchdogTimeout: rank 0: waited 8 s with nothing ready in step 1; rank 0: ")
    assert "waits for gradient of stage 1 from rank 1" in lines[0]
    assert lines[1:] == ["rank 1: exited without a result (stopped by the launcher)"]


def test_misuse_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"call torch\.distributed\.init_process_group before building a Pipeline"):
        Pipeline({0: nn.Linear(2, 2)}, loss_fn=_mse, microbatches=2)


def _wrong_modules_worker(rank: int, world: int) -> None:
    Pipeline.from_modules([nn.Linear(2, 2)] * 3, loss_fn=_mse, microbatches=4, hint="1f1b")


def test_module_count_must_match_the_hint(two_ranks: dict[str, list[Any]]) -> None:
    assert failure_text(two_ranks["wrong module count"]) == (
        "ranks 0, 1: ValueError: got 3 stage modules; hint '1f1b' on 2 ranks needs 2 (1 per rank)"
    )


def _misspelt_option_worker(rank: int, world: int) -> list[str]:
    errors = []
    for options in ({"polcy": "ready"}, {"timeout": 0.0}, {"on_nonfinite": "ignore"}, {"chunks": 0}):
        try:
            Pipeline.from_modules([nn.Linear(2, 2)] * world, loss_fn=_mse, microbatches=4, **options)
        except (TypeError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return errors


def test_a_misspelt_or_bad_option_is_refused_by_name(two_ranks: dict[str, list[Any]]) -> None:
    errors = succeeded(two_ranks["misspelt options"])[0]
    assert errors == [
        "TypeError: Pipeline.__init__() got an unexpected keyword argument 'polcy'",
        "ValueError: timeout must be between 1 and 604800, got 0 (1 s: a busy machine delays messages that long; "
        "604800 s: a week)",
        "ValueError: on_nonfinite 'ignore' is unknown: choose one of raise, skip",
        "ValueError: chunks must be at least 1, got 0",
    ]


def _config_worker(rank: int, world: int) -> list[tuple[Any, ...]]:
    """One step of one model built five ways: keywords, a config, a config with a keyword beside it, and
    from_sequential with a config; then keywords that differ (greedy, no slack), to show the comparison
    tells builds apart. For each, what the pipeline resolved and did that its options decide: its config, the
    policy the step ran under, each rank's admission budget (the hint's own peak plus ``slack_microbatches``), and
    rank 0's tasks in the order they ran (``fixed``: the hint's)."""
    from hintpipe.options import PipelineConfig

    x, y = torch.randn(8, 2, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 2)
    config = PipelineConfig(microbatches=4, policy="greedy", slack_microbatches=1.0)
    seen = []
    builders: list[Callable[[list[nn.Module]], Pipeline]] = [
        lambda m: Pipeline.from_modules(m, loss_fn=_mse, microbatches=4, policy="fixed", slack_microbatches=1.0),
        lambda m: Pipeline.from_modules(m, loss_fn=_mse, config=config, policy="fixed"),
        lambda m: Pipeline({rank: m[rank]}, loss_fn=_mse, config=dataclasses.replace(config, policy="fixed")),
        lambda m: Pipeline.from_sequential(nn.Sequential(*m), [1], loss_fn=_mse, config=config, policy="fixed"),
        lambda m: Pipeline.from_modules(m, loss_fn=_mse, microbatches=4, policy="greedy"),
    ]
    for build in builders:
        torch.manual_seed(0)
        modules: list[nn.Module] = [nn.Linear(2, 2), nn.Linear(2, 2)]
        with build(modules) as pipe:
            pipe.step(x, y, broadcast_loss=True)
            report = pipe.reports[-1]  # rank 0's: every rank's summary (report_every 1)
            order = " ".join(str(task) for _, task, *_ in report.records if task.stage == 0)
            resolved = dataclasses.replace(pipe.config, hint=pipe.hint_name)  # its name: the Hint holds the lists
            seen.append((resolved, str(report.policy), report.budget, order))
    return seen


def test_a_config_builds_the_pipeline_its_keywords_build(two_ranks: dict[str, list[Any]]) -> None:
    # Equal losses proved nothing: a step's loss depends neither on the policy nor on the slack.
    from hintpipe.options import PipelineConfig

    *built, other = succeeded(two_ranks["config"])[0]
    keywords = PipelineConfig(microbatches=4, policy="fixed", slack_microbatches=1.0)
    # 1F1B holds 2 micro-batches on rank 0 and 1 on rank 1; one more each with slack_microbatches 1.
    assert built == [(keywords, "fixed", (3.0, 2.0), "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3")] * 4
    assert other[0] == PipelineConfig(microbatches=4, policy="greedy")
    assert other[1:3] == ("greedy", (2.0, 1.0))  # each a field the builds above would differ in, had one dropped it


def _own_copy_worker(rank: int, world: int, weights: torch.Tensor) -> float:
    weights += rank + 1  # what an optimizer step does to a parameter, in place
    torch.distributed.barrier()
    return float(weights[0])


def test_every_rank_gets_its_own_copy_of_tensor_arguments(two_ranks: dict[str, list[Any]]) -> None:
    # Regression: torch's process spawning moved tensor arguments into shared memory, so every rank
    # stepped the same parameters (a plan's weights, trained twice over). Each rank must see only its own change.
    # (The group's cases reach the ranks as run_ranks's arguments, as this tensor does.)
    assert succeeded(two_ranks["own copy"]) == [1.0, 2.0]


def _refused(assign: Callable[[], None]) -> str:
    """The name of the error an assignment raised ("assigned" if none)."""
    try:
        assign()
    except AttributeError as exc:  # dataclasses.FrozenInstanceError is one
        return type(exc).__name__
    return "assigned"


def _built_once_worker(rank: int, world: int) -> tuple[list[int], str, bool, str, str]:
    """Two steps of a pipeline built with a NaN injected in step 1 (given at construction, skipped): the
    step's gradients are dropped, the executor the step loop calls is the faulty one, and neither the parts nor
    the pipeline's view of them can be assigned afterwards."""
    seams = Seams(injection=Injection.parse(faults=["nan:1"]))
    pipe = Pipeline.from_modules(_mlp(world), loss_fn=_mse, microbatches=4, on_nonfinite="skip", seams=seams)
    xs, ys = _batches(False, 4)
    with pipe:
        for _ in range(2):
            pipe.step(xs, ys)
        dropped = all(p.grad is None for m in pipe.modules.values() for p in m.parameters())
        frozen = _refused(lambda: setattr(pipe.parts, "executor", pipe.parts.compute))
        read_only = _refused(lambda: setattr(pipe, "executor", pipe.parts.compute))
        return pipe.nonfinite_steps, type(pipe.executor).__name__, dropped, frozen, read_only


def test_an_injection_given_at_construction_is_built_in_and_the_parts_are_frozen(
    two_ranks: dict[str, list[Any]],
) -> None:
    for nonfinite, executor, dropped, frozen, read_only in succeeded(two_ranks["built once"]):
        assert nonfinite == [1] and dropped  # the injected NaN reached the step, which was skipped on every rank
        assert executor == "FaultyExecutor"
        assert frozen == "FrozenInstanceError"
        assert read_only == "AttributeError"


class _NoticeCounter:
    """A transport that keeps the producer notices it sends and the ones it asks for, as task texts."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.notified: list[str] = []
        self.asked: list[str] = []
        self.asked_in: list[int] = []  # the step of each request

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        self.notified.append(f"{stage}{'F' if of is MessageKind.ACTIVATION else 'B'}{mb}")
        self.inner.notify(peer, step, stage, mb, of)

    def ask(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        self.asked.append(f"{stage}{'F' if of is MessageKind.ACTIVATION else 'B'}{mb}")
        self.asked_in.append(step)
        self.inner.ask(peer, step, stage, mb, of)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _notices_worker(rank: int, world: int) -> dict[str, tuple[list[str], list[str], list[int]]]:
    """Per hint, the notices this rank sent, the ones it asked for and the step it asked each in, over 5 ``ready``
    steps at equal emulated costs (step 0 runs the hint in order while ``ready``'s plan is measured)."""
    out = {}
    counters: list[_NoticeCounter] = []

    def counted(transport: Any) -> _NoticeCounter:
        counters.append(_NoticeCounter(transport))
        return counters[-1]

    for hint in ("1f1b", "zb-h1"):
        split = hint == "zb-h1"
        costs = EmulatedCosts(
            (0.01,) * world, (0.005 if split else 0.01,) * world, (0.005 if split else 0.0,) * world, reference_size=1
        )
        with Pipeline.from_modules(
            [nn.Identity() for _ in range(world)],
            loss_fn=lambda out, target: out.sum(),
            microbatches=8,
            hint=hint,
            policy="ready",
            emulate=costs,
            seams=Seams(watch_transport=counted),
        ) as pipe:
            for _ in range(5):
                pipe.step()
        counter = counters[-1]
        out[hint] = (counter.notified, counter.asked, counter.asked_in)
    return out


def _profiled_worker(rank: int, world: int) -> list[str]:
    """zb-h1 on 2 ranks, 4 micro-batches; the second step under ``torch.profiler``: this rank's task ranges."""
    pipe = Pipeline.from_modules(_mlp(world), loss_fn=_mse, microbatches=4, hint="zb-h1", policy="ready")
    xs, ys = _batches(True, 4)
    with pipe:
        pipe.step(xs, ys)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            pipe.step(xs, ys)
    return sorted(e.name for e in profile.events() if e.name.startswith("hintpipe "))


def test_a_profile_of_a_step_shows_each_task_once_by_name(two_ranks: dict[str, list[Any]]) -> None:
    # As torch's own schedules wrap each action in record_function: one range per task, named by its
    # kind, stage and micro-batch, on the rank that ran it.
    for rank, names in enumerate(succeeded(two_ranks["profiled"])):
        assert names == sorted(f"hintpipe {k} stage {rank} mb {mb}" for k in "FBW" for mb in range(4))


def test_a_producer_notices_only_the_tasks_its_consumer_asked_for(two_ranks: dict[str, list[Any]]) -> None:
    """``ready`` at equal costs: on ``1f1b`` over 2 ranks no rank ever has a task to run in place of the hint's
    next, so no ETA is weighed, none asked for, and no notice sent (every F and B crossing a rank sent one
    before: 32 a step). On ``zb-h1`` rank 1 weighs its forwards' ETAs (a W could fill the wait): it asks rank 0
    for each once, and rank 0 notices those alone; rank 0 never weighs one (nothing else fits its budget while
    it waits), so rank 1 sends none (see [Note: notices asked for] in hintpipe.runtime.transport.protocol)."""
    first, second = succeeded(two_ranks["asked notices"])
    assert first["1f1b"] == second["1f1b"] == ([], [], [])
    sent, asked, _ = first["zb-h1"]
    assert asked == []
    assert second["zb-h1"][0] == []
    theirs, steps = second["zb-h1"][1:]
    assert theirs and len(set(theirs)) == len(theirs) and all(t.startswith("1F") for t in theirs)
    assert set(sent) <= set(theirs)
    # A request stands for every later step: what rank 1 asked for before the last step, rank 0 noticed. (When rank
    # 1 first weighs an ETA depends on when messages arrive: on a loaded machine its requests may all come in the
    # last step, after rank 0 ran what they ask about, and then nothing is sent.)
    assert {t for t, step in zip(theirs, steps, strict=True) if step < max(steps)} <= set(sent)


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list[Any]]:
    """This module's 2-rank cases on one spawned group."""
    cases = {
        "matrix": GroupCase(_matrix_worker, (_matrix_cases(), 4)),
        **{f"order {o}": GroupCase(_ordered_worker, (o,)) for o in ("given", "longest-first", "balanced")},
        "front-then-back": GroupCase(_front_then_back_worker, (FRONT_THEN_BACK_ENDS,)),
        "front-then-back, no ends": GroupCase(_front_then_back_worker, (None,)),
        "gpt greedy": GroupCase(_gpt_worker, ("greedy",)),
        "layers restored": GroupCase(_restored_worker),
        "byte budget": GroupCase(_byte_budget_case),
        "caller's batch": GroupCase(_batch_views_worker),
        "wrong module count": GroupCase(_wrong_modules_worker),
        "misspelt options": GroupCase(_misspelt_option_worker),
        "config": GroupCase(_config_worker),
        "own copy": GroupCase(_own_copy_worker, (torch.zeros(4),)),
        "profiled": GroupCase(_profiled_worker),
        "built once": GroupCase(_built_once_worker),
        "formed": GroupCase(_formed_worker),
        "asked notices": GroupCase(_notices_worker),
    }
    return run_cases(2, cases, timeout=120)
