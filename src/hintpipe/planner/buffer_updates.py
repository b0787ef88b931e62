"""Buffers a model's forward updates, kept as the unsplit model keeps them.

[Note: buffers a forward updates]
A forward may write its module's buffers: a batch norm's running statistics and count, an exponential
average, a counter of calls. Planned stages must write them as the unsplit model does, once per micro-batch's
forward, in the one copy of the buffer that the model's state (a checkpoint, an export, an evaluation) reads:

- **Recorded.** torch.fx's tracer gives a buffer as the tensor it is, so an update made of the buffer and
  constants (``self.seen.add_(1)``, ``self.ema.mul_(0.9)``) ran once while tracing and was not in the graph;
  the re-trace every plan goes through on its way to the ranks did the same to torch.export's graph.
  hintpipe's tracer records buffers as it does parameters, in the trace and the re-trace
  (:class:`~hintpipe.planner.capture.capture`'s tracer).
- **In one stage.** Each rank holds its own copy of a buffer its stages read. A buffer written in one stage and
  read or written in another would leave the two copies apart, and a written buffer sent across a cut (the
  result of ``self.ema.mul_(0.9)``, which *is* the buffer, feeding ``.add_(x)``) would be written on the far
  side into the received copy. So every node that reads or writes a buffer some node writes falls in one
  stage: no cut inside its span (:func:`updated_buffer_spans`).
- **Not spent by planning.** Tracing, propagating example values and profiling run the captured graph, many
  times; afterwards its buffers are set back to the model's (:func:`keep_model_buffers`), so a stage starts
  from the user's values.
- **Not applied twice.** A recomputed group runs its forward again in backward. The group's buffers hold
  what its forward saw during the recompute and what they held before it afterwards (:func:`noting_updates`,
  :func:`as_at_forward`, the context of ``torch.utils.checkpoint``), so the recompute computes what the forward
  did and writes nothing. A micro-batch in flight keeps a copy of the buffers its recomputed groups write
  until its backward.

Each stage's forwards run in the order the hint gives them; under an order of the micro-batches other than
theirs (``microbatch_order``), an average that depends on order differs from the unsplit model's run in order.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from hintpipe.planner.inplace import in_place_target

__all__ = [
    "as_at_forward",
    "buffers_kept",
    "keep_model_buffers",
    "noting_updates",
    "schema_written",
    "updated_buffer_spans",
    "written_arguments",
    "written_parameters",
]

#: Python's operators that write their first argument (``buffer[i] = x``, ``buffer += x`` as fx records them).
_WRITING_OPERATORS = frozenset({operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv})


def keep_model_buffers(module: nn.Module, model: nn.Module) -> None:
    """Set the buffers of ``module`` (a capture of ``model``) back to ``model``'s, by name: what running the
    capture (its trace, its profile) wrote into them is not the model's state."""
    theirs = dict(model.named_buffers())
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            own = theirs.get(name)
            if own is not None and own.shape == buffer.shape and own.dtype == buffer.dtype:
                buffer.copy_(own)


