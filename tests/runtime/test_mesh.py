"""Several axes: pipelines inside data parallelism, on a DeviceMesh, against the unsplit model."""

from __future__ import annotations

import copy
import queue
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor, Replicate, Shard

from conftest import hang_bound
from groups import Case, run_cases, succeeded
from hintpipe.apps.gradcheck import RELATIVE_TOLERANCE
from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.apps.tensor_parallel import parallelize_stage
from hintpipe.apps.training import TrainConfig, _train_rank
from hintpipe.cli import main
from hintpipe.cli.train import result_json
from hintpipe.planner.plan import Plan, plan
from hintpipe.runtime.assembly import Seams
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.launch import RankFailure, run_ranks
from hintpipe.runtime.loop.emulated import EmulatedCosts, EmulatedExecutor
from hintpipe.runtime.parallel.fsdp import FsdpOptions, check_sharding, shard_stages
from hintpipe.runtime.parallel.mesh import DP_AXES, Layout, build_mesh, dp_mesh
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.runtime.transport.mailbox import GlooTransport
from hintpipe.runtime.transport.protocol import Connection
from hintpipe.runtime.transport.wire import Message, MessageKind, Value
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.task import Kind

MODEL = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)
#: The longest sequences MODEL's 64 positions take (the config refuses the default 64).
LENGTHS = SeqLenDist(63)
MICROBATCHES = 4
TIMEOUT = 30.0
# AdamW divides by sqrt(v) + eps: with torch's eps (1e-8), a float-noise difference of 1e-8 in a near-zero
# gradient moves a parameter by up to lr. With 1e-6 the same noise moves it by 1e-2 lr at most.
EPS = 1e-6


