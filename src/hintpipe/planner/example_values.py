"""What a captured graph's nodes compute on the example: which are numbers a cut may carry, and which are
values no gradient flows into. Found by running the graph once, since the graph's own metadata cannot tell.

[Note: numbers in an exported graph]
torch.export records a shape it keeps symbolic as ``sym_size`` nodes whose value is a number, which a cut
may carry like any tensor (as a number, in the message's header). Their ``meta["val"]`` does not survive
the re-trace that capture does (and unpickling repeats), so reading it after the re-trace finds no numbers:
every cut the sequence length crosses is then refused, and a transformer plans into one busy stage and one of
parameter-free operations. The re-traced graph itself is run instead.

[Note: values without a gradient]
A stage makes every floating-point tensor it receives a leaf that requires grad, so that it can send
the gradient back. A value no gradient flows into in the unsplit model (a mixture-of-experts layer's
token count per expert, from ``histc`` of sorted expert ids) then requires one after a cut, and an
operator with an integer result refuses it (``cumsum(counts, dtype=int32)``: "Autograd not support
dtype: Int"): the model would run or not by where the cut fell. The run tells which values those are
(``CapturedGraph.gradient_free``), and a stage that receives one detaches it. The run has every
floating-point parameter and input require grad, whatever the model's flags: a parameter frozen while
planning may be trained later, and a value it feeds must then carry a gradient across a cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

#: What a graph node may compute besides tensors and still send across a cut (as a number).
NUMBERS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def value_kinds(module: fx.GraphModule, nodes: Sequence[fx.Node], inputs: Sequence[Any]) -> tuple[set[int], set[int]]:
    """The positions in ``nodes`` of the nodes that compute a number, and of those whose value is a
    floating-point tensor no gradient flows into, from one run of ``module`` on ``inputs``."""
    values = _example_values(module, inputs)
    numbers = {i for i, n in enumerate(nodes) if isinstance(values.get(n), NUMBERS)}
    gradient_free = {i for i, n in enumerate(nodes) if _without_gradient(values.get(n))}
    return numbers, gradient_free


def _example_values(module: fx.GraphModule, inputs: Sequence[Any]) -> dict[fx.Node, Any]:
    """Every node's value in one run of ``module`` with every floating-point parameter and input requiring
    grad (see [Note: values without a gradient])."""
    frozen = [p for p in module.parameters() if p.is_floating_point() and not p.requires_grad]
    leaves = [v.detach().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v for v in inputs]
    try:
        for p in frozen:
            p.requires_grad_(True)
        with torch.enable_grad():
            return node_values(module, leaves)
    finally:
        for p in frozen:
            p.requires_grad_(False)


def node_values(module: fx.GraphModule, inputs: Sequence[Any]) -> dict[fx.Node, Any]:
    """Every node's value in one run of ``module`` on ``inputs``, in the caller's grad mode. All are kept until
    the run ends, so no two values share a storage by reuse of freed memory."""
    values: dict[fx.Node, Any] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            values[n] = value
            return value

    _Recorder(module).run(*inputs)
    return values


def _without_gradient(value: Any) -> bool:
    """Whether ``value`` is a floating-point tensor that no gradient flows into."""
    return isinstance(value, torch.Tensor) and value.is_floating_point() and not value.requires_grad
