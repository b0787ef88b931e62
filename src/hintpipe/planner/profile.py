"""Per-node profiles: time, saved-activation bytes, parameter and output bytes.

Each compute node of a captured graph runs on its own, on detached copies of
the values the example input produces there: its forward is timed, its
backward (gradient of ones into its inputs and parameters) is timed on a clock
that waits for the device's work (:func:`hintpipe.device.clock_for`: a GPU's
calls return before their kernels ran), and the tensors autograd saves for
that backward are counted through
``torch.autograd.graph.saved_tensors_hooks``: exact bytes, each storage once,
parameters excluded (they are not activations). Each node runs once to warm
up and ``repeats`` times more; the fastest run is kept (see [Note: the fastest
run]). Profiles are cached on disk by a signature of the graph, the parameter
shapes, the input shapes and the device.

[Note: the fastest run]
Noise only adds to a measured time: a run that the scheduler paused, or that
another process's work slowed, took longer than the node costs, never less.
So the minimum over every run, the warm-up's included, is kept, not the
median: one clean run of a node is enough. On a CPU shared with other work
that is seldom enough with the wall clock (every run may be paused), which
is why a CPU computing in one thread is timed by its CPU time (see [Note: a
CPU's clock] in :mod:`hintpipe.device`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from hintpipe.device import Clock, clock_for
from hintpipe.planner.buffer_updates import written_arguments
from hintpipe.planner.capture import CapturedGraph, attribute
from hintpipe.planner.graph_timing import ClockMarks, graph_times, leaf, marks_for, run_seconds
from hintpipe.planner.module_paths import module_path
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.regions import entered
from hintpipe.tensor_bytes import count_saved, nbytes, parameter_storages, storage_nbytes, tensors_in

__all__ = ["NodeProfile", "profile", "run_node", "signature"]  # NodeProfile lives in node_profile (no torch)


def _detach(value: Any) -> Any:
    """``value`` as a leaf that requires grad where ``value`` does: a node runs on its inputs as they are in a
    run of the whole graph. A floating value no gradient flows through (an expert's token count from
    ``histc``) stays without: an operator with an integer result (``cumsum(..., dtype=int32)``) refuses an
    input that requires grad."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if isinstance(value, tuple):
        return tuple(_detach(v) for v in value)
    if isinstance(value, list):
        return [_detach(v) for v in value]
    return value


def _written_copy(value: Any) -> Any:
    """An input that a node writes in place, as the node meets it in the whole graph: a value computed from a
    leaf, not the leaf.

    [Note: a node that writes its input, alone]
    Each node is profiled alone, on its inputs made leaves (:func:`_detach`). A node that writes an input in
    place (Qwen3-Next's gated delta rule fills a matrix row by row: ``attn[..., i, :i] = ...``, an ``index_put_``)
    is refused by autograd on a leaf that requires grad (``a leaf Variable that requires grad is being used in an
    in-place operation``), where in the graph it writes an intermediate value. So that input is given to it
    as a copy made from the leaf, before its clock starts."""
    if isinstance(value, torch.Tensor) and value.requires_grad and value.is_leaf:
        return value.clone()
    return value


