"""Each captured node's module path (``transformer.h.0.attn``): how a plan names where a stage starts.

torch.export records, per node, the stack of modules whose code made it (``nn_module_stack``); a captured
graph is re-traced once (as every rank's unpickling will), which keeps no metadata, so the paths are carried
across by :func:`carry_module_paths`.
"""

from __future__ import annotations

import torch.fx as fx

from hintpipe.planner.portable import CONTAINER

#: Where a node's module path is kept: the planner's tables name each stage by its first node's.
MODULE_PATH = "module_path"


def module_path(node: fx.Node) -> str:
    """The path of the innermost module whose code made ``node`` (``transformer.h.0.attn``): what a user
    recognises where a node's own name (``view_default_5``) says nothing; "" for the model's own code."""
    if MODULE_PATH in node.meta:
        return str(node.meta[MODULE_PATH])
    stack = node.meta.get("nn_module_stack")  # a portable call (FollowingOp) keeps its call's
    if stack:
        path = str(list(stack.values())[-1][0])
        return "" if path.startswith("_") else path  # export's placeholder for "no module"
    if node.op == "call_module" and not str(node.target).startswith(f"{CONTAINER}."):
        return str(node.target)
    return ""


def carry_module_paths(paths: list[tuple[str, str, str]], retraced: fx.GraphModule) -> None:
    """Keep each node's module path across the re-trace, which keeps no metadata: the re-traced graph has the
    exported one's nodes in the same order, less some it ran at trace time, so each node takes the path of
    the next exported node that calls the same target. Only calls are matched: inputs and attributes are
    named anew by the re-trace, so looking for them would scan the rest of the graph for each in vain."""
    at = 0
    for node in retraced.graph.nodes:
        if not node.op.startswith("call_"):
            continue
        found = next((i for i in range(at, len(paths)) if paths[i][:2] == (node.op, str(node.target))), None)
        if found is not None:
            node.meta[MODULE_PATH] = paths[found][2]
            at = found + 1
