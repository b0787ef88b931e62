"""Data parallelism by FSDP2: each stage's parameters sharded over its replicas, as torchtitan does.

``fully_shard`` on every stage module over the mesh's ``dp`` dimension; the
gradients are reduce-scattered (averaged) once per step, by the stage's last
backward of the step: every earlier backward runs with gradient sync off and
keeps the parameters unsharded (``set_requires_gradient_sync`` and
``set_reshard_after_backward``, the switches torch.distributed.pipelining's
``stage.py`` uses), so a step all-gathers each stage's parameters once and
reduces its gradients once. Forward keeps the parameters gathered
(``reshard_after_forward=False``): micro-batches follow each other.

Not with a split backward: the weight pass (``stage_backward_weight``) reuses
the graph of the input pass, whose parameters FSDP2 has resharded by then
(a ``KeyError`` on a parameter's ``AccumulateGrad``); use the replicated mode
(:mod:`hintpipe.runtime.data_parallel`) with W-splitting hints.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from hintpipe.runtime.executor import Executor, ExecutorWrapper, Tensors


def shard_stages(modules: Mapping[int, nn.Module], mesh: DeviceMesh) -> None:
    """Shard every stage module over ``mesh`` (the ``dp`` dimension), in place."""
    for module in modules.values():
        fully_shard(module, mesh=mesh, reshard_after_forward=False)


class ShardedExecutor(ExecutorWrapper):
    """Turns FSDP2's gradient sync on for each stage's last backward of the step only."""

    def __init__(self, inner: Executor, modules: Mapping[int, nn.Module], microbatches: int) -> None:
        super().__init__(inner)
        self.modules = {s: m for s, m in modules.items() if isinstance(m, FSDPModule)}
        self.microbatches = microbatches
        self._done: dict[int, int] = {}

    def start_step(self) -> None:
        """Called by the pipeline at the start of each step."""
        self._done = dict.fromkeys(self.modules, 0)

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        module = self.modules.get(stage)
        if module is not None:
            last = self._done[stage] == self.microbatches - 1
            module.set_requires_gradient_sync(last)
            module.set_reshard_after_backward(last)
            self._done[stage] += 1
        return self.inner.backward(stage, mb, grads)
