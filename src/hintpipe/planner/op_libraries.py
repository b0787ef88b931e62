"""The Python modules that define the custom operators a captured graph calls.

[Note: custom operators in a travelling graph]
A graph may call an operator that a library defines in Python with ``torch.library.custom_op``: a Hugging
Face mixture-of-experts layer captures as ``torch.ops.transformers.grouped_mm_fallback``, the token-sorted
grouped matmul that keeps the tokens-per-expert counts inside one opaque operator (``transformers`` registers
it when its MoE code is imported). A plan travels to every rank pickled, and the graph re-traces its code on
the way in, where the operator must already exist: a rank that did not import that code itself (one that
only receives the plan, with ``share_plan``) fails with "'_OpNamespace' 'transformers' object has no
attribute 'grouped_mm_fallback'". The pickled graph therefore names the modules that define its custom
operators, and unpickling imports them before the graph (:class:`OpLibraries`). Operators that a compiled
extension registers are not found this way; its module must be imported by the rank's own code.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx

from hintpipe.planner.portable import FollowingOp


@dataclasses.dataclass(frozen=True)
class OpLibraries:
    """Modules to import before a graph that calls their custom operators unpickles: unpickling this imports
    them, so it travels ahead of the graph (see [Note: custom operators in a travelling graph])."""

    modules: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_imported, (self.modules,))


def _imported(modules: tuple[str, ...]) -> OpLibraries:
    for name in modules:
        importlib.import_module(name)
    return OpLibraries(modules)


def op_libraries(module: fx.GraphModule) -> OpLibraries:
    """The modules that define, with ``torch.library.custom_op``, the operators ``module``'s graph calls
    (directly, or through a :class:`~hintpipe.planner.portable.FollowingOp`)."""
    names = {node.target._schema.name for node in module.graph.nodes if _is_operator(node.target)}
    names |= {_qualified(m.op_name) for m in module.modules() if isinstance(m, FollowingOp)}
    defined = _custom_ops()
    found = {getattr(getattr(defined[name], "_init_fn", None), "__module__", None) for name in names & set(defined)}
    return OpLibraries(tuple(sorted(m for m in found if isinstance(m, str))))


def _is_operator(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def _qualified(op_name: str) -> str:
    """``ns::name`` of a :class:`FollowingOp`'s ``torch.ops.ns.name.overload`` (a function's name stays)."""
    parts = op_name.split(".")
    return f"{parts[2]}::{parts[3]}" if len(parts) == 5 and parts[:2] == ["torch", "ops"] else op_name


def _custom_ops() -> dict[str, Any]:
    """torch's table of the operators defined with ``torch.library.custom_op``, by ``ns::name`` (empty where
    this torch keeps none)."""
    from torch._library import custom_ops

    table = getattr(custom_ops, "OPDEFS", {})  # a WeakValueDictionary
    return dict(table.items()) if isinstance(table, Mapping) else {}