@contextlib.contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Around runs of ``model`` that are not training (a probe of its output, timing its stages): its buffers as
    they were afterwards, so that no such run counts a batch in the model's state."""
    kept = [(buffer, buffer.clone()) for buffer in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in kept:
                buffer.copy_(value)


def updated_buffer_spans(module: fx.GraphModule, nodes: Sequence[fx.Node]) -> list[tuple[int, int]]:
    """Per buffer of ``module`` that some node writes, the first and last position in ``nodes`` of a node that
    reads or writes it (through the buffer or what a call that wrote it returned): the span a cut must not fall
    inside."""
    position = {node: i for i, node in enumerate(nodes)}
    buffers = {name for name, _ in module.named_buffers()}
    spans = []
    for attribute in module.graph.nodes:
        if attribute.op != "get_attr" or attribute.target not in buffers:
            continue
        same, written = {attribute}, False
        for node in module.graph.nodes:  # topological: what an in-place or out= call returns is the buffer again
            if any(value in same for value in written_arguments(module, node)):
                same.add(node)
                written = True
        if not written:
            continue
        touching = {position[user] for value in same for user in value.users if user in position}
        touching |= {position[value] for value in same if value in position}
        if touching:
            spans.append((min(touching), max(touching)))
    return spans


def written_parameters(module: fx.GraphModule) -> list[str]:
    """The parameters of ``module`` that some node of its graph writes in place (a forward that rescales its own
    weights under ``torch.no_grad()``): what a pipeline cannot run as the unsplit model does, since a stage runs
    several micro-batches' forwards before their backwards, and a backward that saved the weight refuses it."""
    parameters = {name for name, _ in module.named_parameters()}
    attributes = {node: str(node.target) for node in module.graph.nodes if node.op == "get_attr"}
    written = {
        attributes[value]
        for node in module.graph.nodes
        for value in written_arguments(module, node)
        if value in attributes and attributes[value] in parameters
    }
    return sorted(written)


def written_arguments(module: fx.GraphModule, node: fx.Node) -> list[Any]:
    """The arguments ``node`` writes into: an in-place method's tensor (``add_``), an operator's arguments its
    schema marks written (``aten.add_.Tensor``'s first, ``aten.div.out``'s ``out``), Python's ``[] =`` and
    ``+=``'s first, and what torch.fx's other in-place calls write (``F.relu(x, inplace=True)``, ``torch.relu_``,
    an ``nn.ReLU(inplace=True)``: :func:`~hintpipe.planner.inplace.in_place_target`)."""
    written_in_place = in_place_target(module, node)
    if written_in_place is not None:
        return [written_in_place]
    if node.op == "call_method":
        name = str(node.target)
        return [node.args[0]] if node.args and name.endswith("_") and not name.endswith("__") else []
    if node.op != "call_function":
        return []
    if node.target in _WRITING_OPERATORS:
        return [node.args[0]] if node.args else []
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return []
    return schema_written(target, node.args, node.kwargs)


def schema_written(operator: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """The arguments of a call of ``operator`` that its schema marks written (``aten.add_.Tensor``'s first,
    ``aten.div.out``'s ``out``): in a graph, the nodes given; as it runs, the values."""
    written = []
    for index, argument in enumerate(operator._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if index < len(args):
            written.append(args[index])
        elif argument.name in kwargs:
            written.append(kwargs[argument.name])
    return written


@contextlib.contextmanager
def noting_updates(module: nn.Module, updated: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """Around a forward: note in ``updated`` each buffer of ``module`` the forward writes, with its value before.

    Which buffers those are is found by value on the module's first forward (a batch norm writes its running
    statistics without moving their version) and kept: comparing on every micro-batch would wait for the device
    each time, and copying every buffer would hold a large constant one (a mask of positions) once per
    micro-batch in flight."""
    written = _WRITTEN.get(module)
    if written is None:
        before = [(buffer, buffer.clone()) for buffer in module.buffers()]
        yield
        changed = [(buffer, value) for buffer, value in before if not torch.equal(buffer, value)]
        _WRITTEN[module] = [buffer for buffer, _ in changed]
        updated.extend(changed)
        return
    updated.extend((buffer, buffer.clone()) for buffer in written)
    yield


#: Per recomputed group, the buffers its forward writes (found on its first forward: :func:`noting_updates`).
_WRITTEN: weakref.WeakKeyDictionary[nn.Module, list[torch.Tensor]] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def as_at_forward(updated: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """Around a recompute: the buffers hold what the forward saw, and afterwards what they held before the
    recompute. Written through ``.data``, which moves no version: the recomputed graph saves
    these very tensors (a batch norm its running statistics) and would refuse a write it could see."""
    now = [(buffer, buffer.clone()) for buffer, _ in updated]
    for buffer, seen in updated:
        buffer.data.copy_(seen)
    try:
        yield
    finally:  # also when checkpoint stops the recompute early, by raising, once it has what backward needs
        for buffer, value in now:
            buffer.data.copy_(value)
