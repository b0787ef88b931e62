"""Generated stage modules: a range of graph nodes as an ``nn.Module``.

A stage takes the values crossing its first cut (in the order they were
defined) and returns those crossing its last cut, so stage ``i``'s outputs are
exactly stage ``i + 1``'s inputs; a value that skips a stage (a residual
across a cut) is passed through it. Parameters are referenced, not copied.

Nodes the plan recomputes run inside ``torch.utils.checkpoint`` (their saved
activations are dropped after the forward and rebuilt in backward); nodes it
offloads run under ``saved_tensors_hooks`` that move what autograd saves to
pinned host memory and back, on a stream of their own (:func:`offload`).
Consecutive nodes with the same choice are grouped into one sub-module.

[Note: numbers cross a cut on the host]
A number the graph computes (``CapturedGraph.scalars``: a sequence length from
``sym_size``) leaves a stage as the Python number it is, and the next stage
takes it as one: it is never a tensor on the stage's device. Boxed as a 0-d
device tensor, it was unboxed with ``.item()`` on the far side, which on a GPU
waits for every kernel queued on the stream, once per micro-batch per cut, and
which ``meta`` refuses, so a later stage could not run there at all. The
runtime carries such numbers in the message's header beside the tensors'
shapes (:func:`hintpipe.runtime.transport.wire.encode_meta`); a stage on the
same rank gets them as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils.checkpoint import checkpoint

from hintpipe.device import new_event, new_stream
from hintpipe.planner.buffer_updates import as_at_forward, noting_updates
from hintpipe.planner.capture import CapturedGraph, attribute
from hintpipe.planner.regions import Region, regions_of


def recompute(module: torch.nn.Module, *args: Any) -> Any:
    """Run ``module`` keeping no activations; backward recomputes them from the buffers the forward saw, and
    leaves the buffers as it found them (a batch norm's running statistics updated once per micro-batch, as
    without recompute): see [Note: buffers a forward updates] in :mod:`hintpipe.planner.buffer_updates`."""
    updated: list[tuple[torch.Tensor, torch.Tensor]] = []
    return checkpoint(
        module,
        *args,
        use_reentrant=False,
        context_fn=lambda: (noting_updates(module, updated), as_at_forward(updated)),
    )


def offload(module: torch.nn.Module, *args: Any) -> Any:
    """Run ``module`` with its saved activations kept in host memory until backward.

    On a GPU each saved tensor is copied to pinned host memory on a stream of
    its own, so the copy overlaps the compute that follows, and copied back
    when backward needs it, after the first copy's event. Parameters and
    buffers are not activations: autograd saves them too (a linear layer its
    weight), but they stay on the device for good, and moving them out and
    back would copy the weights every micro-batch (:func:`offload_hooks`). On
    a CPU the host is the device: the tensors stay where they are (but leave
    the count of the device's activations, as they would leave the device).
    """
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    if device.type == "cuda":
        with torch.autograd.graph.saved_tensors_hooks(*host_copies(device, resident(module))):
            return module(*args)

    def keep(t: torch.Tensor) -> torch.Tensor:
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, keep):
        return module(*args)


def resident(module: torch.nn.Module) -> set[int]:
    """The storages of ``module``'s parameters and buffers: what offload leaves where it is."""
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}


_OFFLOAD_STREAMS: dict[torch.device, torch.cuda.Stream] = {}

#: A saved tensor as the pack hook leaves it: the tensor itself (kept), or what ``move_out`` made of it.
_Packed = tuple[bool, Any]


def offload_hooks(
    keep: set[int], move_out: Callable[[torch.Tensor], Any], move_back: Callable[[Any], torch.Tensor]
) -> tuple[Callable[[torch.Tensor], _Packed], Callable[[_Packed], torch.Tensor]]:
    """Saved-tensor hooks that hand each saved tensor to ``move_out`` and what it made to ``move_back`` in
    backward, except tensors whose storage is in ``keep`` (parameters and buffers: :func:`resident`; their
    views too, such as the transposed weight a linear layer saves)."""

    def pack(t: torch.Tensor) -> _Packed:
        if t.untyped_storage().data_ptr() in keep:
            return False, t
        return True, move_out(t)

    def unpack(packed: _Packed) -> torch.Tensor:
        moved, value = packed
        return move_back(value) if moved else value

    return pack, unpack


