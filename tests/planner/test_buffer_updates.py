"""Buffers a forward updates ([Note: buffers a forward updates] in hintpipe.planner.capture): a batch norm's
running statistics and count, an exponential average, a counter of calls. Planned stages update them as the
unsplit model does, once per micro-batch's forward, wherever the cut falls, whichever capture, recomputed or not.

Before, torch.fx ran an update made of a buffer and constants (``self.seen.add_(1)``, ``self.ema.mul_(0.9)``)
once while tracing and left it out of the graph, the re-trace every plan goes through did the same to
torch.export's graph, profiling left its own runs' updates in the stages' buffers, and a recomputed group applied
its updates twice. Values are compared exactly: the stages run the unsplit model's operations in its order.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
import torch
from torch import nn

from hintpipe.planner.buffer_updates import noting_updates, updated_buffer_spans
from hintpipe.planner.capture import allowed_cuts, capture, value_uses
from hintpipe.planner.export_trace import exported
from hintpipe.planner.fx_trace import fx_traced
from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.profile import profile


class Tracked(nn.Module):
    """Three kinds of update: a batch norm's (momentum None: the count sets its average), an exponential average
    made of a buffer and constants then of a value, and a counter of calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.b = nn.Linear(6, 6)
        self.ema: torch.Tensor
        self.seen: torch.Tensor
        self.register_buffer("ema", torch.ones(6))
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(1)
        h = self.bn(torch.relu(self.a(x)))
        self.ema.mul_(0.9).add_(0.1 * h.detach().mean(0))
        out: torch.Tensor = self.b(h)
        return out


class TrackedScaled(Tracked):
    """The same with a keyword input, which torch.fx does not trace: captured by torch.export."""

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return super().forward(x) * scale


#: Every buffer the model updates (the batch norm's count included).
UPDATED = {"ema", "seen", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}


def _microbatches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(n, 6, generator=g) for n in (5, 3, 4)]


def _model(exported: bool) -> nn.Module:
    torch.manual_seed(0)
    return TrackedScaled() if exported else Tracked()


@pytest.fixture(scope="module", params=["torch.fx", "torch.export"])
def planned(request: pytest.FixtureRequest) -> tuple[bool, Plan]:
    """The model planned into 2 stages, the plan travelled as every rank gets it (pickled)."""
    exported = request.param == "torch.export"
    model = _model(exported)
    made = plan(model, _microbatches()[0], ranks=2, microbatches=3, kwargs={"scale": 1.0} if exported else None)
    assert dict(model.named_buffers())["seen"] == 0  # the user's model is never touched
    return exported, pickle.loads(pickle.dumps(made))


def _trained(run: Any, module: nn.Module) -> dict[str, torch.Tensor]:
    """The buffers of ``module`` after a forward and backward of each micro-batch in turn through ``run``."""
    for x in _microbatches():
        run(x).sum().backward()
    return {name.split(".", 1)[1] if name[:2] in ("0.", "1.") else name: b for name, b in module.named_buffers()}


def _unsplit(exported: bool) -> dict[str, torch.Tensor]:
    model = _model(exported)
    return _trained(model, model)


def _staged(made: Plan, cut: int, recompute: bool) -> tuple[nn.Module, Any]:
    """The plan cut at ``cut`` (every node of both stages recomputed where ``recompute``), its two stages as
    one module, and a run of them one after the other."""
    partition = dataclasses.replace(made.partition, cuts=(0, cut, len(made.graph.nodes)))
    if recompute:
        stages = []
        for stage, (a, b) in zip(partition.stages, [(0, cut), (cut, len(made.graph.nodes))], strict=True):
            stages.append(dataclasses.replace(stage, recompute=tuple(n.name for n in made.graph.nodes[a:b])))
        partition = dataclasses.replace(partition, stages=tuple(stages))
    made = dataclasses.replace(made, partition=partition)
    first, second = made.build_stage(0), made.build_stage(1)

    def run(x: torch.Tensor) -> torch.Tensor:
        sent = first(x)
        out: torch.Tensor = second(*(sent if isinstance(sent, tuple) else (sent,)))
        return out

    return nn.ModuleDict({"0": first, "1": second}), run


def test_every_update_is_in_the_captured_graph() -> None:
    """torch.fx's own tracer runs ``self.seen.add_(1)`` and ``self.ema.mul_(0.9)`` while tracing and records
    neither; hintpipe's records both, and the capture leaves the buffers as the model's."""
    captured = capture(Tracked())
    code = captured.module.code
    assert "seen.add_(1)" in code and "ema.mul_(0.9)" in code
    assert dict(captured.module.named_buffers())["seen"] == 0
    assert "seen.add_(1)" in fx_traced(Tracked(), None).code  # the trace itself, before the capture's passes


def test_torch_export_s_updates_survive_its_re_trace() -> None:
    """The re-trace every exported graph goes through (as on every rank, unpickled) ran an update made of a
    buffer and constants once and dropped it: the batch norm's count, the counter."""
    module = exported(TrackedScaled(), (_microbatches()[0],), {"scale": 1.0})
    updates = [n for n in module.graph.nodes if str(n.target) == "aten.add_.Tensor" and n.args[1] == 1]
    assert {n.args[0].target for n in updates} == {"seen", "bn.num_batches_tracked"}


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
def test_wherever_the_cut_falls_the_stages_update_what_the_model_updates(
    planned: tuple[bool, Plan], recompute: bool
) -> None:
    exported, made = planned
    expected = _unsplit(exported)
    assert set(expected) >= UPDATED and expected["seen"] == 3 and expected["bn.num_batches_tracked"] == 3
    for cut in allowed_cuts(made.graph, value_uses(made.graph, made.profiles)):
        both, run = _staged(pickle.loads(pickle.dumps(made)), cut, recompute)  # each cut from the plan's buffers
        got = _trained(run, both)
        for name in UPDATED:
            torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=f"cut {cut}: {name}")


