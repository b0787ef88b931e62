"""Weight gradients put off from B to W without a second pass through the graph.

[Note: weight gradients put off]
A split backward (``zb-h1``, ``zbv``, ``bfw``) pays only if its two passes cost what one backward does. torch's
``stage_backward_input``/``stage_backward_weight`` run the autograd graph twice, the second time from the
intermediate gradients the first kept, and on small stages the two cost 1.7-1.9x the whole backward
(``benchmarks/vs-torch``: 8.2-8.8 ms against 4.5-5.8 on gpt-mini's last stage), more than the bubble the split
fills. Most of a transformer's weight gradients are its linear layers', and a linear layer's weight gradient
needs nothing but the layer's input and its output's gradient (``dW = dY^T X``, ``db = sum dY``). So a linear
layer that the runtime runs (:func:`deferrable_linear`) computes, in B, only its input's gradient, and leaves
its weight gradient as a closure over ``X`` and ``dY``; W runs the closures. B is one ordinary backward
(every other parameter's gradient is computed in it, as the unsplit model computes it), W a matrix product per
linear layer: together, what one backward costs.

Where it applies: every ``nn.Linear`` of a stage module whose ``forward`` is torch's own (a subclass with its
own ``forward``, such as a LoRA or quantised layer, is left as it is) and every Hugging Face ``Conv1D``
(GPT-2's linear layers, ``addmm`` of a weight stored ``in x out``); in a ``torch.fx.GraphModule`` of a stage
(the planner's generated stages), every ``linear`` call and every ``addmm`` of a weight the module holds; each
when the weight is a plain tensor (not a DTensor: a tensor-parallel stage keeps autograd's own). Everything else
computes its weight gradient in B, which is correct and only moves work from W to B (so does a ``Conv1D`` under
autocast, which keeps autocast's own ``addmm``). The decision is made the same way each time a layer runs (whenever
this rank's deferral is active and gradients are on), so a recomputed forward
(``torch.utils.checkpoint`` in backward) builds the graph its first forward built. Under ``torch.autocast`` the
layer's inputs are cast as autocast casts a linear layer's, and the weight gradient is cast back to the
weight's dtype, as autograd's own cast would.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

#: The deferral of the stage running on this thread, if any.
_ACTIVE: contextvars.ContextVar[WeightDeferral | None] = contextvars.ContextVar("hintpipe_deferral", default=None)
_PLAIN = (torch.Tensor, nn.Parameter)


class WeightDeferral:
    """One rank's put-off weight gradients: while :meth:`active`, its linear layers defer; while :meth:`collecting`,
    a backward leaves their weight gradients in the list given (else computes them at once)."""

    def __init__(self) -> None:
        self.collected: list[Callable[[], None]] | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        token = _ACTIVE.set(self)
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    @contextlib.contextmanager
    def collecting(self, into: list[Callable[[], None]]) -> Iterator[None]:
        """Active, and the weight gradients of the backward run inside put into ``into``."""
        before, self.collected = self.collected, into
        try:
            with self.active():
                yield
        finally:
            self.collected = before


def deferrable_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, whose weight gradient the active :class:`WeightDeferral` puts off (see
    [Note: weight gradients put off])."""
    deferral = _deferring(x, weight, bias)
    if deferral is None:
        return F.linear(x, weight, bias)
    leaves = (weight, bias)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            cast = None if bias is None else bias.to(dtype)
            out: torch.Tensor = _applied(_DeferredLinear, x.to(dtype), weight.to(dtype), cast, leaves, deferral)
            return out
    plain: torch.Tensor = _applied(_DeferredLinear, x, weight, bias, leaves, deferral)
    return plain


