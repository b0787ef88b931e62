"""A built stage is an ``nn.Module`` like any other: it runs on the device it is moved to, whatever device the
model was captured on, and its dropout follows ``.train()`` and ``.eval()``, whatever mode the model was in.

The GPU's failures are caught here without one: the ``meta`` device stands in for a device other than the
capture's (a stage that kept ``device=cpu`` anywhere, or boxed a number on the CPU, gives a CPU tensor or
fails there). GPT-2 from a config with its default dropout 0.1. The whole-graph node timing (the GPU profile)
runs here on the host's clock, on nodes that sleep known times.
"""

from __future__ import annotations

import copy
import pickle
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx
import transformers
from torch import nn

from hintpipe.planner.capture import capture
from hintpipe.planner.graph_timing import HostMarks, graph_times
from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.plan_file import load_plan, save_plan
from hintpipe.planner.portable import FollowingOp, make_portable
from hintpipe.planner.profile import profile, run_node
from hintpipe.runtime.loop.executor import StageExecutor, as_input
from stage_code import named_devices

VOCAB = 64
KWARGS = {"use_cache": False}


def _gpt2(dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )  # fmt: skip
    model: nn.Module = transformers.GPT2LMHeadModel(config)
    return model


def _planned(model: nn.Module) -> Plan:
    return plan(model, torch.randint(0, VOCAB, (2, 9)), ranks=2, microbatches=2, repeats=1, kwargs=KWARGS)


def _run(stages: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    values: Any = (x,)
    for stage in stages:
        values = stage(*values)
        values = values if isinstance(values, tuple) else (values,)
    assert len(values) == 1 and isinstance(values[0], torch.Tensor)
    out: torch.Tensor = values[0]
    return out


@pytest.fixture(scope="module")
def planned_in_each_mode() -> dict[str, tuple[nn.Module, Plan]]:
    """GPT-2 with dropout, planned in train mode and planned in eval mode (as after ``from_pretrained``)."""
    out = {}
    for mode in ("train", "eval"):
        model = _gpt2()
        model.train(mode == "train")
        out[mode] = (model, _planned(model))
    return out


@pytest.mark.parametrize("planned_in", ["train", "eval"])
def test_dropout_follows_the_stage_mode_not_the_mode_at_planning(
    planned_in_each_mode: dict[str, tuple[nn.Module, Plan]], planned_in: str
) -> None:
    model, planned = planned_in_each_mode[planned_in]
    stages = [planned.build_stage(i) for i in range(planned.stages)]
    x = torch.randint(0, VOCAB, (2, 12))
    for stage in stages:
        stage.eval()
    with torch.no_grad():
        first, second = _run(stages, x), _run(stages, x)
        expected = copy.deepcopy(model).eval()(x, **KWARGS).logits
    assert torch.equal(first, second)  # no dropout in eval mode: the same logits twice
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)
    for stage in stages:
        stage.train()
    with torch.no_grad():
        first, second = _run(stages, x), _run(stages, x)
    # Dropout at 0.1 on every activation: two forwards of one batch differ, and differ from eval mode's.
    assert not torch.equal(first, second) and not torch.allclose(first, expected, atol=1e-3)


def test_a_stage_names_no_device_and_keeps_its_tensors_as_parameters_or_buffers(
    planned_in_each_mode: dict[str, tuple[nn.Module, Plan]],
) -> None:
    _, planned = planned_in_each_mode["train"]
    assert "device" not in planned.graph.module.code
    for i in range(planned.stages):
        stage = planned.build_stage(i)
        assert isinstance(stage, fx.GraphModule) and "device" not in stage.code
        held = {id(t) for t in [*stage.parameters(), *stage.buffers()]}
        loose = [
            f"{name}.{key}"
            for name, module in stage.named_modules()
            for key, value in vars(module).items()
            if isinstance(value, torch.Tensor) and id(value) not in held
        ]
        assert loose == []  # a plain tensor attribute would stay behind on .to(device)
        # No state dict sees the following operators' anchors.
        assert not any("anchor" in key for key in stage.state_dict())


