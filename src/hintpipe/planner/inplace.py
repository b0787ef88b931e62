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

import inspect
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from hintpipe.planner.example_values import node_values
from hintpipe.tensor_bytes import tensors_in

__all__ = ["out_of_place", "out_of_place_by_example"]


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


def out_of_place_by_example(module: fx.GraphModule, inputs: Sequence[Any]) -> int:
    """Replace, in place, every in-place call torch.fx recorded on an intermediate that nothing else shares by
    its out-of-place twin, its later readers reading the twin's result; the number replaced (see [Note: in-place
    calls torch.fx records]).

    [Note: in-place calls torch.fx records]
    torch.fx records Python's own calls, not operators: ``nn.ReLU(inplace=True)`` as the module, ``F.relu(h,
    inplace=True)``, ``h.mul_(2)``, ``torch.relu_(h)``, and the code goes on reading ``h``, not the call's
    result. Profiling runs each node on its inputs made leaves that require grad, as a stage receives them after
    a cut, and autograd refuses an in-place call on such a leaf ("a leaf Variable that requires grad is being
    used in an in-place operation"): a model with one ``nn.ReLU(inplace=True)`` could not be planned at all.
    Which value a call writes into is not in the graph (no schema says whether ``h`` is a view of another
    value), so the graph is run once on the example and each tensor's storage read off: where the written value
    is a call's own result that no other value shares, the call becomes its out-of-place twin (``mul``,
    ``inplace=False``; a module's flag only when every call of it is replaced) and the readers after it read its
    result, which is what they read in the model. The values are the same, and the gradients too.
    """
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs) or not any(in_place_target(module, n) for n in module.graph.nodes):
        return 0  # nothing to replace, or an example the graph cannot run (planning says so in its words)
    replaced = 0
    while True:  # a value written twice (``h.mul_(2).add_(1)``) is replaced one call per pass
        fresh = _sole_owners(module, inputs)
        done = _replace_in_place_calls(module, fresh)
        if not done:
            break
        replaced += done
        module.graph.lint()
        module.recompile()
    return replaced


def _sole_owners(module: fx.GraphModule, inputs: Sequence[Any]) -> set[fx.Node]:
    """The call nodes whose result, in one run of ``module`` on ``inputs``, has a storage that no input,
    parameter, buffer or other node's result shares, except the in-place calls that write into it."""
    with torch.no_grad():
        values = node_values(module, inputs)
    holders: dict[int, set[fx.Node | None]] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        holders.setdefault(tensor.untyped_storage().data_ptr(), set()).add(None)
    for node, value in values.items():
        for tensor in tensors_in(value):
            holders.setdefault(tensor.untyped_storage().data_ptr(), set()).add(node)
    fresh = set()
    for node, value in values.items():
        if node.op not in ("call_function", "call_method", "call_module") or not isinstance(value, torch.Tensor):
            continue
        sharers = holders[value.untyped_storage().data_ptr()] - {node}
        if all(s is not None and _writes_into(module, s, node) for s in sharers):
            fresh.add(node)
    return fresh


def _writes_into(module: fx.GraphModule, call: fx.Node, value: fx.Node) -> bool:
    """Whether ``call`` writes into ``value``, or into what an in-place call on it returned (``h.mul_(2).add_(1)``:
    the ``add_`` writes into ``h``)."""
    target = in_place_target(module, call)
    while target is not None and target is not value:
        target = in_place_target(module, target)
    return target is value


def in_place_target(module: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """The value ``node`` writes into, if it is one of torch.fx's in-place calls, else None."""
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if first is None:
        return None
    if node.op == "call_method":
        name = str(node.target)
        return first if name.endswith("_") and not name.endswith("__") and hasattr(torch.Tensor, name[:-1]) else None
    if node.op == "call_function":
        if _inplace_argument(node) is not None:
            return first
        name = getattr(node.target, "__name__", "")
        twin = getattr(torch, name[:-1], None) if name.endswith("_") and not name.endswith("__") else None
        return first if getattr(torch, name, None) is node.target and callable(twin) else None
    if node.op == "call_module":
        return first if getattr(module.get_submodule(str(node.target)), "inplace", None) is True else None
    return None


def _inplace_argument(node: fx.Node) -> int | str | None:
    """Where a call of a function with an ``inplace`` flag (``F.relu``, ``F.dropout``) says True: the position in
    its arguments, ``"inplace"`` for a keyword, or None."""
    if node.kwargs.get("inplace") is True:
        return "inplace"
    try:
        parameters = list(inspect.signature(node.target).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    at = parameters.index("inplace") if "inplace" in parameters else len(node.args)
    return at if at < len(node.args) and node.args[at] is True else None


def _replace_in_place_calls(module: fx.GraphModule, fresh: set[fx.Node]) -> int:
    """One pass of :func:`out_of_place_by_example`: each in-place call on a value in ``fresh`` replaced, at most
    one per written value."""
    order = {node: i for i, node in enumerate(module.graph.nodes)}
    calls: dict[str, list[fx.Node]] = {}  # a module's calls, all of which must be replaced to clear its flag
    for node in module.graph.nodes:
        if node.op == "call_module" and in_place_target(module, node) is not None:
            calls.setdefault(str(node.target), []).append(node)
    modules_ok = {target for target, nodes in calls.items() if all(in_place_target(module, n) in fresh for n in nodes)}
    replaced, written = 0, set()
    for node in list(module.graph.nodes):
        target = in_place_target(module, node)
        if target is None or target not in fresh or target in written:
            continue
        if node.op == "call_module":
            if str(node.target) not in modules_ok:
                continue
            setattr(module.get_submodule(str(node.target)), "inplace", False)  # noqa: B010 (a flag of some modules)
        elif node.op == "call_method":
            node.target = str(node.target)[:-1]
        elif (at := _inplace_argument(node)) is not None:
            if isinstance(at, int):
                node.args = (*node.args[:at], False, *node.args[at + 1 :])
            else:
                node.kwargs = {**node.kwargs, "inplace": False}
        else:
            node.target = getattr(torch, getattr(node.target, "__name__", "")[:-1])
        for user in list(target.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(target, node)
        written.add(target)
        replaced += 1
    return replaced
