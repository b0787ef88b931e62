"""Regions of a captured graph: ``with torch.autocast(...)`` and ``with torch.no_grad()`` inside ``forward`` kept
as the model wrote them.

[Note: autocast regions]
A model may compute part of its forward under an autocast of its own: ``with torch.autocast(device,
enabled=False): ...`` computes in float32 what an autocast around the whole model would compute in bfloat16
(a softmax, a rotary table), and ``with torch.autocast(device, dtype=torch.bfloat16)`` the reverse. Neither
capture kept it: torch.fx ran the ``with`` at trace time and recorded the operations alone, and torch.export's
``wrap_with_autocast`` operator (one node holding the region as a sub-graph) was run, not recorded, by the
re-trace that every plan's graph goes through. So a stage run under ``torch.autocast(device, torch.bfloat16)``
(``--precision bf16``) computed in bfloat16 what the unsplit model computed in float32.

In the captured graph a region is now a pair of markers, an :class:`Enter` (the region's dtype, whether it is
enabled, whether it caches casts; its device follows the module as a :class:`~hintpipe.planner.portable
.FollowingOp`'s does: [Note: every form of a device]) and the :class:`Exit` that takes the enter's value. Both
are sub-modules, which the re-trace keeps as they are; both are left out of ``CapturedGraph.nodes``, so the
planner never places them and a cut may fall anywhere, inside a region too. Each node records the regions it
runs in, outermost first (``node.meta[REGIONS]``: the enters' targets), found again from the markers after
every re-trace. A run of the whole captured graph enters and leaves the regions where the markers stand; a
node profiled on its own runs inside its regions (:func:`entered`).

A built stage has no markers: each run of nodes in the same region is a sub-module that a :class:`Region`
calls inside the region (:mod:`~hintpipe.planner.stagegen`), nested as the regions are, so a stage that starts
or ends inside a region enters it or leaves it itself, a recompute or offload group in a region enters it
(its recomputation too), and an error inside a region leaves it. Where the device has no autocast (``meta``)
a region runs its nodes as they are. A region's device is "where the stage runs", whatever device the model's
code named (a region for another device than the one it was captured on included).

[Note: grad-mode regions]
``with torch.no_grad():`` (or ``torch.set_grad_enabled(False)``, ``@torch.no_grad()`` on a sub-module's forward)
was lost the same way: torch.fx ran it at trace time, and torch.export's ``wrap_with_set_grad_enabled`` was run by
the re-trace. So the stages computed gradients the model does not: a projection a user froze by computing it
under ``no_grad`` (a teacher, a frozen encoder) had its weights trained by the pipeline and not by the unsplit
model. A grad-mode region is now a region as an autocast one is: the same :class:`Enter` (of kind ``grad``: its
``enabled``), :class:`Exit` and :class:`Region`, on every device. torch.fx records ``torch._C._set_grad_enabled``
through the same hook; as grad mode is one switch, a call that sets it back to what it was before the open
region closes that region, and any other change opens one (``torch.enable_grad()`` inside ``torch.no_grad()``
ends the region and starts another after it, as torch.export does). Only a change of mode makes a region:
capture itself runs with gradients on.

What capture cannot keep: code that *asks* whether autocast is on (``torch.is_autocast_enabled()``,
transformers' ``maybe_autocast``, which opens a region only when autocast is already on) is answered once,
at capture, where it is off. A dtype read off a tensor (``x.to(y.dtype)``) stays symbolic in a torch.fx trace,
and follows the autocast in a torch.export capture ([Note: a dtype read off a tensor] in
:mod:`~hintpipe.planner.autocast_dtypes`).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
from torch.fx.experimental.proxy_tensor import PreDispatchTorchFunctionMode

#: The sub-module under which the captured graph keeps its region markers (of both kinds: named for the first).
CONTAINER = "autocast"
#: Where a node keeps the targets of the :class:`Enter` markers of the regions it runs in, outermost first.
REGIONS = "autocast_regions"
#: The kinds of region: ``torch.autocast``, and grad mode (``torch.no_grad()``: [Note: grad-mode regions]).
AUTOCAST, GRAD = "autocast", "grad"


class _Settings(nn.Module):
    """A region's settings: an autocast's (its device from an empty buffer that ``.to(device)`` moves), or a grad
    mode's (``kind`` ``grad``: ``enabled`` alone)."""

    anchor: torch.Tensor

    def __init__(
        self, dtype: torch.dtype | None, enabled: bool, cache_enabled: bool | None, kind: str = AUTOCAST
    ) -> None:
        super().__init__()
        self.dtype, self.enabled, self.cache_enabled, self.kind = dtype, enabled, cache_enabled, kind
        self.register_buffer("anchor", torch.empty(0), persistent=False)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """The region on the module's device: ``torch.autocast``, or nothing where the device has none; a grad
        mode's on every device."""
        if getattr(self, "kind", AUTOCAST) == GRAD:  # (a plan file from before grad regions has no kind)
            return torch.set_grad_enabled(self.enabled)
        device = self.anchor.device.type
        if not torch.amp.is_autocast_available(device):
            return contextlib.nullcontext()
        return torch.autocast(device, dtype=self.dtype, enabled=self.enabled, cache_enabled=self.cache_enabled)

    def extra_repr(self) -> str:
        if getattr(self, "kind", AUTOCAST) == GRAD:
            return f"grad enabled={self.enabled}"
        return f"dtype={self.dtype}, enabled={self.enabled}, cache_enabled={self.cache_enabled}"