def test_a_stage_moved_to_another_device_computes_there(
    planned_in_each_mode: dict[str, tuple[nn.Module, Plan]],
) -> None:
    """Stage 0 of GPT-2 makes position ids with ``arange`` and sends the batch size and sequence length on
    (Python numbers: [Note: numbers cross a cut on the host]); on ``meta``, every tensor it sends is a meta
    tensor, and stage 1 on ``meta`` takes the numbers as they came (it took each with ``.item()`` of a 0-d
    tensor, which ``meta`` refuses and a GPU waits for)."""
    _, planned = planned_in_each_mode["train"]
    travelled: Plan = pickle.loads(pickle.dumps(planned))  # as the plan reaches every rank
    first, second = (travelled.build_stage(i).to("meta") for i in range(2))
    out = first(torch.randint(0, VOCAB, (2, 12)).to("meta"))
    outputs = out if isinstance(out, tuple) else (out,)
    tensors = [v for v in outputs if isinstance(v, torch.Tensor)]
    assert [t.device.type for t in tensors] == ["meta"] * len(tensors)
    assert sorted(v for v in outputs if not isinstance(v, torch.Tensor)) == [2, 12]  # the batch and its length
    logits = second(*(as_input(v) for v in outputs))
    assert logits.device.type == "meta" and logits.shape == (2, 12, VOCAB)


def test_a_received_number_is_taken_as_it_came() -> None:
    """What a stage receives is made a leaf input (:func:`as_input`): a tensor is detached (and requires grad
    where floating), a number stays the number it is, with nothing on a device to read it back from."""
    assert as_input(12) == 12 and type(as_input(12)) is int
    assert as_input(0.5) == 0.5 and as_input(True) is True
    hidden = as_input(torch.ones(2, 3, device="meta"))
    assert isinstance(hidden, torch.Tensor) and hidden.is_leaf and hidden.requires_grad


def test_a_plan_file_loads_for_the_model_on_another_device(
    planned_in_each_mode: dict[str, tuple[nn.Module, Plan]], tmp_path: Path
) -> None:
    """Saved from a plan made on the CPU, loaded for the model on ``meta``: the graph captures to the same
    code (no device in it), so the file is accepted, and its stages are on the model's device."""
    model, planned = planned_in_each_mode["train"]
    path = save_plan(planned, tmp_path / "gpt2.plan")
    elsewhere = copy.deepcopy(model).to("meta")
    elsewhere.tie_weights()  # type: ignore[operator]  # .to("meta") makes a new tensor for each name of a tied one; tie them again
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # load_state_dict into meta tensors copies nothing, and says so
        loaded, _ = load_plan(path, elsewhere)
    assert loaded.fingerprint == planned.fingerprint
    assert {p.device.type for p in loaded.build_stage(1).parameters()} == {"meta"}


class _Literal(nn.Module):
    """What torch.fx records as constants: ``training=self.training`` and a literal ``device="cpu"``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position = torch.arange(x.shape[-1], device="cpu", dtype=x.dtype)
        return nn.functional.dropout(self.linear(x) + position, 0.5, self.training)


def test_a_traced_model_s_constant_flag_and_device_follow_the_module() -> None:
    graph = capture(_Literal().eval())  # captured in train mode whatever the model's mode
    following = [m for m in graph.module.modules() if isinstance(m, FollowingOp)]
    assert sorted((m.op_name, m.training_at, m.device_at) for m in following) == [
        ("torch._VariableFunctionsClass.arange", None, "device"),
        ("torch.nn.functional.dropout", "training", None),  # torch.fx passes it by name
    ]
    module = graph.module
    x = torch.ones(4, 8)
    module.eval()
    assert torch.equal(module(x), module(x))
    module.train()
    assert not torch.equal(module(x), module(x))
    assert module.to("meta")(x.to("meta")).device.type == "meta"


class _Sends(nn.Module):
    """A first stage that sends a number on beside its activations: the rows of its batch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return torch.tanh(self.linear(x)), x.shape[0]