def test_no_cut_falls_between_the_nodes_that_touch_a_written_buffer(planned: tuple[bool, Plan]) -> None:
    """``self.ema.mul_(0.9).add_(x)``: the buffer's first update returns the buffer, which the second writes
    again; a cut between them would send the buffer to the next rank, which would write its received copy. Every
    node from the first that touches the average to the last is in one stage; the counter, touched by one node,
    and the batch norm, one node of torch.fx's graph, block nothing of their own."""
    _, made = planned
    names = [n.name for n in made.graph.nodes]
    touching = [i for i, n in enumerate(made.graph.nodes) if _touches(n, "ema")]
    first, last = min(touching), max(touching)
    assert last - first >= 2, names  # the two updates and the value the second adds in between
    allowed = allowed_cuts(made.graph, value_uses(made.graph, made.profiles))
    assert not [c for c in allowed if first < c <= last], names
    assert first in allowed and last + 1 in allowed, names


def _touches(node: Any, buffer: str) -> bool:
    """Whether ``node`` takes the buffer (a ``get_attr`` of it) or what an in-place call on it returned."""
    seen = [a for a in node.all_input_nodes if a.op == "get_attr" and a.target == buffer]
    return bool(seen) or any(_touches(a, buffer) for a in node.all_input_nodes if _in_place(a))


def _in_place(node: Any) -> bool:
    target = node.target
    name = target._schema.name if isinstance(target, torch._ops.OpOverload) else str(target)
    return name.endswith("_")


class Cached(nn.Module):
    """A buffer written by item (``self.cache[:n] = h``, as a cache of keys is) and read two nodes later."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.cache: torch.Tensor
        self.register_buffer("cache", torch.zeros(8, 4))
        self.table: torch.Tensor
        self.register_buffer("table", torch.ones(4))  # read, never written: it blocks no cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x)) * self.table
        self.cache[: h.shape[0]] = h.detach()
        g = h + 1
        out: torch.Tensor = g * self.cache.sum()
        return out


def test_a_buffer_written_by_item_spans_from_its_write_to_its_last_read() -> None:
    """Before, torch.fx recorded the write and then read the written cache as a constant, frozen at its value
    while tracing."""
    model, x = Cached(), torch.randn(3, 4)
    captured = capture(model)
    nodes = [n.name for n in captured.nodes]
    (first, last), *others = updated_buffer_spans(captured.module, captured.nodes)
    assert not others, nodes  # the table is read only
    assert nodes[first] == "setitem" and nodes[last].startswith("sum"), nodes
    torch.testing.assert_close(captured.module(x), model(x), rtol=0, atol=0)


class ClampedInPlace(nn.Module):
    """A buffer whose only write is one of torch.fx's in-place calls, read again later."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.level: torch.Tensor
        self.register_buffer("level", torch.tensor([-1.0, 2.0, -3.0, 4.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.how == "functional":
            nn.functional.relu(self.level, inplace=True)
        elif self.how == "torch":
            torch.relu_(self.level)
        else:
            self.act(self.level)
        out: torch.Tensor = self.b(h) + self.level
        return out


@pytest.mark.parametrize("how", ["functional", "torch", "module"])
def test_a_buffer_written_by_an_in_place_flag_spans_from_its_write_to_its_last_read(how: str) -> None:
    """Before, only methods ending in ``_``, ``[] =``, ``+=`` and operators' schemas counted as writes: a buffer
    written by ``F.relu(buf, inplace=True)``, ``torch.relu_(buf)`` or an ``nn.ReLU(inplace=True)`` had no span,
    and a cut between the write and a later read left the reading stage its own copy, never written."""
    model, x = ClampedInPlace(how), torch.randn(3, 4)
    captured = capture(model, example=(x,))
    nodes = [n.name for n in captured.nodes]
    (first, last), *others = updated_buffer_spans(captured.module, captured.nodes)
    assert not others, nodes
    assert nodes[last].startswith("add"), nodes  # the read after the second linear layer
    assert last - first >= 2, nodes  # the write comes before the second linear layer
    uses = value_uses(captured, profile(captured, (x,), repeats=1))
    assert not any(first < cut <= last for cut in allowed_cuts(captured, uses)), nodes
    expected = ClampedInPlace(how)
    expected.load_state_dict(model.state_dict())
    torch.testing.assert_close(captured.module(x), expected(x), rtol=0, atol=0)


def test_a_recomputed_group_copies_only_the_buffers_its_forward_writes() -> None:
    """Found on the group's first forward, by value; afterwards only those are copied per micro-batch, not a
    large constant one (a mask of positions) that the forward only reads."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask: torch.Tensor
            self.seen: torch.Tensor
            self.register_buffer("mask", torch.ones(64, 64))
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.add_(1)
            out: torch.Tensor = x * self.mask[: x.shape[0], : x.shape[1]].sum()
            return out

    group = Masked()
    for expected_seen in (1.0, 2.0):
        noted: list[tuple[torch.Tensor, torch.Tensor]] = []
        with noting_updates(group, noted):
            group(torch.ones(2, 3))
        assert [buffer for buffer, _ in noted] == [group.seen]
        assert float(noted[0][1]) == expected_seen - 1  # its value before the forward