def _deferring(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> WeightDeferral | None:
    """The active deferral, where a layer of these tensors defers its weight gradient: gradients on, a weight that
    wants one, and plain tensors (not DTensors); else None. (Spelled out, not a loop: it runs on every linear
    layer's forward.)"""
    deferral = _ACTIVE.get()
    if deferral is None or not torch.is_grad_enabled() or not weight.requires_grad:
        return None
    if type(x) not in _PLAIN or type(weight) not in _PLAIN or (bias is not None and type(bias) not in _PLAIN):
        return None
    return deferral


def _applied(function: type[torch.autograd.Function], *args: Any) -> Any:
    """``function.apply(*args)``, through autograd's own ``apply`` where no functorch transform is active.

    [Note: a deferred layer's forward]
    ``torch.autograd.Function.apply`` is a Python wrapper (it binds ``setup_context``'s arguments and unwraps
    functorch's dead wrappers, looping over the arguments) around autograd's C++ ``apply``. Once per linear layer
    and forward, that wrapper was most of what a split hint's forward cost over the unsplit one: a stage of 16
    deferred layers forwarded in 2.66 ms against 2.30 without deferral (gpt-mini's first stage), 2.46 through
    the C++ ``apply`` directly. The deferred layers define ``forward(ctx, ...)`` (no ``setup_context``), so the
    wrapper's binding has nothing to do; under a functorch transform (``vmap``, ``grad``) the wrapper runs."""
    if torch._C._are_functorch_transforms_active():
        return function.apply(*args)  # type: ignore[no-untyped-call]
    return _AUTOGRAD_APPLY[function](*args)


class _DeferredLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        leaves: tuple[torch.Tensor, torch.Tensor | None],
        deferral: WeightDeferral,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.leaves = leaves
        ctx.deferral = deferral
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        x, weight = ctx.saved_tensors
        dx = dy @ weight if ctx.needs_input_grad[0] else None
        _put_off(ctx.deferral, functools.partial(_weight_gradients, dy, x, ctx.leaves))
        return dx, None, None, None, None


def _put_off(deferral: WeightDeferral, weights: Callable[[], None]) -> None:
    """Leave ``weights`` to W where the deferral collects (the runtime's B), else run it now (a backward outside
    B: nothing to put off to)."""
    collected = deferral.collected
    if collected is None:
        weights()
    else:
        collected.append(weights)


def _weight_gradients(dy: torch.Tensor, x: torch.Tensor, leaves: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    """Accumulate a linear layer's weight and bias gradients from its input ``x`` and output gradient ``dy`` (into
    the gradient already there in place, as autograd accumulates: no second tensor and no second pass)."""
    weight, bias = leaves
    rows = dy.reshape(-1, dy.shape[-1])
    if weight.requires_grad:
        _accumulate_product(weight, rows.t(), x.reshape(-1, x.shape[-1]))
    if bias is not None and bias.requires_grad:
        _accumulate(bias, rows.sum(0))


def _accumulate_product(leaf: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``leaf.grad += a @ b``, in place where the gradient is there in the product's dtype (``addmm_``)."""
    grad = leaf.grad
    if grad is None or grad.dtype != a.dtype:
        _accumulate(leaf, a @ b)
    else:
        grad.addmm_(a, b)


def _accumulate(leaf: torch.Tensor, grad: torch.Tensor) -> None:
    grad = grad.to(leaf.dtype)
    if leaf.grad is None:
        leaf.grad = grad
    else:
        leaf.grad += grad


def deferrable_addmm(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``torch.addmm(bias, x, weight)`` (a linear layer whose weight is stored ``in x out``, as Hugging Face's
    ``Conv1D`` stores GPT-2's), whose weight gradient the active :class:`WeightDeferral` puts off."""
    deferral = _deferring(x, weight, bias)
    if deferral is None or torch.is_autocast_enabled(x.device.type):
        return torch.addmm(bias, x, weight)
    out: torch.Tensor = _applied(_DeferredAddmm, bias, x, weight, deferral)
    return out


class _DeferredAddmm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, deferral: WeightDeferral
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.leaves = (weight, bias)  # the parameters themselves: a saved tensor unpacks as another object
        ctx.deferral = deferral
        return torch.addmm(bias, x, weight)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[None, torch.Tensor | None, None, None]:
        x, weight = ctx.saved_tensors
        dx = dy @ weight.t() if ctx.needs_input_grad[1] else None
        _put_off(ctx.deferral, functools.partial(_stored_transposed, dy, x, ctx.leaves))
        return None, dx, None, None


def _stored_transposed(dy: torch.Tensor, x: torch.Tensor, leaves: tuple[torch.Tensor, torch.Tensor]) -> None:
    """:func:`_weight_gradients` for a weight stored ``in x out``: ``dW = X^T dY``."""
    weight, bias = leaves
    if weight.requires_grad:
        _accumulate_product(weight, x.t(), dy)
    if bias.requires_grad:
        _accumulate(bias, dy.sum(0))


#: Each deferred layer's autograd ``apply`` below :meth:`torch.autograd.Function.apply` (see [Note: a deferred
#: layer's forward]).
_AUTOGRAD_APPLY: dict[type[torch.autograd.Function], Callable[..., Any]] = {
    function: super(torch.autograd.Function, function).apply  # type: ignore[misc]
    for function in (_DeferredLinear, _DeferredAddmm)
}


def _linear_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return deferrable_linear(x, module.weight, module.bias)


def _conv1d_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``Conv1D.forward`` (GPT-2's linear layers) through :func:`deferrable_addmm`."""
    weight, bias = module.weight, module.bias
    assert isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor)
    out = deferrable_addmm(bias, x.reshape(-1, x.shape[-1]), weight)
    return out.view(*x.shape[:-1], out.shape[-1])


def _is_conv1d(module: nn.Module) -> bool:
    """A Hugging Face ``Conv1D`` with its own forward: recognised by its class's name and fields, so that
    transformers need not be imported here."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and type(module).__module__.startswith("transformers")
        and isinstance(weight, torch.Tensor)
        and isinstance(getattr(module, "bias", None), torch.Tensor)
        and getattr(module, "nf", None) == weight.shape[-1]
    )


_LINEARS = {torch.ops.aten.linear.default, F.linear}
_ADDMMS = {torch.ops.aten.addmm.default, torch.addmm}


def defer_linear_weights(module: nn.Module) -> int:
    """Make ``module``'s linear layers defer their weight gradients (see [Note: weight gradients put off]): an
    ``nn.Linear`` with torch's own ``forward`` runs :func:`deferrable_linear`, and a ``torch.fx.GraphModule``'s
    linear calls become calls of it. Returns how many layers or calls now defer. Without an active
    :class:`WeightDeferral` each computes exactly as before; :func:`restore_linear_weights` undoes it."""
    count = 0
    for sub in module.modules():
        if isinstance(sub, nn.Linear) and type(sub).forward is nn.Linear.forward and "forward" not in vars(sub):
            sub.forward = functools.partial(_linear_forward, sub)  # type: ignore[method-assign]
            count += 1
        elif _is_conv1d(sub) and "forward" not in vars(sub):
            sub.forward = functools.partial(_conv1d_forward, sub)
            count += 1
        elif isinstance(sub, fx.GraphModule):
            count += _defer_graph_calls(sub)
    return count


def _defer_graph_calls(module: fx.GraphModule) -> int:
    """Point ``module``'s linear calls at their deferrable forms: ``linear``, and ``addmm`` of a weight the
    module holds (a parameter read by ``get_attr``, with no ``beta``/``alpha``)."""
    calls = 0
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        deferred: Callable[..., Any] | None = None
        if node.target in _LINEARS:
            deferred = deferrable_linear
        elif (
            node.target in _ADDMMS
            and not node.kwargs
            and len(node.args) == 3
            and isinstance(node.args[2], fx.Node)
            and node.args[2].op == "get_attr"
        ):
            deferred = deferrable_addmm
        if deferred is not None:
            node.meta[_DEFERRED_FROM] = node.target
            node.target = deferred
            calls += 1
    if calls:
        module.recompile()
    return calls


#: Where a graph's deferred call keeps the target it had (see :func:`restore_linear_weights`).
_DEFERRED_FROM = "hintpipe_deferred_from"
_PATCHED_FORWARDS = (_linear_forward, _conv1d_forward)


def restore_linear_weights(module: nn.Module) -> int:
    """Undo :func:`defer_linear_weights` on ``module``: each layer's own ``forward`` and each graph's own calls
    again (a pipeline does, as it closes: the user's model is theirs as it was, to save, compile or pickle without
    hintpipe's functions inside). Returns how many layers or calls were restored."""
    count = 0
    for sub in module.modules():
        patched = vars(sub).get("forward")
        if isinstance(patched, functools.partial) and patched.func in _PATCHED_FORWARDS:
            del sub.forward
            count += 1
        elif isinstance(sub, fx.GraphModule):
            calls = 0
            for node in sub.graph.nodes:
                if _DEFERRED_FROM in node.meta:
                    node.target = node.meta.pop(_DEFERRED_FROM)
                    calls += 1
            if calls:
                sub.recompile()
            count += calls
    return count