class _Takes(nn.Module):
    """A last stage that computes with the number it receives as a number."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, hidden: torch.Tensor, rows: int) -> torch.Tensor:
        assert type(rows) is int
        out: torch.Tensor = self.linear(hidden).sum(0) / rows
        return out


@pytest.mark.parametrize("split_backward", [False, True])
def test_the_executor_sends_a_number_on_and_gives_it_no_gradient(split_backward: bool) -> None:
    """A stage's forward returns a number beside a tensor: the executor sends it on as it is, the next stage
    takes it as a number, its gradient slot on the way back is None, and the parameters' gradients are the
    unsplit computation's, with the backward whole or split into B and W."""
    torch.manual_seed(0)
    stages = {0: _Sends(), 1: _Takes()}
    x = torch.randn(3, 4)
    parameters = [*stages[0].parameters(), *stages[1].parameters()]
    expected = torch.autograd.grad(stages[1](*stages[0](x)).sum(), parameters)
    executor = StageExecutor(stages, 1, lambda out, target: out.sum(), split_backward=split_backward)
    sent, _ = executor.forward(0, 0, [x], None, 1.0)
    assert isinstance(sent[0], torch.Tensor) and sent[1:] == [3]
    _, loss = executor.forward(1, 0, [as_input(v) for v in sent], None, 1.0)
    assert loss is not None
    grads = executor.backward(1, 0, None)
    assert grads[0] is not None and grads[1] is None  # the number has no gradient
    executor.backward(0, 0, grads)
    if split_backward:
        executor.weight(1, 0)
        executor.weight(0, 0)
    for parameter, gradient in zip(parameters, expected, strict=True):
        assert parameter.grad is not None
        torch.testing.assert_close(parameter.grad, gradient)


@torch.fx.wrap
def _placed(x: torch.Tensor, device: Any) -> torch.Tensor:
    """A function of the model's own that takes a device by position (torch.fx keeps its call as a node)."""
    return x.to(device)


#: Every form of a device ([Note: every form of a device]), each a step after a linear layer ``y = linear(x)``.
#: Those that name a GPU cannot run here: only torch.fx, which records without running, captures them.
FORMS: dict[str, Any] = {
    "a method's keyword, a string": lambda x, y: y + x.new_ones(x.shape[-1], device="cpu"),
    "to, by position, a string": lambda x, y: y.to("cpu"),
    "to, by keyword, with a dtype": lambda x, y: y.to(device="cpu", dtype=torch.float64),
    "to a tensor's device, with a dtype": lambda x, y: y.to(x.device, torch.float64),  # export: aten.to.device
    "to, by position, a torch.device": lambda x, y: y.to(torch.device("cpu")),
    "cpu()": lambda x, y: y.cpu(),
    "a factory's keyword, a torch.device": lambda x, y: y + torch.ones(x.shape[-1], device=torch.device("cpu")),
    "a function's parameter, by position": lambda x, y: _placed(y, "cpu"),
    "to, by position, an int (a CUDA index)": lambda x, y: y.to(0),
    "to, by position, a CUDA torch.device": lambda x, y: y.to(torch.device("cuda", 1)),
    "cuda()": lambda x, y: y.cuda(),
    "cuda(index, non_blocking=...)": lambda x, y: y.cuda(1, non_blocking=True),
    "a factory's keyword, an int": lambda x, y: y + torch.zeros(x.shape[-1], device=0),
}
_ON_A_GPU = {"to, by position, an int (a CUDA index)", "to, by position, a CUDA torch.device", "cuda()"}
_ON_A_GPU |= {"cuda(index, non_blocking=...)", "a factory's keyword, an int"}


