"""In-place operators on a graph's own intermediate values, made out-of-place.

[Note: in-place operators between stages]
torch.export keeps what ``forward`` did in place: a mixture-of-experts router that normalises its top-k
weights with ``weights /= weights.sum(-1, keepdim=True)`` becomes ``aten.div_(topk_values, sum)``, and an
inverse permutation written with ``inv[perm] = arange(n)`` becomes ``aten.index_put_(empty_like(perm), ...)``.
Run as one graph that is harmless: the mutated tensor is an intermediate that autograd tracks. Cut into
pieces it is not: a stage receives the values crossing its first cut as leaves that require grad (so that
it can send their gradients back), and the profile runs every node on such leaves, and autograd refuses an
in-place operator on a leaf that requires grad ("a leaf Variable that requires grad is being used in an
in-place operation"). Where the cut falls then decides whether the model runs at all.

An in-place call is replaced by its out-of-place twin (``aten.div_.Tensor`` by ``aten.div.Tensor``) where
nothing could see the difference: the mutated tensor is fresh (made by an operator that returns a new
tensor, not a view of another value), and every other reader of it comes before the call and makes no view
of it. The call's result then stands for the mutated tensor everywhere it is read afterwards (the trace
names the in-place call's result, never the mutated input, after a mutation), so the values are the same,
and the gradients too. What stays in place is what must: a parameter's or buffer's update (a running
mean), a model input, and any tensor another value may share memory with.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

__all__ = ["out_of_place"]


def out_of_place(module: fx.GraphModule) -> int:
    """Replace, in place, every in-place call on a fresh intermediate of ``module``'s graph by its out-of-place
    twin (see [Note: in-place operators between stages]); the number replaced."""
    order = {node: i for i, node in enumerate(module.graph.nodes)}
    replaced = 0
    for node in module.graph.nodes:
        twin = _out_of_place_twin(node.target) if node.op == "call_function" else None
        mutated = node.args[0] if node.args else None
        if twin is None or not isinstance(mutated, fx.Node):
            continue
        if _fresh(mutated) and _unseen(mutated, node, order):
            node.target = twin  # later calls on its result see a fresh tensor in turn
            replaced += 1
    if replaced:
        module.graph.lint()
        module.recompile()
    return replaced


def _out_of_place_twin(target: Any) -> torch._ops.OpOverload | None:
    """The out-of-place operator that computes what in-place ``target`` writes (``aten.div.Tensor`` for
    ``aten.div_.Tensor``): same namespace, name without the trailing underscore, same overload and
    arguments, one new tensor returned. None for anything else (an operator with no such twin included)."""
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.inplace not in target.tags:
        return None
    schema = target._schema
    name = schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):  # __iand__ and friends: Python's operator names
        return None
    packet = getattr(getattr(torch.ops, target.namespace), name[:-1], None)
    twin = getattr(packet, target._overloadname, None) if packet is not None else None
    if not isinstance(twin, torch._ops.OpOverload):
        return None
    same = [(a.name, str(a.type)) for a in twin._schema.arguments] == [(a.name, str(a.type)) for a in schema.arguments]
    return twin if same and not _aliases(twin) and len(twin._schema.returns) == 1 else None


def _aliases(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` may return (a view of) one of its inputs, or write into one: its schema says so."""
    schema = op._schema
    return any(r.alias_info is not None for r in schema.returns) or schema.is_mutable


def _fresh(node: fx.Node) -> bool:
    """Whether ``node``'s value is a tensor of its own: made by an operator that neither returns a view nor
    writes into an input (or taken out of such an operator's tuple of results). A model input, a parameter or
    a buffer is not: the model's caller or its state holds it too."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        node = node.args[0]
        if node.op != "call_function":
            return False
    return isinstance(node.target, torch._ops.OpOverload) and not _aliases(node.target)


def _unseen(value: fx.Node, call: fx.Node, order: dict[fx.Node, int]) -> bool:
    """Whether writing ``value`` in ``call`` is unseen by every other reader of it: each reads it before
    ``call`` and keeps no view of it (a view read afterwards would see the write)."""
    return all(
        user is call
        or (
            order[user] < order[call]
            and user.op == "call_function"
            and isinstance(user.target, torch._ops.OpOverload)
            and not _aliases(user.target)
        )
        for user in value.users
    )