def _batch(step: int, replica: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Replica ``replica``'s micro-batches of step ``step``: lengths vary per micro-batch."""
    inputs, targets, _ = make_batch(MODEL, MICROBATCHES, 2, SeqLenDist(16, 0.5), step, 100 + replica)
    return inputs, targets


def _titan_mesh(world: int, dp_name: str) -> DeviceMesh:
    """A mesh as torchtitan's ``ParallelDims`` builds it: ``pp`` outer, its data-parallel dimension named
    ``dp_replicate`` or ``dp_shard``, and that flattened into ``dp`` (torchtitan's ``_flatten``)."""
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", dp_name))
    mesh[(dp_name,)]._flatten(mesh_dim_name="dp")
    return mesh


def _data_parallel(
    rank: int,
    world: int,
    policy: str,
    hint: str,
    dp: int,
    mode: str = "replicate",
    titan: str = "",
    options: FsdpOptions | None = None,
) -> tuple[float, float]:
    """Train 3 AdamW steps on DP x PP and on the unsplit model with the global batch; returns the largest
    gradient difference after step 0 and the largest parameter difference after step 2 (this rank's stages).
    ``titan`` names the data-parallel dimension of a torchtitan mesh; ``options`` are FSDP2's, given to the
    pipeline."""
    mesh = build_mesh(world, dp=dp) if not titan else _titan_mesh(world, titan)
    layers = build_layers(MODEL)
    reference = nn.Sequential(*copy.deepcopy(layers))
    stages = split_layers(layers, world // dp)
    pipe = Pipeline.from_modules(
        stages,
        loss_fn=lm_loss,
        microbatches=MICROBATCHES,
        hint=hint,
        policy=policy,
        mesh=mesh,
        timeout=TIMEOUT,
        data_parallel=mode,
        fsdp=options,
    )
    replica = pipe.layout.replica_of(rank)
    optimizer = torch.optim.AdamW([p for m in pipe.modules.values() for p in m.parameters()], eps=EPS)
    expected_optimizer = torch.optim.AdamW(reference.parameters(), eps=EPS)
    offsets = [0]
    for stage in stages:
        offsets.append(offsets[-1] + len(list(stage.children())))

    def pairs() -> list[tuple[nn.Parameter, nn.Parameter]]:
        """This rank's parameters with the unsplit model's same ones."""
        return [
            pair
            for s, module in pipe.modules.items()
            for pair in zip(module.parameters(), reference[offsets[s] : offsets[s + 1]].parameters(), strict=True)
        ]

    grad_diff = 0.0
    with pipe:
        for step in range(3):
            inputs, targets = _batch(step, replica)
            pipe.step(inputs, targets)
            total = dp * MICROBATCHES
            for r in range(dp):  # the unsplit model sees the global batch: every replica's micro-batches
                for x, y in zip(*_batch(step, r), strict=True):
                    torch.autograd.backward(lm_loss(reference(x), y) / total)
            if step == 0:
                grad_diff = max((_full(p.grad) - q.grad).abs().max().item() for p, q in pairs())  # type: ignore[arg-type,operator]
            optimizer.step()
            expected_optimizer.step()
            optimizer.zero_grad()
            expected_optimizer.zero_grad()
    return grad_diff, max((_full(p) - q).abs().max().item() for p, q in pairs())


DATA_PARALLEL = [
    ("fixed", "1f1b", "replicate"),
    ("ready", "zb-h1", "replicate"),
    ("fixed", "1f1b", "fsdp"),
    ("greedy", "1f1b", "fsdp"),
    ("ready", "zb-h1", "fsdp"),  # FSDP2 under a split backward: reduced after each stage's last W
]
#: torchtitan's meshes, and stages the caller sharded with FSDP2's options (name, worker arguments).
OTHER_DATA_PARALLEL = {
    "titan dp_replicate": ("ready", "1f1b", 2, "replicate", "dp_replicate"),
    "titan dp_shard": ("ready", "zb-h1", 2, "fsdp", "dp_shard"),
    # Not under a split backward (zb-h1): resharded between B and W, the weight pass finds no parameters.
    "reshard after forward": ("ready", "1f1b", 2, "fsdp", "", {"reshard_after_forward": True}),
    "mixed precision": (
        "fixed",
        "1f1b",
        2,
        "fsdp",
        "",
        {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.float64, reduce_dtype=torch.float64)},
    ),
}


@pytest.mark.parametrize("name", OTHER_DATA_PARALLEL)
def test_torchtitans_meshes_and_fsdp2_options_train_as_the_unsplit_model(
    four_ranks: dict[str, list[Any]], name: str
) -> None:
    # The same tolerances as below; in float64 (the mixed-precision case) the stages compute more exactly than
    # the float32 reference, which stays within them.
    for grad_diff, param_diff in succeeded(four_ranks[name]):
        assert grad_diff < 1e-6
        assert param_diff < 2e-5


def _hsdp(rank: int, world: int) -> tuple[bool, bool]:
    """A linear layer sharded over torchtitan's ``(dp_replicate, dp_shard)`` mesh: whether its weight is
    replicated over the first and sharded over the second, and whether its shards put together are the weight."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=DP_AXES)
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    weight = layer.weight.detach().clone()
    shard_stages({0: layer}, dp_mesh(mesh))
    sharded = layer.weight
    assert isinstance(sharded, DTensor)
    hsdp = sharded.placements == (Replicate(), Shard(0))
    return hsdp, bool(torch.equal(sharded.full_tensor(), weight))


def test_torchtitans_replicate_and_shard_dimensions_shard_as_hsdp(four_ranks: dict[str, list[Any]]) -> None:
    # Replicated across dp_replicate, sharded within dp_shard: FSDP2's HSDP on the 2-D data-parallel mesh.
    assert succeeded(four_ranks["hsdp"]) == [(True, True)] * 4


@pytest.mark.parametrize(("policy", "hint", "mode"), DATA_PARALLEL)
def test_data_parallel_pipelines_train_as_the_unsplit_model(
    four_ranks: dict[str, list[Any]], policy: str, hint: str, mode: str
) -> None:
    # Tolerances: float32 sums in another order (micro-batches, then replicas) differ in the last bits: 1e-6
    # on gradients of order 1e-1; parameters after 3 steps of lr 1e-3 within 2e-5 (see EPS).
    for grad_diff, param_diff in succeeded(four_ranks[f"dp {policy} {hint} {mode}"]):
        assert grad_diff < 1e-6
        assert param_diff < 2e-5


def test_a_layout_from_a_mesh_of_any_dimension_order() -> None:
    class FakeMesh:
        def __init__(self, grid: torch.Tensor, names: tuple[str, ...]) -> None:
            self.mesh, self.mesh_dim_names, self.ndim = grid, names, grid.ndim

    grid = torch.arange(8).reshape(2, 2, 2)  # (dp, pp, tp)
    layout = Layout.of(FakeMesh(grid, ("dp", "pp", "tp")))  # type: ignore[arg-type]
    assert layout.pipelines == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert layout.replicas == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert (layout.dp, layout.tp, layout.pp) == (2, 2, 2)
    swapped = Layout.of(FakeMesh(grid.permute(1, 0, 2), ("pp", "dp", "tp")))  # type: ignore[arg-type]
    assert swapped == layout
    only_pp = Layout.of(FakeMesh(torch.arange(4), ("pp",)))  # type: ignore[arg-type]
    assert only_pp == Layout.world(4)
    with pytest.raises(ValueError) as refused:
        Layout.of(FakeMesh(grid[0], ("x", "pp")))  # type: ignore[arg-type]
    assert str(refused.value) == (
        "the mesh's dimensions must be named from ('dp', 'pp', 'tp') or torchtitan's ('dp_replicate', 'dp_shard') "
        "in place of dp (each once), got ('x', 'pp')"
    )
    with pytest.raises(ValueError, match=r"^the mesh names dp and \['dp_shard'\]: give one data-parallel axis$"):
        Layout.of(FakeMesh(grid, ("dp", "dp_shard", "pp")))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"increase along the mesh's pp dimension, got \[1, 0\]"):
        Layout.of(FakeMesh(torch.tensor([1, 0]), ("pp",)))  # type: ignore[arg-type]


def test_torchtitans_mesh_names_are_one_data_parallel_axis_replicate_outer() -> None:
    class FakeMesh:
        def __init__(self, grid: torch.Tensor, names: tuple[str, ...]) -> None:
            self.mesh, self.mesh_dim_names, self.ndim = grid, names, grid.ndim

    # torchtitan's order (pp, dp_replicate, dp_shard, tp), flattened into dp as torchtitan's own _flatten("dp").
    grid = torch.arange(16).reshape(2, 2, 2, 2)
    titan = Layout.of(FakeMesh(grid, ("pp", "dp_replicate", "dp_shard", "tp")))  # type: ignore[arg-type]
    flat = Layout.of(FakeMesh(grid.reshape(2, 4, 2), ("pp", "dp", "tp")))  # type: ignore[arg-type]
    assert titan == flat
    assert titan.replicas[0] == (0, 2, 4, 6)  # pp 0, tp 0: replicate 0 shards 0, 1; replicate 1 shards 0, 1
    assert (titan.dp, titan.tp, titan.pp) == (4, 2, 2)
    shard_only = Layout.of(FakeMesh(torch.arange(4).reshape(2, 2), ("dp_shard", "pp")))  # type: ignore[arg-type]
    assert shard_only == Layout.of(FakeMesh(torch.arange(4).reshape(2, 2), ("dp", "pp")))  # type: ignore[arg-type]


class _Tied(nn.Module):
    """An embedding whose weight is also the output layer's: the first and the last stage share it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.mid = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = nn.functional.linear(self.mid(self.embed(ids)), self.embed.weight)
        return out


def _tied_steps(replica: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(10 + replica)
    steps = []
    for _ in range(3):  # variable lengths per micro-batch
        ids = [torch.randint(0, 16, (2, n + 1), generator=g) for n in (3, 7, 5, 2)]
        steps.append(([x[:, :-1] for x in ids], [x[:, 1:] for x in ids]))
    return steps


def _tied_worker(rank: int, world: int, planned: Plan, policy: str, mode: str) -> dict[str, torch.Tensor]:
    mesh = build_mesh(world, dp=2)
    pipe = Pipeline.from_plan(planned, loss_fn=lm_loss, policy=policy, mesh=mesh, data_parallel=mode)
    params = list({id(p): p for m in pipe.modules.values() for p in m.parameters()}.values())
    optimizer = torch.optim.AdamW(params, lr=0.05)
    with pipe:
        for xs, ys in _tied_steps(pipe.layout.replica_of(rank)):
            pipe.step(xs, ys)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return {n: _full(p.detach()).clone() for m in pipe.modules.values() for n, p in m.named_parameters()}


TIED = [("ready", "replicate"), ("greedy", "fsdp")]  # fixed: the planner's tests


def _tied_plan() -> tuple[_Tied, Plan]:
    torch.manual_seed(0)
    model = _Tied()
    return model, plan(model, torch.randint(0, 16, (2, 5)), ranks=2, microbatches=4, repeats=1)


@pytest.mark.parametrize(("policy", "mode"), TIED)
def test_a_tied_weight_with_data_parallel_pipelines_trains_like_the_unsplit_model(
    four_ranks: dict[str, list[Any]], policy: str, mode: str
) -> None:
    model, planned = _tied_plan()
    assert planned.tied_stages == ((0, 1),)
    results = succeeded(four_ranks[f"tied {policy} {mode}"])
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=0.05)
    for step in range(3):
        for replica in range(2):  # the global batch: both replicas' micro-batches, each weighing 1 / 8
            xs, ys = _tied_steps(replica)[step]
            for x, y in zip(xs, ys, strict=True):
                torch.autograd.backward(lm_loss(reference(x), y) / (2 * len(xs)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    expected = dict(reference.named_parameters())
    for state in results:  # every rank of both replicas, the tied weight on both stages
        for name, value in state.items():
            torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-5)


# -- tensor parallelism ------------------------------------------------------------------------------------------


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _unsplit_names(stage: int, name: str, offsets: list[int]) -> str:
    """A stage parameter's name in the unsplit ``nn.Sequential`` (its q, k, v are rows of the fused qkv)."""
    layer, rest = name.split(".", 1)
    return f"{offsets[stage] + int(layer)}.{rest}"


class _Relay:
    """A transport of this test's own, not derived from the built-in ones: it builds the gloo transport from
    the same connection and passes every call on, counting the messages it sent."""

    def __init__(self, inner: GlooTransport) -> None:
        self.inner = inner
        self.inbox: queue.SimpleQueue[Message] = inner.inbox
        self.sent = 0

    @classmethod
    def connect(cls, connection: Connection) -> _Relay:
        return cls(GlooTransport.connect(connection))

    def send(self, peer: int, kind: MessageKind, step: int, stage: int, mb: int, tensors: Sequence[Value]) -> None:
        self.sent += 1
        self.inner.send(peer, kind, step, stage, mb, tensors)

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        self.inner.notify(peer, step, stage, mb, of)

    def ask(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        self.inner.ask(peer, step, stage, mb, of)

    def get(self, timeout: float | None) -> Message | None:
        return self.inner.get(timeout)

    def flush(self, timeout: float) -> None:
        self.inner.flush(timeout)

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        self.inner.close(timeout, error)


def _tensor_parallel(
    rank: int,
    world: int,
    policy: str,
    dp: int,
    tp: int,
    coordinate: bool,
    delays: bool,
    mode: str = "replicate",
    relay: bool = False,
) -> tuple[float, float, list[tuple[int, int, int]]]:
    """Train 3 AdamW steps on DP x TP x PP (``relay``: over :class:`_Relay`) and on the unsplit model; returns the
    largest gradient difference after step 0, the largest parameter difference after step 2, the task order."""
    mesh = build_mesh(world, dp=dp, tp=tp)
    layers = build_layers(MODEL)
    reference = nn.Sequential(*copy.deepcopy(layers))
    pp = world // (dp * tp)
    stages = split_layers(layers, pp)
    offsets = [0]
    for stage in stages:
        offsets.append(offsets[-1] + len(list(stage.children())))
    tp_mesh = mesh["tp"]
    stages = [parallelize_stage(stage, tp_mesh, MODEL.heads) for stage in stages]
    pipe = Pipeline.from_modules(
        stages,
        loss_fn=lm_loss,
        microbatches=MICROBATCHES,
        policy=policy,
        mesh=mesh,
        timeout=TIMEOUT,
        slack_microbatches=2 if delays else 0,  # room to run ahead: choices that can differ
        data_parallel=mode,
        # With delays, the TP leader's messages arrive at once, its follower's 100 ms late (many tasks of this model).
        seams=Seams(
            coordinate_tp=coordinate,
            injection=Injection.parse([f"comm:{100 * (rank % tp)}ms"] if delays else [], seed=rank),
            transport=_Relay.connect if relay else None,
        ),
    )
    replica = pipe.layout.replica_of(rank)
    optimizer = torch.optim.AdamW([p for m in pipe.modules.values() for p in m.parameters()], eps=EPS)
    expected_optimizer = torch.optim.AdamW(reference.parameters(), eps=EPS)
    expected = dict(reference.named_parameters())
    order: list[tuple[int, int, int]] = []

    def differences(of_grad: bool) -> float:
        worst = 0.0
        for s, module in pipe.modules.items():
            for name, param in module.named_parameters():
                value = _full(param.grad if of_grad else param)  # type: ignore[arg-type]
                parts = name.rsplit(".", 2)
                if parts[-2] in "qkv" and len(parts[-2]) == 1:  # a row block of the unsplit qkv
                    fused = _unsplit_names(s, name.replace(f".{parts[-2]}.", ".qkv."), offsets)
                    whole = expected[fused].grad if of_grad else expected[fused]
                    assert whole is not None
                    target = whole.chunk(3, dim=0)["qkv".index(parts[-2])]
                else:
                    unsplit = expected[_unsplit_names(s, name, offsets)]
                    target = unsplit.grad if of_grad else unsplit  # type: ignore[assignment]
                worst = max(worst, (value - target).abs().max().item())
        return worst

    grad_diff = 0.0
    with pipe:
        for step in range(3):
            inputs, targets = _batch(step, replica)
            pipe.step(inputs, targets)
            order += [(step, task.stage, int(task.kind) * 1000 + task.mb) for _, task, _, _ in pipe.reports[-1].records]
            for r in range(dp):
                for x, y in zip(*_batch(step, r), strict=True):
                    torch.autograd.backward(lm_loss(reference(x), y) / (dp * MICROBATCHES))
            if step == 0:
                grad_diff = differences(of_grad=True)
            optimizer.step()
            expected_optimizer.step()
            optimizer.zero_grad()
            expected_optimizer.zero_grad()
    if relay:
        assert isinstance(pipe.carrier, _Relay) and pipe.carrier.sent > 0 and pipe.coordination is not None
    return grad_diff, differences(of_grad=False), order


TENSOR_PARALLEL = [
    ("fixed", 1, "replicate"),
    ("greedy", 1, "replicate"),
    ("ready", 1, "replicate"),
    ("fixed", 2, "fsdp"),  # FSDP2 over dp of TP DTensors: 2-D parameters, as torchtitan shards them
    ("greedy", 2, "replicate"),
    ("ready", 2, "fsdp"),
]


@pytest.mark.parametrize(("policy", "dp", "mode"), TENSOR_PARALLEL)
def test_tensor_parallel_stages_train_as_the_unsplit_model(
    four_ranks: dict[str, list[Any]], eight_ranks: dict[str, list[Any]], policy: str, dp: int, mode: str
) -> None:
    group = four_ranks if dp == 1 else eight_ranks
    for grad_diff, param_diff, _ in succeeded(group[f"tp {policy} dp{dp} {mode}"]):  # tolerances as for dp
        assert grad_diff < 1e-6
        assert param_diff < 2e-5


def test_a_transport_of_its_own_carries_a_coordinated_tensor_parallel_pipeline(
    four_ranks: dict[str, list[Any]],
) -> None:
    # Any class with the protocol's methods and an inbox, built from a Connection, is a transport: the
    # coordination's decisions join its inbox (no test of a concrete class), and training is the unsplit model's.
    for grad_diff, param_diff, _ in succeeded(four_ranks["tp ready over a transport of its own"]):
        assert grad_diff < 1e-6
        assert param_diff < 2e-5


def _uncoordinated_orders(rank: int, world: int) -> list[tuple[int, int, int]]:
    """TP 2 x PP 2 without coordination, on stages that run no collectives (the members may then differ
    without failing): the leaders hold what 1F1B holds, the followers may run 2 micro-batches ahead and get
    their messages 300 ms late. Returns this rank's task order."""
    mesh = build_mesh(world, tp=2)
    follower = rank % 2 == 1
    pipe = Pipeline.from_modules(
        split_layers(build_layers(MODEL), 2),
        loss_fn=lm_loss,
        microbatches=MICROBATCHES,
        policy="greedy",
        mesh=mesh,
        timeout=TIMEOUT,
        slack_microbatches=2 if follower else 0,
        seams=Seams(coordinate_tp=False, injection=Injection.parse([f"comm:{300 if follower else 0}ms"], seed=rank)),
    )
    with pipe:
        pipe.step(*_batch(0, 0))
        return [(task.stage, int(task.kind), task.mb) for _, task, _, _ in pipe.reports[-1].records]


def test_tensor_parallel_members_need_one_decision_for_readiness(four_ranks: dict[str, list[Any]]) -> None:
    # Without coordination, stage 0's leader runs 1F1B (its budget allows nothing else: F0 F1 B0 F2 ...) while
    # its follower, whose gradients come 300 ms late (forced: far longer than a task), runs F2 and F3 ahead.
    orders = succeeded(four_ranks["uncoordinated orders"])
    hint = generate_hint("1f1b", 2, MICROBATCHES).lists[0]
    assert orders[0] == [(t.stage, int(t.kind), t.mb) for t in hint]
    assert orders[1][:4] == [(0, int(Kind.F), mb) for mb in range(4)]
    # With coordination, and real tensor-parallel collectives, every member runs its leader's order.
    coordinated = succeeded(four_ranks["tp greedy coordinated, delayed"])
    for leader, follower in [(coordinated[0], coordinated[1]), (coordinated[2], coordinated[3])]:
        assert leader[2] == follower[2]  # one sequence per group
        assert leader[0] < 1e-6 and follower[0] < 1e-6


def _batched_decisions(rank: int, world: int) -> tuple[list[list[tuple[int, int, int]]], int, int]:
    """Emulated TP 2 x PP 2 under ``ready`` with room for 2 more micro-batches, 4 steps; stage 0's leader gets
    its gradients 60 ms late (forced: several tasks), so it runs forwards ahead of its hint. Returns this rank's
    order of tasks per step and its decisions and their messages (the leader's; 0 on a follower)."""
    mesh = build_mesh(world, tp=2)
    costs = EmulatedCosts((0.004, 0.004), (0.008, 0.008), (0.0, 0.0), reference_size=1)
    position = rank // 2
    pipe = Pipeline(
        {position: nn.Identity()},
        loss_fn=lm_loss,
        microbatches=8,
        policy="ready",
        mesh=mesh,
        emulate=costs,
        slack_microbatches=2,
        timeout=TIMEOUT,
        seams=Seams(injection=Injection.parse(["tp:2:0.3", f"comm:{60 if rank == 0 else 0}ms"], seed=rank)),
    )
    orders = []
    with pipe:
        for _ in range(4):
            pipe.step()
            records = pipe.reports[-1].records
            orders.append([(task.stage, int(task.kind), task.mb) for r, task, _, _ in records if r == position])
        assert pipe.coordination is not None
        return orders, pipe.coordination.decisions, pipe.coordination.messages


def test_tensor_parallel_leaders_announce_what_they_will_certainly_run_in_one_message(
    four_ranks: dict[str, list[Any]],
) -> None:
    results = succeeded(four_ranks["batched decisions"])
    hint = [(t.stage, int(t.kind), t.mb) for t in generate_hint("1f1b", 2, 8).lists[0]]
    leader_orders = results[0][0]
    assert any(order != hint for order in leader_orders)  # forced: stage 0's leader ran ahead of its hint
    for leader, follower in [(results[0], results[1]), (results[2], results[3])]:
        orders, decisions, messages = leader
        assert follower[0] == orders  # every step, the same sequence on both members
        assert decisions == 4 * 16  # one decision per task of every step (8 micro-batches, F and B) ...
        assert messages < decisions  # ... fewer messages: the tasks certain to follow travel together
        assert follower[1:] == (0, 0)  # followers decide nothing


def _crash(rank: int, world: int, victim: int) -> None:
    mesh = build_mesh(world, tp=2)
    stages = [parallelize_stage(s, mesh["tp"], MODEL.heads) for s in split_layers(build_layers(MODEL), 2)]
    pipe = Pipeline.from_modules(
        stages,
        loss_fn=lm_loss,
        microbatches=MICROBATCHES,
        policy="ready",
        mesh=mesh,
        timeout=5,
        seams=Seams(injection=Injection.parse(faults=[f"crash:{victim}:1"])),
    )
    with pipe:
        for step in range(3):
            pipe.step(*_batch(step, 0))


@pytest.mark.parametrize(("victim", "role"), [(0, "leader"), (1, "follower")])
def test_a_crashed_tensor_parallel_member_ends_every_rank(victim: int, role: str) -> None:
    began = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        run_ranks(_crash, 4, victim, timeout=5)
    assert time.monotonic() - began < hang_bound(5)
    text = str(failure.value)
    assert f"rank {victim}: exited without a result" in text, text  # the {role} crashed
    assert _named_ranks(text) == {0, 1, 2, 3}, text  # and every other rank ended with an error of its own


def _named_ranks(text: str) -> set[int]:
    """The ranks a RankFailure's lines name (``rank 1: ...`` or, merged, ``ranks 0, 2, 3: ...``)."""
    named: set[int] = set()
    for line in text.splitlines():
        head, _, _ = line.partition(": ")
        if head.startswith("rank"):
            named |= {int(r) for r in head.split(" ", 1)[1].split(", ")}
    return named


Timed = tuple[tuple[int, int, int], float, float, float]  # (task: stage, kind, mb), start, end, own drawn duration


def _coupled(rank: int, world: int, policy: str) -> list[Timed]:
    """Emulated TP 2 x PP 2 with a lognormal factor per member and task; returns this rank's tasks of step 1
    on the machine's wall clock, with the duration drawn for this member."""
    mesh = build_mesh(world, tp=2)
    costs = EmulatedCosts((0.01, 0.01), (0.02, 0.02), (0.0, 0.0), reference_size=1)
    pipe = Pipeline(
        {rank // 2: nn.Identity()},
        loss_fn=lm_loss,
        microbatches=4,
        policy=policy,
        mesh=mesh,
        emulate=costs,
        seams=Seams(injection=Injection.parse(["tp:2:0.5"], seed=7)),
    )
    executor = pipe.executor
    assert isinstance(executor, EmulatedExecutor)
    timed: list[Timed] = []
    sleep = executor._sleep

    def timed_sleep(stage: int, kind: Kind, mb: int, size: Sequence[float]) -> None:
        began = time.time()
        sleep(stage, kind, mb, size)  # the task's own cost, then the all-reduce with the other member
        if executor.step == 1:
            timed.append(((stage, int(kind), mb), began, time.time(), executor.duration(stage, kind, mb, size)))

    executor._sleep = timed_sleep  # type: ignore[method-assign]
    with pipe:
        for _ in range(2):
            pipe.step()
    return timed


@pytest.mark.parametrize("policy", ["fixed", "ready"])
def test_an_emulated_tensor_parallel_task_waits_for_its_slowest_member(
    four_ranks: dict[str, list[Any]], policy: str
) -> None:
    ranks = succeeded(four_ranks[f"coupled {policy}"])
    for first, second in [(ranks[0], ranks[1]), (ranks[2], ranks[3])]:  # each stage's TP group
        assert [t[0] for t in first] == [t[0] for t in second] and len(first) == 8  # F, B of 4 micro-batches
        assert any(abs(a[3] - b[3]) > 0.002 for a, b in zip(first, second, strict=True))  # their draws differ
        for a, b in zip(first, second, strict=True):  # sleeps only oversleep: the slowest member bounds both
            slowest = max(a[1] + a[3], b[1] + b[3])
            assert min(a[2], b[2]) >= slowest - 1e-3  # 1 ms: wall-clock reads on two processes


# -- the mesh's device ----------------------------------------------------------------------------------------


def _mesh_device(rank: int, world: int) -> tuple[str, str]:
    """The device type of a mesh built for CPU ranks on a machine that reports CUDA (as a GPU machine would):
    the run's device, not whatever the machine has."""
    present = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        mesh = build_mesh(world, dp=2, device="cpu")
    finally:
        torch.cuda.is_available = present
    return mesh.device_type, str(build_mesh(world, dp=2, device=torch.device("cpu")).device_type)


def test_the_mesh_is_on_the_runs_device_whatever_the_machine_has(four_ranks: dict[str, list[Any]]) -> None:
    assert succeeded(four_ranks["mesh device"]) == [("cpu", "cpu")] * 4


def test_fsdp_is_refused_on_ranks_that_share_a_gpu() -> None:
    message = (
        r"^data_parallel='fsdp' on ranks that share a GPU: FSDP2's reduce-scatter of CUDA tensors needs NCCL, "
        r"which refuses two ranks on one device; use data_parallel='replicate', or a GPU per rank$"
    )
    with pytest.raises(ValueError, match=message):
        check_sharding(torch.device("cuda", 0), own_gpu=False)
    check_sharding(torch.device("cuda", 0), own_gpu=True)  # a GPU each: NCCL
    check_sharding(torch.device("cpu"), own_gpu=False)  # CPU ranks: gloo reduces host tensors


# -- the command line --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tp", "3"], "--tp 3 must divide gpt-mini's 4 attention heads"),
        (["--tp", "2", "--model", "mlp"], "--tp has a tensor-parallel plan for the built-in gpt-mini only"),
        (["--dp", "0"], "--dp must be at least 1, got 0"),
    ],
)
def test_bad_axes_are_refused(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["train", "--ranks", "2", "--microbatches", "4", "--steps", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def _checked_config(dp: int, tp: int, mode: str) -> TrainConfig:
    """``hintpipe train --check-grads`` on DP x PP or TP x PP: step 0's gradients against the unsplit model."""
    return TrainConfig.of(
        model=MODEL,
        seq_len_dist=LENGTHS,
        ranks=2,
        dp=dp,
        tp=tp,
        data_parallel=mode,
        microbatches=MICROBATCHES,
        steps=1,
        hint="zb-h1",
        timeout=TIMEOUT,
        check_grads=True,
    )


CHECKED = [(2, 1, "replicate"), (2, 1, "fsdp"), (1, 2, "replicate")]


@pytest.mark.parametrize(("dp", "tp", "mode"), CHECKED)
def test_check_grads_compares_every_layout_with_the_unsplit_model(
    four_ranks: dict[str, list[Any]], dp: int, tp: int, mode: str
) -> None:
    # Replicas' gradients averaged as the run averages them, FSDP2 and TP shards put together (full_tensor),
    # the unsplit model on every replica's micro-batches: float32 sums in another order, within 1e-6 abs.
    result = succeeded(four_ranks[f"check grads dp{dp} tp{tp} {mode}"])[0]
    assert result.max_grad_abs_diff < 1e-6
    assert result.max_grad_rel_diff < 1e-4  # the tolerance --check-grads states (RELATIVE_TOLERANCE)
    assert result_json(result)["grad_rel_tolerance"] == RELATIVE_TOLERANCE == 1e-4


def test_check_grads_on_three_axes(eight_ranks: dict[str, list[Any]]) -> None:
    whole = succeeded(eight_ranks["axes 4 steps"])[0]  # DP2 x TP2 x PP2, FSDP2 of tensor-parallel DTensors
    assert whole.max_grad_abs_diff < 1e-6 and whole.max_grad_rel_diff < RELATIVE_TOLERANCE


def _three_axes_config(
    folder: str, steps: int, *, resume: bool = False, save: bool = True, check_grads: bool = False
) -> TrainConfig:
    """``hintpipe train --dp 2 --tp 2 --data-parallel fsdp --ranks 2`` with checkpoints every 2 steps."""
    return TrainConfig.of(
        model=MODEL,
        seq_len_dist=LENGTHS,
        ranks=2,
        dp=2,
        tp=2,
        data_parallel="fsdp",
        microbatches=MICROBATCHES,
        steps=steps,
        timeout=TIMEOUT,
        checkpoint_dir=folder if save else None,
        checkpoint_every=2 if save else 0,
        resume=resume,
        check_grads=check_grads,
    )


def test_train_on_three_axes_saves_checkpoints_that_resume_exactly(eight_ranks: dict[str, list[Any]]) -> None:
    # FSDP2 over dp of tensor-parallel DTensors: parameters and AdamW state saved as shards, put together again.
    first, rest, whole = (succeeded(eight_ranks[run])[0] for run in ("axes 2 steps", "axes resumed", "axes 4 steps"))
    assert rest.resumed_from == 2
    assert first.losses + rest.losses == whole.losses  # bitwise: the resumed run is the uninterrupted one
    shown = result_json(whole)
    assert (shown["dp"], shown["tp"], shown["ranks"]) == (2, 2, 2)
    assert shown["coordination_ms"] > 0  # ready: the leaders announced their decisions
    # Per pipeline position: the FSDP2 reduction started before the step's end and blocked its rank a while.
    assert len(shown["dp_overlap_ms"]) == len(shown["dp_exposed_ms"]) == 2
    assert all(v > 0 for v in [*shown["dp_overlap_ms"], *shown["dp_exposed_ms"]])


def _reshard_refused(rank: int, world: int) -> str:
    stages = split_layers(build_layers(MODEL), 2)
    try:
        Pipeline.from_modules(
            stages,
            loss_fn=lm_loss,
            microbatches=MICROBATCHES,
            hint="zb-h1",
            mesh=build_mesh(world, dp=2),
            data_parallel="fsdp",
            fsdp={"reshard_after_forward": True},
        )
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_resharding_after_forward_is_refused_under_a_split_backward(four_ranks: dict[str, list[Any]]) -> None:
    assert (
        four_ranks["reshard refused"]
        == [
            "fsdp reshard_after_forward=True with hint 'zb-h1': its split backward (W) computes weight gradients after "
            "FSDP2 has resharded the stage; keep the default (False) or use a hint without W"
        ]
        * 4
    )


@pytest.fixture(scope="module")
def four_ranks() -> dict[str, list[Any]]:
    """Every 4-rank case of this module on one spawned group."""
    cases = {f"dp {p} {h} {m}": Case(_data_parallel, (p, h, 2, m)) for p, h, m in DATA_PARALLEL}
    cases |= {name: Case(_data_parallel, arguments) for name, arguments in OTHER_DATA_PARALLEL.items()}
    cases["hsdp"] = Case(_hsdp)
    cases["reshard refused"] = Case(_reshard_refused)
    cases |= {f"check grads dp{d} tp{t} {m}": Case(_train_rank, (_checked_config(d, t, m),)) for d, t, m in CHECKED}
    _, planned = _tied_plan()
    cases |= {f"tied {p} {m}": Case(_tied_worker, (planned, p, m)) for p, m in TIED}
    cases |= {
        f"tp {p} dp1 {m}": Case(_tensor_parallel, (p, 1, 2, True, False, m)) for p, dp, m in TENSOR_PARALLEL if dp == 1
    }
    cases["uncoordinated orders"] = Case(_uncoordinated_orders)
    cases["tp greedy coordinated, delayed"] = Case(_tensor_parallel, ("greedy", 1, 2, True, True))
    relayed = ("ready", 1, 2, True, False, "replicate", True)
    cases["tp ready over a transport of its own"] = Case(_tensor_parallel, relayed)
    cases["batched decisions"] = Case(_batched_decisions)
    cases |= {f"coupled {p}": Case(_coupled, (p,)) for p in ("fixed", "ready")}
    cases["mesh device"] = Case(_mesh_device)
    return run_cases(4, cases, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def eight_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """Every 8-rank case (DP 2 x TP 2 x PP 2) of this module on one spawned group."""
    cases = {
        f"tp {p} dp2 {m}": Case(_tensor_parallel, (p, 2, 2, True, False, m)) for p, dp, m in TENSOR_PARALLEL if dp == 2
    }
    folder = str(tmp_path_factory.mktemp("axes") / "ck")
    cases["axes 2 steps"] = Case(_train_rank, (_three_axes_config(folder, 2),))
    cases["axes resumed"] = Case(_train_rank, (_three_axes_config(folder, 4, resume=True),))
    cases["axes 4 steps"] = Case(_train_rank, (_three_axes_config(folder, 4, save=False, check_grads=True),))
    return run_cases(8, cases, timeout=TIMEOUT)