class Enter(_Settings):
    """Where a region starts in a captured graph: enters it, returns what :class:`Exit` leaves."""

    def forward(self) -> contextlib.AbstractContextManager[Any]:
        region = self.context()
        region.__enter__()
        return region


class Exit(nn.Module):
    """Where a region ends in a captured graph: leaves the region its :class:`Enter` entered."""

    def forward(self, region: contextlib.AbstractContextManager[Any]) -> None:
        region.__exit__(None, None, None)


class Region(_Settings):
    """A run of a stage's nodes inside an autocast region: ``body`` called inside it."""

    def __init__(self, body: nn.Module, settings: _Settings) -> None:
        super().__init__(settings.dtype, settings.enabled, settings.cache_enabled, getattr(settings, "kind", AUTOCAST))
        self.anchor = torch.empty(0, device=settings.anchor.device)  # where the captured graph is
        self.body = body

    def forward(self, *args: Any) -> Any:
        with self.context():
            return self.body(*args)


def _enter_grad_mode(enabled: bool) -> None:
    """Where a grad-mode region starts in a graph being captured (never run: :func:`keep_regions` makes it an
    :class:`Enter`)."""
    raise AssertionError("a grad-mode region's marker runs only as an Enter")


def _exit_grad_mode(region: Any) -> None:
    """Where a grad-mode region ends in a graph being captured (never run: an :class:`Exit`)."""
    raise AssertionError("a grad-mode region's marker runs only as an Exit")


class _Recorder(PreDispatchTorchFunctionMode):
    """Records ``torch.autocast``'s entering and leaving, and each change of grad mode, into a torch.fx trace, as
    torch.export's pre-dispatch trace does (both report themselves to this kind of mode alone); every other call
    goes on."""

    def __init__(self, tracer: fx.Tracer) -> None:
        self.fx_tracer = tracer
        self.open: list[fx.Node] = []
        self.grad = torch.is_grad_enabled()
        self.grad_open: list[tuple[fx.Node, bool]] = []  # each open grad region and the mode before it

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func is _enter_autocast:
            self.open.append(self.fx_tracer.create_node("call_function", func, tuple(args), {}))
            return self.open[-1]
        if func is _exit_autocast:
            return self.fx_tracer.create_node("call_function", func, (self.open.pop(),), {})
        if func is torch._C._set_grad_enabled:
            func(*args, **(kwargs or {}))
            self._grad_mode(bool(args[0]))
            return None
        return func(*args, **(kwargs or {}))

    def _grad_mode(self, enabled: bool) -> None:
        """A change of grad mode: back to the mode before the open region closes it, any other opens one (see
        [Note: grad-mode regions])."""
        if enabled == self.grad:
            return
        if self.grad_open and enabled == self.grad_open[-1][1]:
            enter, _ = self.grad_open.pop()
            self.fx_tracer.create_node("call_function", _exit_grad_mode, (enter,), {})
        else:
            enter = self.fx_tracer.create_node("call_function", _enter_grad_mode, (enabled,), {})
            self.grad_open.append((enter, self.grad))
        self.grad = enabled


def recording(tracer: fx.Tracer) -> contextlib.AbstractContextManager[Any]:
    """While torch.fx traces with ``tracer``, keep every ``torch.autocast`` and grad-mode region as a pair of
    calls."""
    return _Recorder(tracer)


def keep_regions(module: fx.GraphModule) -> int:
    """Turn, in place, every autocast region of ``module``'s graph into a pair of markers ([Note: autocast
    regions]): torch.export's ``wrap_with_autocast`` nodes inlined, and every enter and exit call (torch.fx's,
    or an inlined one's) a call of an :class:`Enter` or the :class:`Exit`; the number of regions."""
    graph = module.graph
    bodies = []
    while (hop := next((n for n in graph.nodes if _is_wrapped(n)), None)) is not None:
        bodies.append(_inline(module, hop))
    used = {str(n.target) for n in graph.nodes if n.op in ("get_attr", "call_module")}
    for body in bodies:  # outer bodies first: a nested one goes with its outer one
        if not any(t == body or t.startswith(f"{body}.") for t in used):
            module.delete_submodule(body)
    calls = [n for n in graph.nodes if n.op == "call_function" and n.target in _MARKER_CALLS]
    if not calls:
        return 0
    where = next((t.device for t in [*module.parameters(), *module.buffers()]), torch.device("cpu"))
    container = nn.Module()
    container.add_module("exit", Exit())
    module.add_module(CONTAINER, container)
    for node in calls:
        if node.target in (_exit_autocast, _exit_grad_mode):
            _as_call_module(node, f"{CONTAINER}.exit", node.args)
            continue
        if node.target is _enter_grad_mode:
            settings = Enter(None, bool(node.args[0]), None, kind=GRAD)
        else:
            _, dtype, enabled, cache_enabled = node.args  # the device leaves: the region's follows the module
            settings = Enter(dtype, enabled, cache_enabled)
        child = f"enter_{len(container._modules) - 1}"
        container.add_module(child, settings.to(where))  # where the captured model is
        _as_call_module(node, f"{CONTAINER}.{child}", ())
    graph.lint()
    module.recompile()
    return len(container._modules) - 1


