"""torch.fx's trace of a model, as hintpipe records it: buffers and their updates, item assignment into a
buffer, parametrized modules traced through, the arguments the example leaves out bound to their defaults,
in-place calls made out-of-place, and the regions and device-free calls of :mod:`~hintpipe.planner.regions` and
:mod:`~hintpipe.planner.portable`."""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch.fx as fx
from torch import nn
from torch.nn.utils import parametrize

from hintpipe.planner.capture_error import split_point
from hintpipe.planner.inplace import out_of_place, out_of_place_by_example
from hintpipe.planner.portable import make_portable
from hintpipe.planner.regions import keep_regions, recording

__all__ = ["ModelTracer", "fx_traced"]


def fx_traced(root: nn.Module, example: tuple[Any, ...] | None) -> fx.GraphModule:
    """``root`` traced by torch.fx as hintpipe records it (see the module's docstring).

    Raises:
        Exception: what torch.fx raises for code it cannot trace (several types).
    """
    tracer = ModelTracer(set())
    defaults = _defaults_left_out(root, example)
    with recording(tracer):  # [Note: autocast regions]
        graph = tracer.trace(root, concrete_args=defaults or None)
    _drop_specialised_inputs(graph, root, defaults)
    module = fx.GraphModule(root, graph)
    keep_regions(module)
    out_of_place(module)
    if example is not None:
        out_of_place_by_example(module, example)  # [Note: in-place calls torch.fx records]
    make_portable(module)
    return module


class _BufferProxy(fx.Proxy):
    """A traced value that records item assignment into a buffer (``self.cache[:n] = h``: the tracer gives the
    buffer as a proxy) as Python's ``operator.setitem``. Into any other value it is refused, as torch.fx's own
    proxy refuses it (torch.export then captures the model)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if self.node.op != "get_attr":
            raise TypeError("'Proxy' object does not support item assignment")
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


class ModelTracer(fx.Tracer):
    """torch.fx's tracer, recording what ``forward`` does to the model's buffers (see [Note: buffers a forward
    updates] in :mod:`hintpipe.planner.buffer_updates`); the re-trace a plan goes through on every rank uses it
    too.

    [Note: parametrized modules]
    A module with a parametrization (``torch.nn.utils.parametrizations.weight_norm``, ``spectral_norm``,
    ``orthogonal``, or one of the user's ``register_parametrization``) is a class torch makes on the fly, which
    pickle refuses ("Serialization of parametrized modules is only supported through state_dict()"); as a leaf
    of the graph (torch.fx keeps ``torch.nn`` modules whole) it made every plan of the model fail to reach the
    ranks. It is traced through instead: its parametrization is a sub-module of its own, which pickles, and its
    computation (a weight from ``original0`` and ``original1``) is in the stage, as torch.export has it.
    """

    proxy_buffer_attributes = True

    def __init__(self, leaves: set[str] | None = None) -> None:
        # split_point stays a node wherever the model's code calls it.
        super().__init__(autowrap_functions=(split_point,))
        self.leaves = leaves or set()

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if parametrize.is_parametrized(m):  # [Note: parametrized modules]
            return False
        return qualname in self.leaves or super().is_leaf_module(m, qualname)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _BufferProxy(node, self)


def _defaults_left_out(root: nn.Module, example: tuple[Any, ...] | None) -> dict[str, Any]:
    """The parameters of ``root.forward`` that the example leaves out (all with a default, where there is no
    example), with their defaults: what the model runs with when called as the pipeline calls it.

    [Note: arguments left to their defaults]
    torch.fx makes every parameter of ``forward`` an input, a proxy that is never None. A model's optional
    argument (``forward(self, x, mask=None)``) was then captured as given, ``if mask is not None:`` taking the
    branch the model takes with a mask, and planning refused the model (``the model takes 2 inputs, got 1``).
    Traced with the defaults as constants, the graph computes what ``model(x)`` does, and takes the inputs the
    example gives; torch.export, given the same example, does the same.
    """
    signature = inspect.signature(root.forward)
    given = len(example) if example is not None else 0
    out = {}
    for index, parameter in enumerate(signature.parameters.values()):
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        has_default = parameter.default is not inspect.Parameter.empty
        if has_default and (index >= given or example is None):
            out[parameter.name] = parameter.default
    return out


def _drop_specialised_inputs(graph: fx.Graph, root: nn.Module, defaults: dict[str, Any]) -> None:
    """Remove the inputs torch.fx makes of ``defaults`` (traced as constants: ``mask_1``) and the checks it adds on
    them, so that the graph takes only the example's inputs ([Note: arguments left to their defaults])."""
    traced = {name for name in inspect.signature(root.forward).parameters if name not in defaults}
    doomed: set[fx.Node] = set()
    stack = [n for n in graph.nodes if n.op == "placeholder" and str(n.target).lstrip("*") not in traced]
    while stack:
        value = stack.pop()
        if value not in doomed:
            doomed.add(value)
            stack.extend(value.users)
    for node in reversed(list(graph.nodes)):
        if node in doomed:
            graph.erase_node(node)