def host_copies(
    device: torch.device, keep: set[int]
) -> tuple[Callable[[torch.Tensor], _Packed], Callable[[_Packed], torch.Tensor]]:
    """Saved-tensor hooks that move a GPU's saved activations to pinned host memory and back (asynchronously)."""
    stream = _OFFLOAD_STREAMS.get(device)
    if stream is None:
        stream = _OFFLOAD_STREAMS[device] = new_stream(device)

    def move_out(t: torch.Tensor) -> tuple[torch.device, torch.Tensor, Any]:
        if t.device.type != "cuda":  # on the host already
            return t.device, t, None
        host = torch.empty_like(t, device="cpu", pin_memory=True)
        stream.wait_stream(torch.cuda.current_stream(t.device))  # after the compute that made it
        with torch.cuda.stream(stream):
            host.copy_(t, non_blocking=True)
            copied = new_event()
            copied.record(stream)
        t.record_stream(stream)  # the allocator must not reuse its memory before the copy is done
        return t.device, host, copied

    def move_back(value: tuple[torch.device, torch.Tensor, Any]) -> torch.Tensor:
        where, host, copied = value
        if copied is None:
            return host
        torch.cuda.current_stream(where).wait_event(copied)
        return host.to(where, non_blocking=True)

    return offload_hooks(keep, move_out, move_back)


def crossing(graph: CapturedGraph, cut: int) -> list[fx.Node]:
    """The values crossing cut ``cut`` (defined before node ``cut``, used at or after it)."""
    index = graph.index
    before = list(graph.inputs) + graph.nodes[:cut]
    return [n for n in before if any(index.get(u, len(graph.nodes)) >= cut for u in n.users)]


def extract(
    graph: CapturedGraph,
    nodes: Sequence[fx.Node],
    inputs: Sequence[fx.Node],
    outputs: Sequence[fx.Node],
    *,
    groups: dict[fx.Node, str] | None = None,
    output_value: Any = None,
    boundary: bool = False,
    depth: int = 0,
) -> fx.GraphModule:
    """A GraphModule computing ``outputs`` from ``inputs`` with ``nodes``.

    ``groups`` maps nodes to ``"recompute"`` or ``"offload"``; runs of them
    become sub-modules called through :func:`recompute` / :func:`offload`.
    ``output_value`` (the original graph's output argument) replaces the tuple
    of ``outputs`` as what the module returns: the last stage returns what the
    model returned. With ``boundary`` (a pipeline stage), numbers the graph
    computes (``graph.scalars``, e.g. a sequence length) cross as Python numbers
    ([Note: numbers cross a cut on the host]); and a received value no gradient
    flows into in the whole model (``graph.gradient_free``) is detached on the way
    in ([Note: values without a gradient]).

    A run of nodes inside an autocast region (the ``depth``-th of theirs: the regions outside it are entered
    already) is a :class:`~hintpipe.planner.regions.Region` sub-module, which enters it; a recompute or
    offload group enters its nodes' regions itself ([Note: autocast regions]).
    """
    copy = _Copy(graph, inputs, boundary)
    node_list = list(nodes)
    groups = groups or {}
    i = 0
    while i < len(node_list):
        key = _run_key(node_list[i], groups, depth)
        if key is None:
            copy.env[node_list[i]] = copy.new.node_copy(node_list[i], copy.lookup)
            i += 1
            continue
        j = i
        while j < len(node_list) and _run_key(node_list[j], groups, depth) == key:
            j += 1
        copy.call_run(node_list, i, j, key, depth)
        i = j
    if output_value is not None:
        copy.new.output(fx.node.map_arg(output_value, copy.lookup))
    else:
        copy.new.output(tuple(copy.lookup(o) for o in outputs))
    return copy.module(node_list)


