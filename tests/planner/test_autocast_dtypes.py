"""Dtypes torch.export fixed on a float32 example that an autocast would have made its own
(:mod:`hintpipe.planner.autocast_dtypes`): where the capture under a bfloat16 autocast has bfloat16, the stage
follows its own autocast; a capture that differs otherwise, or fails, leaves the graph as it was."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch import nn

from hintpipe.planner.autocast_dtypes import asserts_a_dtype, follow_autocast_dtypes


def _casting_to(dtype: torch.dtype, *, twice: bool = False) -> fx.GraphModule:
    """``x.to(dtype)`` as torch.export records it (after its check of ``x``'s dtype on the example)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (x,), {"dtype": torch.float32})
    y = graph.call_function(torch.ops.aten.to.dtype, (x, dtype))
    if twice:
        y = graph.call_function(torch.ops.aten.to.dtype, (y, dtype))
    graph.output(y)
    return fx.GraphModule(nn.Module(), graph)


def test_a_dtype_the_autocast_changes_follows_the_autocast_a_stage_runs_under() -> None:
    module = _casting_to(torch.float32)
    assert follow_autocast_dtypes(module, lambda: _casting_to(torch.bfloat16)) == 1
    x = torch.randn(3)
    assert module(x).dtype == torch.float32  # no autocast: the dtype captured
    with torch.autocast("cpu", torch.bfloat16):
        assert module(x).dtype == torch.bfloat16
    with torch.autocast("cpu", torch.float16):
        assert module(x).dtype == torch.float16
    with torch.autocast("cpu", torch.bfloat16), torch.autocast("cpu", enabled=False):
        assert module(x).dtype == torch.float32


def test_a_capture_that_differs_otherwise_or_fails_leaves_the_graph_as_captured() -> None:
    def refuses() -> fx.GraphModule:
        raise RuntimeError("the model refuses an autocast")

    for export in (lambda: _casting_to(torch.bfloat16, twice=True), refuses):
        module = _casting_to(torch.float32)
        before = module.code
        assert follow_autocast_dtypes(module, export) == 0
        assert module.code == before
    unchanged = _casting_to(torch.float32)
    assert follow_autocast_dtypes(unchanged, lambda: _casting_to(torch.float32)) == 0  # the dtype was its own


def test_exports_dtype_check_is_told_apart() -> None:
    assert [asserts_a_dtype(node) for node in _casting_to(torch.float32).graph.nodes] == [False, True, False, False]
