"""Cuts the caller names: a stage starts at each given submodule (``hintpipe.plan(..., split_points=...)``), where
the first operation using it stands in the captured graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hintpipe.planner.capture import CapturedGraph
from hintpipe.planner.search import PlanError
from hintpipe.planner.tables import NodeTables


def forced_cuts(graph: CapturedGraph, tables: NodeTables, names: Sequence[str], stages: int) -> tuple[int, ...]:
    """The cuts right before each named submodule: where the first node using it (its parameters, or a call of
    it) stands.

    Raises:
        PlanError: a count that is not one fewer than the stages, a name that is no submodule (or one that
            no node uses), a cut where a value other than a tensor crosses, or names out of order.
    """
    if len(names) != stages - 1:
        raise PlanError(f"{stages} stages need {stages - 1} split points, got {len(names)}: {list(names)}")
    allowed = set(tables.allowed)
    modules = dict(graph.module.named_modules()) | _original_modules(graph)
    cuts = [0]
    for name in names:
        if name not in modules:
            parent = name.rpartition(".")[0]  # its siblings: the parent's children, the model's own at the top
            near = sorted(m for m in modules if m and m.rpartition(".")[0] == parent)[:5]
            raise PlanError(f"split point {name!r} names no submodule of the model (beside it: {near})")
        at = next((i for i, node in enumerate(graph.nodes) if _uses(node, name)), None)
        if at is None:
            raise PlanError(f"split point {name!r}: no operation of the captured graph uses that submodule")
        if at not in allowed:
            raise PlanError(
                f"split point {name!r} (node {at}, {graph.nodes[at].name}): a value other than a tensor crosses "
                "there; choose a submodule whose input is tensors only"
            )
        if at <= cuts[-1]:
            raise PlanError(f"split point {name!r} comes before {names[len(cuts) - 2]!r}; give them in model order")
        cuts.append(at)
    return (*cuts, len(graph.nodes))


def _original_modules(graph: CapturedGraph) -> dict[str, Any]:
    """The model's submodule names as its parameters spell them (an exported graph keeps the names, and only
    the submodules that hold parameters)."""
    names: dict[str, Any] = {}
    for aliases in graph.aliases.values():
        for alias in aliases:
            parts = alias.split(".")[:-1]
            names |= {".".join(parts[:i]): None for i in range(1, len(parts) + 1)}
    return names


def _uses(node: Any, module: str) -> bool:
    """Whether ``node`` calls ``module`` (or one of its submodules) or reads one of its parameters."""
    prefix = module + "."
    if node.op == "call_module" and (str(node.target) == module or str(node.target).startswith(prefix)):
        return True
    return any(arg.op == "get_attr" and str(arg.target).startswith(prefix) for arg in node.all_input_nodes)
