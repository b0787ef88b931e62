"""Tensor parallelism for the built-in gpt-mini, through PyTorch's own API.

Megatron's split of a transformer block, written as a
``parallelize_module`` plan: the attention's ``q``, ``k`` and ``v``
projections column-wise (each rank computes whole heads of its share), the
output projection row-wise (partial sums, all-reduced); the MLP's up
projection column-wise and its down projection row-wise. Each block thus costs
two all-reduces forward and two backward, and its input and output are whole
(replicated) activations, which is what the pipeline sends between stages.
Norms, embeddings and the LM head stay replicated: every rank of the group
computes them, and their gradients come out equal without a reduction.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hintpipe.apps.models import Block

#: How each linear layer of one :class:`~hintpipe.apps.models.Block` (after :meth:`Block.unfuse_qkv`) is split:
#: by output columns or by input rows (torch's ``ColwiseParallel`` and ``RowwiseParallel``).
BLOCK_PLAN = {"q": "colwise", "k": "colwise", "v": "colwise", "proj": "rowwise", "mlp.0": "colwise", "mlp.2": "rowwise"}


def parallelize_stage(stage: nn.Module, mesh: DeviceMesh, heads: int) -> nn.Module:
    """Split every block of ``stage`` over the ranks of ``mesh`` (a 1-D tensor-parallel mesh), in place.

    Raises:
        ValueError: if the heads do not divide among the ranks.
    """
    # Imported here: torch.distributed.tensor takes about 0.5 s to import, which every rank would pay.
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    size = mesh.size()
    if heads % size:
        raise ValueError(f"{heads} attention heads do not divide among {size} tensor-parallel ranks")
    for block in [m for m in stage.modules() if isinstance(m, Block)]:
        block.unfuse_qkv()
        parallelize_module(block, mesh, {name: styles[style]() for name, style in BLOCK_PLAN.items()})
    return stage