def run_node(root: fx.GraphModule, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    """Evaluate one node given the values of its inputs in ``env``, inside the autocast regions it runs in
    in the model ([Note: autocast regions] in :mod:`~hintpipe.planner.regions`)."""
    with entered(root, node):
        return _run(root, node, env)


def _run(root: fx.GraphModule, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
    if node.op == "call_module":
        return root.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "get_attr":
        return attribute(root, str(node.target))
    raise ValueError(f"cannot run node {node.name} ({node.op})")


def signature(graph: CapturedGraph, inputs: Sequence[Any]) -> str:
    """A key for the profile cache: the graph's code, parameter and input shapes, and the device."""
    parts = [graph.module.code, str(_device_of(graph, inputs))]
    parts += [f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in graph.module.named_parameters()]
    parts += [f"{tuple(t.shape)}:{t.dtype}" for t in tensors_in(list(inputs))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def profile(
    graph: CapturedGraph,
    inputs: Sequence[Any],
    *,
    repeats: int = 5,
    cache_dir: str | Path | None = None,
    clock: Clock | None = None,
    whole_graph: bool | None = None,
) -> list[NodeProfile]:
    """Profile every compute node of ``graph`` on ``inputs`` (one micro-batch).

    Args:
        graph: the captured model.
        inputs: example inputs, one per placeholder.
        repeats: timed runs per node after one warm-up; the fastest of all is kept ([Note: the fastest run]).
        cache_dir: where to keep profiles (by signature); ``None``: no cache.
        clock: what times the nodes and the whole graph's run that scales them; default: the one of the model's
            device (:func:`hintpipe.device.clock_for`).
        whole_graph: time the nodes in runs of the whole graph instead, on the device's own clock ([Note: a
            GPU's node times] in :mod:`~hintpipe.planner.graph_timing`); default: on a GPU. Memory is counted
            node by node either way.
    """
    if len(inputs) != len(graph.inputs):
        raise ValueError(f"the model takes {len(graph.inputs)} inputs, got {len(inputs)}")
    device = _device_of(graph, inputs)
    whole = device.type == "cuda" and clock is None if whole_graph is None else whole_graph
    key = f"{signature(graph, inputs)}-{repeats}{'-graph' if whole else ''}"
    cache = None if cache_dir is None else Path(cache_dir) / f"{key}.json"
    cached = _cached(cache)
    if cached is not None:
        return cached
    root = graph.module
    params = parameter_storages(root)
    env: dict[fx.Node, Any] = {node: leaf(value) for node, value in zip(graph.inputs, inputs, strict=True)}
    for node, value in env.items():
        node.meta["example_bytes"] = nbytes(value)
    for node in root.graph.nodes:
        if node.op == "get_attr":
            env[node] = run_node(root, node, env)
    # Each storage's first owner: an output living in an earlier value's storage is a view of it.
    owner = {t.untyped_storage().data_ptr(): n.name for n, v in env.items() for t in tensors_in(v)}
    timing = clock if clock is not None else clock_for(device)
    profiles = [
        _profile_node(root, node, env, owner, params, repeats, i in graph.scalars, timing)
        for i, node in enumerate(graph.nodes)
    ]
    marks = marks_for(device) if clock is None else ClockMarks(clock)
    if whole:
        times = graph_times(graph, inputs, run_node, repeats=repeats, marks=marks)
        profiles = [
            dataclasses.replace(p, forward_s=f, backward_s=b) for p, (f, b) in zip(profiles, times, strict=True)
        ]
    profiles = _to_scale(profiles, run_seconds(graph, inputs, repeats=repeats, marks=marks))
    if cache is not None:
        _keep(cache, profiles)
    return profiles


def _cached(cache: Path | None) -> list[NodeProfile] | None:
    """The profiles kept at ``cache``; None when there are none, or what is there is not whole (measured again)."""
    if cache is None or not cache.is_file():
        return None
    try:
        return [NodeProfile.from_json(row) for row in json.loads(cache.read_text())]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _keep(cache: Path, profiles: Sequence[NodeProfile]) -> None:
    """Keep ``profiles`` at ``cache``, whole or not at all: written under a name of this process's own and renamed
    into place, so that two processes measuring one graph at once (two runs starting) never interleave."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(json.dumps([dataclasses.asdict(p) for p in profiles]))
        tmp.replace(cache)
    finally:
        tmp.unlink(missing_ok=True)


def _to_scale(profiles: list[NodeProfile], whole_s: float) -> list[NodeProfile]:
    """``profiles`` with every time scaled by one factor, so that they add up to the whole graph's run.

    [Note: the profile's scale]
    Timing a node costs something of its own, a node alone or between recorded marks: on a 2-core CPU the
    nodes of a Hugging Face GPT-2 added up to 1.06-1.20x what its built stages took, on a GPU several
    times ([Note: a GPU's node times]). The cost is much the same for every node, so it moves the
    balance of a cut little, but every predicted stage time by that much. One run of the whole graph, as a
    stage runs (:func:`~hintpipe.planner.graph_timing.run_seconds`), sets the scale; the nodes' shares of it
    stay as measured, so the cuts are those of the unscaled profile.
    """
    total = sum(p.forward_s + p.backward_s for p in profiles)
    if not (total > 0 and 0 < whole_s < float("inf")):
        return profiles  # nothing measurable (nodes that sleep, on a thread's clock)
    factor = whole_s / total
    return [dataclasses.replace(p, forward_s=p.forward_s * factor, backward_s=p.backward_s * factor) for p in profiles]


def _profile_node(
    root: fx.GraphModule,
    node: fx.Node,
    env: dict[fx.Node, Any],
    owner: dict[int, str],
    params: set[int],
    repeats: int,
    scalar: bool,
    clock: Clock,
) -> NodeProfile:
    """Time ``node`` and count what it saves; its output goes into ``env`` and its storages into ``owner``.
    A number the graph computes (``scalar``) may cross a cut: it counts as a tensor output."""
    forward, backward = [], []
    written = {a for a in written_arguments(root, node) if isinstance(a, fx.Node)}
    for _ in range(repeats + 1):
        local = {a: _detach(env[a]) for a in node.all_input_nodes}
        for a in written:  # [Note: a node that writes its input, alone]
            local[a] = _written_copy(local[a])
        with count_saved(params) as counted:
            start = clock.now()
            out = run_node(root, node, local)
            forward.append(clock.now() - start)
        # A view made under the model's no_grad of a value that requires grad says it requires grad, and has no
        # graph to run backward through ([Note: grad-mode regions] in hintpipe.planner.regions).
        grads = [t for t in tensors_in(out) if t.grad_fn is not None]
        start = clock.now()
        if grads:
            torch.autograd.backward(grads, [torch.ones_like(t) for t in grads])
        backward.append(clock.now() - start)
    # Which saved storages are this node's inputs, its output, or its own temporaries.
    input_of = {t.untyped_storage().data_ptr(): a.name for a, v in local.items() for t in tensors_in(v)}
    outputs = {t.untyped_storage().data_ptr() for t in tensors_in(out)}
    internal = sum(size for k, size in counted.sizes.items() if k not in input_of and k not in outputs)
    env[node] = _detach(out) if tensors_in(out) else out  # kept: no storage of an output is reused
    storages = [t.untyped_storage().data_ptr() for t in tensors_in(out)]
    alias = next((owner[k] for k in storages if k in owner), "")
    for k in storages:
        owner.setdefault(k, node.name)
    return NodeProfile(
        name=node.name,
        forward_s=min(forward),  # [Note: the fastest run]
        backward_s=min(backward),
        saved_bytes=counted.total,
        param_bytes=_param_bytes(root, node, env),
        output_bytes=nbytes(out),
        storage_bytes=storage_nbytes(out),
        alias_of=alias,
        # What may cross a cut: a tensor, or a number (in the message's header). A tuple of tensors (a split's result)
        # may not: stages send flat tuples of tensors, so cuts fall after its items are taken out.
        tensor_output=isinstance(out, torch.Tensor) or scalar,
        internal_bytes=internal,
        saves_output=any(k in outputs for k in counted.sizes),
        saved_inputs=tuple(sorted({input_of[k] for k in counted.sizes if k in input_of})),
        module=module_path(node),
    )


def _device_of(graph: CapturedGraph, inputs: Sequence[Any]) -> torch.device:
    """Where the model runs: its parameters' device, else its first input's (a CPU if it has neither)."""
    first = next(iter(graph.module.parameters()), None)
    if first is not None:
        return first.device
    tensors = tensors_in(list(inputs))
    return tensors[0].device if tensors else torch.device("cpu")


def _param_bytes(root: fx.GraphModule, node: fx.Node, env: dict[fx.Node, Any]) -> int:
    """The parameter bytes ``node`` uses: its module's, and those it reads directly (``get_attr``)."""
    total = 0
    if node.op == "call_module":
        total = sum(p.numel() * p.element_size() for p in root.get_submodule(str(node.target)).parameters())
    total += sum(
        env[a].numel() * env[a].element_size()
        for a in node.all_input_nodes
        if a.op == "get_attr" and isinstance(env[a], torch.nn.Parameter)
    )
    return int(total)
