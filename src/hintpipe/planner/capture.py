"""Capture a model as a graph of operators (torch.fx), on a deep copy.

The planner cuts the graph between nodes. A cut is allowed where every value
crossing it is a tensor (shapes and other Python values stay inside a stage)
and, when the model marks split points with :func:`split_point`, only right
after one. Models that torch.fx cannot trace can name their top-level
submodules instead (``modules=["embed", "blocks.0", ...]``): they are then
treated as a sequence of opaque nodes, each fed the previous one's output.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from hintpipe.planner.buffer_updates import keep_model_buffers, updated_buffer_spans, written_parameters
from hintpipe.planner.capture_error import CaptureError, split_point
from hintpipe.planner.example_values import value_kinds
from hintpipe.planner.export_trace import FIXED_DIMENSIONS, exported
from hintpipe.planner.fixed_shapes import FixedShapeWarning, fixed_said
from hintpipe.planner.fx_trace import fx_traced
from hintpipe.planner.mode_check import warn_if_eval_differs
from hintpipe.planner.node_profile import NodeProfile
from hintpipe.planner.op_libraries import OpLibraries, op_libraries
from hintpipe.planner.regions import mark_regions
from hintpipe.planner.tables import ValueUse

__all__ = [
    "CaptureError",
    "CaptureSpec",
    "CapturedGraph",
    "ParameterWriteWarning",
    "allowed_cuts",
    "attribute",
    "capture",
    "split_point",
    "value_uses",
]


@dataclasses.dataclass
class CapturedGraph:
    """A traced copy of the model.

    Attributes:
        module: the GraphModule (owns a deep copy of the parameters).
        nodes: the compute nodes in topological order (no placeholders,
            ``get_attr`` or ``output``): the units the planner places.
        inputs: the placeholder nodes, in order.
        output: the output node.
        marked: whether the model used :func:`split_point`.
        aliases: per parameter name in ``module``, every name the model has for
            that tensor (tracing keeps one name per shared module or tensor).
        scalars: positions in ``nodes`` of the nodes whose value is a Python
            number (a sequence length in an exported graph): it crosses a cut
            as that number, on the host ([Note: numbers cross a cut on the host] in
            :mod:`~hintpipe.planner.stagegen`). Positions, not names: a pickled graph is re-traced
            on the way in, which keeps the order of the nodes but not their names.
        gradient_free: positions in ``nodes`` of the nodes whose value is a floating-point tensor that no
            gradient flows into, with every parameter and input trainable (an expert's token count from
            ``histc``, rotary ``cos``/``sin``): a stage that receives one detaches it, as the unsplit model
            has it (see [Note: values without a gradient]). Found on the example, for a graph torch.export
            captured (empty for one torch.fx traced).
    """

    module: fx.GraphModule
    nodes: list[fx.Node]
    inputs: list[fx.Node]
    output: fx.Node
    marked: bool
    aliases: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    scalars: set[int] = dataclasses.field(default_factory=set)
    gradient_free: set[int] = dataclasses.field(default_factory=set)
    #: The model's own state-dict keys, in its order (a tied tensor under each of its names; buffers the
    #: model does not keep left out, which the captured module may hold as ordinary ones).
    state_keys: tuple[str, ...] = ()
    #: The input dimensions torch.export fixed though they were to vary, as (input, dimension, size): the
    #: graph runs inputs of those sizes alone (see [Note: dimensions the capture fixes]).
    fixed: tuple[tuple[str, int, int], ...] = ()
    #: Whether the graph computes what the model does under a bfloat16 autocast too: False for a graph
    #: torch.export captured for float32 alone (``capture(..., autocast=False)``, see [Note: a dtype read off a
    #: tensor] in :mod:`hintpipe.planner.autocast_dtypes`), whose stages refuse to run under one.
    follows_autocast: bool = True

    @property
    def index(self) -> dict[fx.Node, int]:
        return {n: i for i, n in enumerate(self.nodes)}

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Nodes do not pickle; the GraphModule does (it re-traces its own code,
        # which yields the same nodes in the same order), so rebuild from it.
        # Parameters travel on the host: a plan made on a GPU unpickles on a rank without one, and each rank
        # moves its stages to its own device. The modules defining its custom operators travel ahead of it
        # ([Note: custom operators in a travelling graph]).
        sizes = [n.meta.get("example_bytes", 0) for n in self.inputs]
        module = _on_host(self.module)
        state = (
            sizes,
            self.aliases,
            self.scalars,
            self.state_keys,
            self.gradient_free,
            self.fixed,
            self.follows_autocast,
        )
        return (_captured_with_sizes, (op_libraries(module), module, *state))


@dataclasses.dataclass(frozen=True)
class CaptureSpec:
    """How a graph was captured, as plain data: enough to capture the same model again, without its inputs.

    A plan file keeps this instead of the captured graph's code (which loading would have to run): loading
    captures the caller's model the same way and checks that the graph is the one that was planned.

    Attributes:
        modules: the submodules run in sequence (``modules=``), or None.
        inputs: each positional input's shape and dtype (an example of zeros is enough to capture).
        kwargs: the keyword inputs that are not tensors (``use_cache=False``), as given.
        tensor_kwargs: the tensor keyword inputs' names, shapes and dtypes, in order.
        autocast: whether the graph was made to follow an autocast (``capture``'s ``autocast``).
    """

    modules: tuple[str, ...] | None = None
    inputs: tuple[tuple[tuple[int, ...], str], ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    tensor_kwargs: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    autocast: bool = True

    @classmethod
    def of(
        cls,
        example: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        modules: Sequence[str] | None,
        *,
        autocast: bool = True,
    ) -> CaptureSpec:
        kwargs = kwargs or {}
        plain = tuple((k, v) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))
        for key, value in plain:
            if not isinstance(value, (bool, int, float, str, type(None))):
                raise CaptureError(f"keyword input {key}={value!r}: only tensors, numbers, strings or None")
        return cls(
            modules=None if modules is None else tuple(modules),
            inputs=tuple((tuple(x.shape), _dtype_name(x)) for x in example if isinstance(x, torch.Tensor)),
            kwargs=plain,
            tensor_kwargs=tuple(
                (k, tuple(v.shape), _dtype_name(v)) for k, v in kwargs.items() if isinstance(v, torch.Tensor)
            ),
            autocast=autocast,
        )

    def recapture(self, model: nn.Module) -> CapturedGraph:
        """``model`` captured as this spec says, on zeros of the recorded shapes on the model's device."""
        example, kwargs = self.zeros(model)
        graph = capture(
            model, modules=self.modules, example=example or None, kwargs=kwargs or None, autocast=self.autocast
        )
        inputs = (*example, *(v for v in kwargs.values() if isinstance(v, torch.Tensor)))
        for node, value in zip(graph.inputs, inputs, strict=False):
            node.meta["example_bytes"] = value.numel() * value.element_size()
        return graph

    def zeros(self, model: nn.Module) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
        """An example of this spec: zeros of the recorded shapes on ``model``'s device (positional inputs, and the
        keyword inputs with the tensors among them)."""
        device = next((t.device for t in [*model.parameters(), *model.buffers()]), torch.device("cpu"))
        example = tuple(torch.zeros(shape, dtype=_dtype(name), device=device) for shape, name in self.inputs)
        kwargs: dict[str, Any] = dict(self.kwargs)
        kwargs |= {k: torch.zeros(shape, dtype=_dtype(name), device=device) for k, shape, name in self.tensor_kwargs}
        return example, kwargs


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CaptureError(f"unknown dtype {name!r}")
    return dtype


def capture(
    model: nn.Module,
    *,
    modules: Sequence[str] | None = None,
    example: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    autocast: bool = True,
) -> CapturedGraph:
    """Capture a deep copy of ``model`` as a graph (the user's model is never touched).

    torch.fx tracing first; where it fails (Hugging Face models, for one) and
    an ``example`` is given, torch.export (non-strict, every input dimension
    free to vary, so micro-batches of other lengths run the same graph); a
    model neither can capture may name its submodules to run in sequence.

    Args:
        model: the model.
        modules: for untraceable models, the names of submodules to run in
            sequence as the whole model (each an opaque node).
        example: example positional inputs (one micro-batch), for torch.export.
        kwargs: keyword inputs for the capture (``use_cache=False``); tensors
            among them become inputs after the positional ones, in this order.
        autocast: whether the graph must compute what the model does under a bfloat16 autocast too
            (``precision="bf16"``): torch.export then captures the model twice ([Note: a dtype read off a
            tensor] in :mod:`hintpipe.planner.autocast_dtypes`). False: once, for float32 training alone
            (its stages refuse an autocast); torch.fx and ``modules`` follow one either way.

    Raises:
        CaptureError: naming what could not be captured and the fallback.
    """
    # Captured with gradients on, as a pipeline trains, whatever the caller's mode (a plan made under
    # ``torch.no_grad()``): the model's own grad-mode regions are changes from that ([Note: grad-mode regions]).
    with torch.enable_grad():
        captured = _capture(model, modules, example, kwargs, autocast)
    keep_model_buffers(captured.module, model)
    _warn_if_parameters_written(model, captured.module)
    if modules is None and example is not None:  # [Note: a branch on self.training]
        warn_if_eval_differs(model, captured.module, example, kwargs or {})
    return captured


class ParameterWriteWarning(UserWarning):
    """A model's forward writes its own parameters in place while training (see
    :func:`~hintpipe.planner.buffer_updates.written_parameters`)."""


def _warn_if_parameters_written(model: nn.Module, module: fx.GraphModule) -> None:
    written = written_parameters(module)
    if written:
        warnings.warn(
            ParameterWriteWarning(
                f"{type(model).__name__}'s forward writes its parameters in place while training ("
                f"{', '.join(written[:3])}{', ...' if len(written) > 3 else ''}): a stage runs several micro-batches' "
                "forwards before their backwards, and a backward that saved such a parameter fails (modified by an "
                "inplace operation); change them outside forward, between steps"
            ),
            stacklevel=3,
        )


def _capture(
    model: nn.Module,
    modules: Sequence[str] | None,
    example: tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    autocast: bool,
) -> CapturedGraph:
    root = copy.deepcopy(model)
    # Captured in train mode whatever the model's mode: that is what a pipeline trains, and the flags the
    # capture records follow each stage's own mode afterwards ([Note: operators that follow their module]).
    root.train()
    keys = tuple(root.state_dict())
    if modules is not None:
        sequence = _sequence_of(root, list(modules))
        sequence.state_keys = keys
        return sequence
    traced_error: Exception | None = None
    if not kwargs:
        try:
            module = fx_traced(root, example)
            traced = _with_aliases(_captured(module), root)
            traced.state_keys = keys
            return traced
        except Exception as exc:  # torch.fx raises several types for untraceable code
            traced_error = exc
    if example is None:
        raise CaptureError(
            f"torch.fx cannot trace {type(model).__name__}: {traced_error}. Fix: pass an example input so that "
            "torch.export can capture it, make forward traceable (no data-dependent control flow), or pass "
            "modules=[...] naming the submodules to run in sequence"
        )
    exported_module = exported(root, example, kwargs or {}, autocast=autocast)
    captured = _with_aliases(_captured(exported_module), root)
    captured.follows_autocast = autocast
    captured.fixed = exported_module.meta.get(FIXED_DIMENSIONS, ())
    if captured.fixed:
        warnings.warn(
            FixedShapeWarning(
                f"torch.export fixed {type(model).__name__}'s {fixed_said(captured.fixed)}: its stages take inputs of "
                "those sizes alone; give an example of the sizes it will train on"
            ),
            stacklevel=3,
        )
    inputs = (*example, *(v for v in (kwargs or {}).values() if isinstance(v, torch.Tensor)))
    captured.scalars, captured.gradient_free = value_kinds(captured.module, captured.nodes, inputs)
    captured.state_keys = keys
    return captured


def _with_aliases(graph: CapturedGraph, root: nn.Module) -> CapturedGraph:
    """Record every name ``root`` has for each parameter the captured module holds."""
    names: dict[int, list[str]] = {}
    for name, param in root.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    graph.aliases = {
        name: tuple(sorted(names.get(id(param), [name]))) for name, param in graph.module.named_parameters()
    }
    return graph


def attribute(root: nn.Module, target: str) -> Any:
    """What a ``get_attr`` node (or a ``call_module`` target) names: ``root`` followed along the dotted path."""
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _is_split_point(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is split_point


def _captured(module: fx.GraphModule) -> CapturedGraph:
    nodes, inputs, output = [], [], None
    marked = False
    # Type annotations are kept by fx as globals of the generated code; under
    # ``from __future__ import annotations`` they are strings, which the
    # GraphModule cannot pickle (a plan travels to every rank). Drop them.
    for node in module.graph.nodes:
        node.type = None
    module.recompile()
    markers = mark_regions(module)  # [Note: autocast regions]: never placed, each node knows its regions
    for node in module.graph.nodes:
        if node in markers:
            continue
        if node.op == "placeholder":
            inputs.append(node)
        elif node.op == "output":
            output = node
        elif node.op != "get_attr":
            nodes.append(node)
            marked = marked or _is_split_point(node)
    if output is None or not nodes:
        raise CaptureError("the traced graph has no operations to place")
    return CapturedGraph(module, nodes, inputs, output, marked)


def _on_host(module: fx.GraphModule) -> fx.GraphModule:
    """``module``, or a copy of it on the CPU where any of its tensors is elsewhere."""
    if all(t.device.type == "cpu" for t in [*module.parameters(), *module.buffers()]):
        return module
    return copy.deepcopy(module).cpu()


def _captured_with_sizes(
    libraries: OpLibraries,
    module: fx.GraphModule,
    sizes: list[int],
    aliases: dict[str, tuple[str, ...]],
    scalars: set[int],
    state_keys: tuple[str, ...] = (),
    gradient_free: set[int] | None = None,
    fixed: tuple[tuple[str, int, int], ...] = (),
    follows_autocast: bool = True,
) -> CapturedGraph:
    """A captured graph as it unpickles. ``libraries`` comes first: unpickling it imports the modules that
    define the custom operators ``module``'s code calls, before that code is re-traced."""
    graph = _captured(module)
    graph.aliases = aliases
    graph.scalars = scalars
    graph.gradient_free = gradient_free or set()
    graph.state_keys = state_keys
    graph.fixed = fixed
    graph.follows_autocast = follows_autocast
    for node, size in zip(graph.inputs, sizes, strict=True):
        node.meta["example_bytes"] = size
    return graph


def _sequence_of(root: nn.Module, names: list[str]) -> CapturedGraph:
    available = dict(root.named_modules())
    missing = [n for n in names if n not in available]
    if missing:
        raise CaptureError(f"no submodules named {missing}; the model has {sorted(k for k in available if k)[:20]}")
    graph = fx.Graph()
    value: fx.Node = graph.placeholder("input")
    for name in names:
        value = graph.call_module(name, (value,))
    graph.output(value)
    return _with_aliases(_captured(fx.GraphModule(root, graph)), root)


def value_uses(graph: CapturedGraph, profiles: Sequence[NodeProfile]) -> list[ValueUse]:
    """The values ``graph``'s nodes pass on, as plain data for :class:`~hintpipe.planner.tables.NodeTables`.

    Each node's output (its bytes and whether it is a tensor, from its
    profile) and each model input (its example bytes, once :func:`hintpipe.plan`
    or :func:`~hintpipe.planner.profile.profile` has set them), with the last
    node that reads it (``len(graph.nodes)``: the model's output).
    """
    n = len(graph.nodes)
    index = graph.index
    uses = []
    for i, node in enumerate(graph.nodes):
        last = max((index.get(u, n) for u in node.users), default=i)
        uses.append(ValueUse(i, last, float(profiles[i].output_bytes), profiles[i].tensor_output))
    for node in graph.inputs:
        last = max((index.get(u, n) for u in node.users), default=0)
        uses.append(ValueUse(-1, last, float(node.meta.get("example_bytes", 0)), True))
    return uses


def allowed_cuts(graph: CapturedGraph, uses: Sequence[ValueUse]) -> tuple[int, ...]:
    """The positions ``1..n-1`` where a cut may fall: only tensors cross it, every node that reads or writes a
    buffer the model writes is on one side of it ([Note: buffers a forward updates] in
    :mod:`hintpipe.planner.buffer_updates`) and, if the model marks split points, it is right after one."""
    n = len(graph.nodes)
    blocked = [False] * (n + 1)
    for producer, last, _, is_tensor in uses:
        if not is_tensor:
            blocked[producer + 1 : last + 1] = [True] * (last - producer)
    for first, last in updated_buffer_spans(graph.module, graph.nodes):
        blocked[first + 1 : last + 1] = [True] * (last - first)
    allowed = [c for c in range(1, n) if not blocked[c]]
    if graph.marked:
        allowed = [c for c in allowed if _is_split_point(graph.nodes[c - 1])]
    return tuple(allowed)