def _as_call_module(node: fx.Node, target: str, args: Any) -> None:
    """``node`` replaced by a call of the sub-module ``target``, named as a re-trace names it
    (``autocast_enter_0``), so that the graph's code is the same before a plan travels and after."""
    with node.graph.inserting_before(node):
        call = node.graph.call_module(target, args)
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    node.graph.erase_node(node)


#: The calls a captured graph marks its regions with before they become :class:`Enter` and :class:`Exit`.
_MARKER_CALLS = (_enter_autocast, _exit_autocast, _enter_grad_mode, _exit_grad_mode)


def _is_wrapped(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in (
        torch.ops.higher_order.wrap_with_autocast,
        torch.ops.higher_order.wrap_with_set_grad_enabled,
    )


def _inline(module: fx.GraphModule, hop: fx.Node) -> str:
    """torch.export's ``wrap_with_autocast(device, dtype, enabled, cache, body, *operands)`` or
    ``wrap_with_set_grad_enabled(enabled, body, *operands)`` replaced by ``body``'s nodes between an enter and
    an exit call; the items taken from its result by the values they were; the body's path."""
    if hop.target is torch.ops.higher_order.wrap_with_set_grad_enabled:
        grad_enabled, body_node, *operands = hop.args
        enter_call: tuple[Any, tuple[Any, ...]] = (_enter_grad_mode, (grad_enabled,))
        exit_call: Any = _exit_grad_mode
    else:
        device, dtype, enabled, cache_enabled, body_node, *operands = hop.args
        enter_call, exit_call = (_enter_autocast, (device, dtype, enabled, cache_enabled)), _exit_autocast
    prefix = str(body_node.target)  # type: ignore[union-attr]
    body: fx.GraphModule = module.get_submodule(prefix)  # type: ignore[assignment]
    graph = module.graph
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, operands, strict=True))
    results: Any = ()
    with graph.inserting_before(hop):
        enter = graph.call_function(*enter_call)
        for node in body.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                results = fx.node.map_arg(node.args[0], env.__getitem__)
            elif node.op in ("get_attr", "call_module"):  # the body's own attributes, under its path
                env[node] = graph.create_node(
                    node.op, f"{prefix}.{node.target}", fx.node.map_arg(node.args, env.__getitem__), node.kwargs
                )
                env[node].meta = dict(node.meta)
            else:
                env[node] = graph.node_copy(node, env.__getitem__)
        graph.call_function(exit_call, (enter,))
    for user in list(hop.users):
        if user.op != "call_function" or user.target is not operator.getitem:
            raise ValueError(f"{user.name} takes the region's whole result, not an item of it")
        user.replace_all_uses_with(results[user.args[1]])
        graph.erase_node(user)
    graph.erase_node(hop)
    if not body_node.users:  # type: ignore[union-attr]
        graph.erase_node(body_node)  # type: ignore[arg-type]
    return prefix


def mark_regions(module: fx.GraphModule) -> set[fx.Node]:
    """Record on each node of ``module``'s graph the regions it runs in (``node.meta[REGIONS]``); the markers."""
    markers: set[fx.Node] = set()
    open_: list[fx.Node] = []
    for node in module.graph.nodes:
        if node.op == "call_module" and str(node.target).startswith(f"{CONTAINER}."):
            markers.add(node)
            if str(node.target) == f"{CONTAINER}.exit":
                open_.remove(node.args[0])
            else:
                open_.append(node)
            continue
        if open_:
            node.meta[REGIONS] = tuple(str(n.target) for n in open_)
        else:
            node.meta.pop(REGIONS, None)
    return markers


def regions_of(node: fx.Node) -> tuple[str, ...]:
    """The targets of the :class:`Enter` markers of the regions ``node`` runs in, outermost first."""
    return tuple(node.meta.get(REGIONS, ()))


@contextlib.contextmanager
def entered(root: nn.Module, node: fx.Node) -> Iterator[None]:
    """Inside the regions ``node`` runs in (nothing where it runs in none): how a node runs on its own."""
    with contextlib.ExitStack() as stack:
        for target in regions_of(node):
            settings: _Settings = root.get_submodule(target)  # type: ignore[assignment]
            stack.enter_context(settings.context())
        yield