class _Form(nn.Module):
    """A linear layer, then one form of a device (``scale`` is a keyword input: it makes capture export)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.form = form

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        out: torch.Tensor = FORMS[self.form](x, self.linear(x) * scale)
        return out


@pytest.mark.parametrize(
    ("form", "capture_with"),
    [(form, "torch.fx") for form in FORMS] + [(form, "torch.export") for form in FORMS if form not in _ON_A_GPU],
)
def test_every_form_of_a_device_follows_the_module(form: str, capture_with: str) -> None:
    """Each form, captured by torch.fx or torch.export and re-traced as a plan travels: the code names no
    device, the module computes on ``meta`` once moved there (a form left as it was makes a CPU tensor there,
    which the next operator refuses or the output shows), and on the CPU it computes what the model does."""
    model = _Form(form)
    exported = capture_with == "torch.export"
    graph = capture(model, example=(torch.ones(3, 4),), kwargs={"scale": 1.0}) if exported else capture(model)
    module = pickle.loads(pickle.dumps(graph.module))  # re-traced, as on every rank
    assert named_devices(module) == []
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    if form not in _ON_A_GPU:
        assert torch.equal(module(x), model(x))
    out = copy.deepcopy(module).to("meta")(x.to("meta"))
    assert out.device.type == "meta" and out.shape == (3, 4)


def test_make_portable_leaves_a_graph_without_such_calls_alone() -> None:
    module = fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))
    code = module.code
    assert make_portable(module) == 0 and module.code == code


class _Sleep(torch.autograd.Function):
    """Identity that sleeps ``forward_s`` forward and ``backward_s`` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


class _Sleeper(nn.Module):
    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Sleep.apply(x, self.forward_s, self.backward_s)  # type: ignore[no-untyped-call]
        return out


def test_whole_graph_timing_gives_each_node_its_own_forward_and_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three nodes that sleep (forward, backward) = (10, 60), (80, 10), (10, 30) ms, timed in runs of the
    whole graph: each node's spans hold at least its own sleeps (noise only adds), and the longest sleeps are
    where they were slept (a span given to a neighbour would break one or the other: no margin is timed)."""
    sleeps = [(0.01, 0.06), (0.08, 0.01), (0.01, 0.03)]
    graph = capture(nn.Sequential(*(_Sleeper(f, b) for f, b in sleeps)), modules=["0", "1", "2"])
    times = graph_times(graph, [torch.ones(4)], run_node, repeats=2, marks=HostMarks())
    for (forward, backward), (slept_f, slept_b) in zip(times, sleeps, strict=True):
        assert forward >= slept_f and backward >= slept_b
    forwards, backwards = [f for f, _ in times], [b for _, b in times]
    assert forwards.index(max(forwards)) == 1 and backwards.index(max(backwards)) == 0
    # The profile's whole-graph path, on the host's clock (a sleep spends no thread time).
    monkeypatch.setattr("hintpipe.planner.profile.marks_for", lambda device: HostMarks())
    profiled = profile(graph, [torch.ones(4)], repeats=1, whole_graph=True)
    # Scaled to one run of the whole graph ([Note: the profile's scale]): the times are the nodes' shares of
    # it, so the longest sleeps are still where they were slept (a factor near 1 may take a node below its sleep).
    forwards, backwards = [p.forward_s for p in profiled], [p.backward_s for p in profiled]
    assert forwards.index(max(forwards)) == 1 and backwards.index(max(backwards)) == 0


def test_measured_stage_times_are_each_built_stage_s_forward_and_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stages cut before node 2 by ``split_points``, of nodes that sleep (20 ms, then 100 ms forward and
    backward): each stage's measured time holds at least its sleeps (a sleep is never shorter; on a loaded machine
    anything may take longer, so no upper bound and no order between the two), and the plan's parameters get no
    gradient from the measurement (it runs a copy)."""
    from hintpipe.planner.stage_timing import measure_stages

    model = nn.Sequential(_Sleeper(0.01, 0.01), nn.Linear(4, 4), _Sleeper(0.05, 0.05))
    planned = plan(
        model, torch.ones(2, 4), ranks=2, microbatches=2, repeats=1, modules=["0", "1", "2"], split_points=["2"]
    )
    assert planned.partition.cuts == (0, 2, 3)
    monkeypatch.setattr("hintpipe.planner.stage_timing.marks_for", lambda device: HostMarks())
    first, second = measure_stages(planned, [torch.ones(2, 4)], repeats=1)
    assert first >= 0.02 and second >= 0.10
    assert [p.grad for p in planned.graph.module.parameters()] == [None, None]