class _Copy:
    """A new graph being filled with copies of a captured graph's nodes (see :func:`extract`)."""

    def __init__(self, graph: CapturedGraph, inputs: Sequence[fx.Node], boundary: bool = False) -> None:
        self.graph = graph
        self.new = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}  # original node -> its value in the new graph
        self.owned: dict[str, Any] = {}  # sub-modules of recompute/offload runs
        self.boundary = boundary
        self.position = graph.index
        for value in inputs:
            placeholder = self.new.placeholder(value.name)
            # A number (``graph.scalars``) is taken as it comes: [Note: numbers cross a cut on the host].
            if self.boundary and self.position.get(value, -1) in graph.gradient_free:
                self.env[value] = self.new.call_method("detach", (placeholder,))
            else:
                self.env[value] = placeholder

    def lookup(self, value: fx.Node) -> fx.Node:
        if value not in self.env:
            if value.op != "get_attr":
                raise KeyError(f"{value.name} is not available in this stage")
            self.env[value] = self.new.get_attr(str(value.target))
        return self.env[value]

    def call_run(self, node_list: list[fx.Node], i: int, j: int, key: str, depth: int) -> None:
        """Nodes ``node_list[i:j]`` as one sub-module, called through :func:`recompute` or :func:`offload`, or
        inside the autocast region whose marker ``key`` names."""
        run = node_list[i:j]
        run_set = set(run)
        run_inputs: list[fx.Node] = []
        for n in run:
            for a in n.all_input_nodes:
                if a not in run_set and a.op != "get_attr" and a not in run_inputs:
                    run_inputs.append(a)
        later = set(node_list[j:]) | {self.graph.output}
        run_outputs = [n for n in run if any(u in later or u not in set(node_list) for u in n.users)]
        arguments = [self.lookup(a) for a in run_inputs]
        if key in _ACTIONS:
            name = f"{key}_{len(self.owned)}"
            self.owned[name] = extract(self.graph, run, run_inputs, run_outputs)
            call = self.new.call_function(_ACTIONS[key], (self.new.get_attr(name), *arguments))
        else:
            name = f"autocast_{len(self.owned)}"
            body = extract(self.graph, run, run_inputs, run_outputs, depth=depth + 1)
            self.owned[name] = Region(body, attribute(self.graph.module, key))
            call = self.new.call_module(name, tuple(arguments))
        for k, n in enumerate(run_outputs):
            self.env[n] = self.new.call_function(_item, (call, k))

    def module(self, node_list: list[fx.Node]) -> fx.GraphModule:
        """The new graph as a module holding the parameters and modules its nodes use."""
        root = self.graph.module
        attributes: dict[str, Any] = dict(self.owned)
        for node in self.new.nodes:
            if node.op in ("get_attr", "call_module") and str(node.target) not in attributes:
                attributes[str(node.target)] = attribute(root, str(node.target))
        module = fx.GraphModule(attributes, self.new)
        if self.owned:
            # Register the original modules and parameters under their own names
            # before the recompute/offload groups that also hold them, so that
            # parameter names (checkpoints, gradient checks) are the model's.
            targets = [str(n.target) for n in node_list if n.op == "call_module"]
            targets += [str(a.target) for n in node_list for a in n.all_input_nodes if a.op == "get_attr"]
            held = {name: module._modules.pop(name) for name in self.owned}
            for target in dict.fromkeys(targets):
                _place(module, target, attribute(root, target))
            module._modules.update(held)
        return module


def _place(module: torch.nn.Module, target: str, value: Any) -> None:
    """Set ``module.<target>`` (dotted), creating empty parent modules as needed."""
    *parents, name = target.split(".")
    for part in parents:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    if isinstance(value, torch.nn.Module):
        module.add_module(name, value)
    elif isinstance(value, torch.nn.Parameter):
        module.register_parameter(name, value)
    elif isinstance(value, torch.Tensor):
        module.register_buffer(name, value)  # a buffer, so that it follows .to(device) as the model's did
    else:
        setattr(module, name, value)


#: How a recompute or an offload group's sub-module is called.
_ACTIONS: dict[str, Callable[..., Any]] = {"recompute": recompute, "offload": offload}


def _run_key(node: fx.Node, groups: dict[fx.Node, str], depth: int) -> str | None:
    """What ``node`` runs in at this level of a stage: its recompute or offload group, else its ``depth``-th
    autocast region (its marker's target), else None (the stage's own code)."""
    action = groups.get(node)
    if action is not None:
        return action
    regions = regions_of(node)
    return regions[depth] if len(regions) > depth else None


def _item(values: Any, k: int) -> Any:
    return values[k]
