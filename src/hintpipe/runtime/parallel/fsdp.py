"""Data parallelism by FSDP2: each stage's parameters sharded over its replicas, as torchtitan does.

``fully_shard`` on every stage module over the mesh's ``dp`` dimension; the
gradients are reduce-scattered (averaged over the replicas: the gradient of
the mean loss over the global batch) once per step, right after the stage's
last gradient task of the step. Every backward runs with gradient sync off
and keeps the parameters unsharded (``set_requires_gradient_sync`` and
``set_reshard_after_backward``), and the reduction is called by hand, as
torch.distributed.pipelining's ``stage.py`` does (``backward_maybe_with_nosync``,
``perform_reduce_grad``). So a step all-gathers each stage's parameters once
and reduces its gradients once. Forward keeps the parameters gathered
(``reshard_after_forward=False``): micro-batches follow each other.

That order is also what makes a split backward work: the weight pass
accumulates into the parameters the input pass's layers ran with (see
[Note: weight gradients put off] in :mod:`hintpipe.runtime.loop.weight_deferral`),
which are the unsharded tensors only until the stage reshards. With tensor-parallel stages the parameters are 2-D
DTensors (``Shard`` over dp of a tp placement), as torchtitan shards them.

FSDP2's own options (``mp_policy``, ``offload_policy``,
``reshard_after_forward``) pass through :class:`FsdpOptions`; and a stage the
caller has already sharded (``fully_shard`` with any options, on submodules
too, as torchtitan shards each block) is kept as it is: the runtime only
drives its gradient sync and resharding per step, which works on any
``FSDPModule``.

On a CPU with gloo the reduce-scatter runs in the calling thread, so the
stage's rank waits for it while its neighbours go on; on a GPU FSDP2 issues it
on its own stream and the rank goes on computing.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hintpipe.runtime.loop.hooks import Hook

if TYPE_CHECKING:
    # Imported where FSDP2 is used, not here: torch.distributed.fsdp pulls in DTensor, about 0.5 s of every
    # rank's start-up whether or not it shards.
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy

    from hintpipe.runtime.loop.step_state import StepState


def check_sharding(device: torch.device, own_gpu: bool) -> None:
    """Refuse FSDP2 where it cannot reduce: ranks that share a GPU.

    FSDP2 all-gathers parameters and reduce-scatters gradients as tensors on the mesh's device. Ranks that
    share a GPU have gloo process groups only (NCCL refuses two ranks on one device), and torch documents
    gloo's CUDA support as broadcast and all-reduce, not the all-gather and reduce-scatter FSDP2 calls.

    Raises:
        ValueError: on CUDA ranks that share a GPU.
    """
    if device.type == "cuda" and not own_gpu:
        raise ValueError(
            "data_parallel='fsdp' on ranks that share a GPU: FSDP2's reduce-scatter of CUDA tensors needs NCCL, "
            "which refuses two ranks on one device; use data_parallel='replicate', or a GPU per rank"
        )


class FsdpOptions(TypedDict, total=False):
    """FSDP2's options for each stage (``torch.distributed.fsdp.fully_shard``'s keywords of the same names).

    ``reshard_after_forward`` defaults to False here (micro-batches follow each other, so a stage gathered
    once per step stays gathered); True frees the gathered parameters after every forward and gathers
    them again for its backward: less memory, one more all-gather per micro-batch.
    """

    mp_policy: MixedPrecisionPolicy
    offload_policy: OffloadPolicy
    reshard_after_forward: bool | int


def shard_stages(modules: Mapping[int, nn.Module], mesh: DeviceMesh, options: FsdpOptions | None = None) -> None:
    """Shard every stage module over ``mesh`` (the data-parallel mesh: 1-D, or 2-D for HSDP, see
    :func:`~hintpipe.runtime.parallel.mesh.dp_mesh`), in place, with FSDP2's ``options``; a stage the caller
    sharded already keeps its own."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    keywords: FsdpOptions = {"reshard_after_forward": False}
    keywords.update(options or {})
    # FSDP2 warns when a module returns a view, in case the caller writes into it in place and so skips
    # the pre-backward hook; the runtime never writes into a stage's output (it sends it, or backwards it).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for module in modules.values():
        if not isinstance(module, FSDPModule):
            fully_shard(module, mesh=mesh, **keywords)


class ShardedReduction(Hook):
    """Runs every backward with FSDP2's gradient sync off and reduces each stage once, when its gradients
    of the step are complete (a step hook: see :mod:`hintpipe.runtime.loop.hooks`).

    The reduction is the one torch.distributed.pipelining's ``perform_reduce_grad`` runs: each parameter
    group's ``post_backward`` (reduce-scatter of the accumulated unsharded gradients, averaged over the
    replicas, and resharding), then the root's final callback, which waits for the reduce-scatters to
    land in the sharded parameters' ``.grad``. Until then the parameters stay unsharded, so a weight pass
    finds the very tensors its input pass's graph holds.
    """

    def __init__(self, modules: Mapping[int, nn.Module], rank: int) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.modules = {s: m for s, m in modules.items() if isinstance(m, FSDPModule)}
        self.rank = rank
        #: Per stage, when its reduction started in the step (perf_counter seconds).
        self.started: dict[int, float] = {}
        self._exposed = 0.0

    def begin_step(self, state: StepState) -> None:
        self.started.clear()
        self._exposed = 0.0
        for module in self.modules.values():
            module.set_is_last_backward(False)
            module.set_requires_gradient_sync(False)
            module.set_reshard_after_backward(False)

    def stage_done(self, stage: int) -> None:
        if stage not in self.modules:
            return
        self.started[stage] = began = time.perf_counter()
        _reduce(self.modules[stage])
        self._exposed += time.perf_counter() - began

    def end_step(self, state: StepState) -> None:
        """Every stage reduced its gradients (or the step lost tasks: a bug, said so); the report gets
        how long the earliest reduction had to overlap the step and the time the rank spent in them."""
        end = time.perf_counter()
        missing = sorted(set(self.modules) - set(self.started))
        if missing:
            raise RuntimeError(
                f"rank {self.rank}: stages {missing} did not finish their gradients in step {state.step}"
            )
        if self.started:
            state.measured["dp_overlap"] = min(end - began for began in self.started.values())
            state.measured["dp_exposed"] = self._exposed


def _reduce(module: FSDPModule) -> None:
    """Reduce-scatter ``module``'s accumulated gradients over its replicas and reshard it (see the class)."""
    from torch.distributed.fsdp import fully_shard

    module.set_is_last_backward(True)
    module.set_requires_gradient_sync(True)
    module.set_reshard_after_backward(True)
    state = fully_shard.state(module)  # type: ignore[attr-defined]
    for member in state._state_ctx.all_states:
        for group in member._fsdp_param_groups:
            group.post_backward()
    state._root_post_backward_final_callback()
