"""torch.export's capture of a model, as a plain GraphModule that pickles (the re-trace every plan goes through
on its way to the ranks), its regions kept and its calls made device-free."""

from __future__ import annotations

import contextlib
import inspect
import pickle
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from hintpipe.planner.autocast_dtypes import asserts_a_dtype, follow_autocast_dtypes
from hintpipe.planner.capture_error import CaptureError
from hintpipe.planner.fx_trace import ModelTracer
from hintpipe.planner.inplace import out_of_place
from hintpipe.planner.module_paths import carry_module_paths, module_path
from hintpipe.planner.portable import make_portable
from hintpipe.planner.regions import keep_regions

__all__ = ["FIXED_DIMENSIONS", "exported", "fixed_dimensions"]

#: The key of a captured module's ``meta`` that holds :func:`fixed_dimensions`.
FIXED_DIMENSIONS = "hintpipe_fixed_dimensions"


def exported(
    root: nn.Module, example: tuple[Any, ...], kwargs: dict[str, Any], *, autocast: bool = True
) -> fx.GraphModule:
    """``root`` through torch.export, as a plain GraphModule: parameters as attributes, inputs flat,
    no input guards. What the model returns comes out flat: one tensor as itself (a Hugging Face model's
    logits, with ``use_cache=False``), several as a tuple, never silently dropped. With ``autocast``, exported a
    second time under a bfloat16 autocast, so that the graph follows one ([Note: a dtype read off a tensor]);
    without, once: a graph for float32 alone."""
    module = _export_once(root, example, kwargs)
    if autocast:
        follow_autocast_dtypes(module, lambda: _export_once(root, example, kwargs))
    # Re-trace now, as unpickling will on every rank: the plain tracer runs calls whose arguments are all
    # constants (an ``arange`` of a specialised length) instead of recording them, so the re-traced graph
    # can have fewer nodes; cutting the graph every rank will rebuild keeps the plan's positions valid.
    paths = [(node.op, str(node.target), module_path(node)) for node in module.graph.nodes]
    retraced: fx.GraphModule = pickle.loads(pickle.dumps(module))
    carry_module_paths(paths, retraced)
    retraced.meta[FIXED_DIMENSIONS] = module.meta[FIXED_DIMENSIONS]
    return retraced


def _export_once(root: nn.Module, example: tuple[Any, ...], kwargs: dict[str, Any]) -> fx.GraphModule:
    """``root`` through torch.export, its regions kept, made portable: :func:`exported` before its re-trace."""
    with _keywords_bound(root, kwargs) as given:
        return _export_bound(root, example, given)


@contextlib.contextmanager
def _keywords_bound(root: nn.Module, kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Within: ``root.forward`` with the keywords that are no tensors and that it takes through its ``**kwargs``
    bound (``use_cache=False`` into ``def forward(self, input_ids=None, **kwargs)``, as Hugging Face's newer
    models are written), and the tensors it takes there named in its signature; the keywords left to give it.
    torch.export takes such a keyword's dynamic shape, None, nested under ``kwargs``, and fails on it (``Must
    provide a tree_name when there might be a mismatch``); bound, the keyword is a constant of the program, as a
    named one is, and a named tensor is shaped by its name."""
    signature = inspect.signature(root.forward)
    parameters = signature.parameters
    kinds = inspect.Parameter
    taken = any(p.kind is kinds.VAR_KEYWORD for p in parameters.values())
    through = {k: v for k, v in kwargs.items() if taken and k not in parameters}  # what **kwargs takes
    if not through:
        yield kwargs
        return
    bound = {k: v for k, v in through.items() if not isinstance(v, torch.Tensor)}
    method = root.forward

    def forward(*args: Any, **more: Any) -> Any:
        return method(*args, **more, **bound)

    named = [p for p in parameters.values() if p.kind is not kinds.VAR_KEYWORD]
    tensors = [kinds(k, kinds.KEYWORD_ONLY) for k in through if k not in bound]  # named, so shaped by name
    forward.__signature__ = signature.replace(parameters=[*named, *tensors])  # type: ignore[attr-defined]
    root.forward = forward  # the instance's own, over the class's
    try:
        yield {k: v for k, v in kwargs.items() if k not in bound}
    finally:
        del root.forward


def _export_bound(root: nn.Module, example: tuple[Any, ...], kwargs: dict[str, Any]) -> fx.GraphModule:
    """:func:`_export_once` with ``root``'s keywords bound."""
    widened = _batch_of_two(example, kwargs)
    program, used = None, (example, kwargs)
    if widened is not None:  # [Note: a batch of one is exported as two]
        with contextlib.suppress(Exception):
            program, used = _program(root, *widened), widened
    try:
        program = program or _program(root, example, kwargs)
    except Exception as exc:  # export raises many kinds, each naming the construct
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CaptureError(
            f"neither torch.fx nor torch.export can capture {type(root).__name__}: {type(exc).__name__}: "
            f"{_shortened(first)}. Fix: {_fix_for(root, first, kwargs)}"
        ) from None
    module = program.module()
    fixed = fixed_dimensions(program, module, *used)  # [Note: dimensions the capture fixes]
    graph = module.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "placeholder" and not node.users:
            graph.erase_node(node)
    graph.set_codegen(fx.graph.CodeGen())
    # A plan travels to every rank pickled; the GraphModule re-traces its code on the way in, with
    # hintpipe's fx tracer (export's own needs arguments it does not pickle; the plain one would run a buffer's
    # update once, there, and drop it: [Note: buffers a forward updates]).
    graph._tracer_cls = ModelTracer
    graph._tracer_extras = {}
    output = next(n for n in graph.nodes if n.op == "output")
    flat = output.args[0]
    if isinstance(flat, (tuple, list)):
        output.args = (flat[0] if len(flat) == 1 else tuple(flat),)
    graph.lint()
    module = fx.GraphModule(module, graph)
    keep_regions(module)  # [Note: autocast regions]
    for node in [n for n in module.graph.nodes if asserts_a_dtype(n)]:  # [Note: a dtype read off a tensor]
        module.graph.erase_node(node)
    module.recompile()
    out_of_place(module)  # [Note: in-place operators between stages]
    make_portable(module)
    module.meta[FIXED_DIMENSIONS] = fixed
    return module


def _program(root: nn.Module, example: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.export.ExportedProgram:
    """torch.export's program of ``root`` on ``example`` and ``kwargs``, every dimension of their tensors free."""
    from torch.export import Dim

    def free(value: Any) -> Any:
        return {d: Dim.AUTO for d in range(value.dim())} if isinstance(value, torch.Tensor) else None

    shapes = {"args": tuple(free(v) for v in example), **{k: free(v) for k, v in kwargs.items()}}
    return torch.export.export(root, tuple(example), kwargs=kwargs, dynamic_shapes=_by_name(root, shapes), strict=False)


def fixed_dimensions(
    program: torch.export.ExportedProgram, module: fx.GraphModule, example: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[str, int, int], ...]:
    """The dimensions of the inputs that torch.export fixed though they were asked to vary: (the input, as
    ``input 0`` or its keyword, the dimension, its size), for every dimension longer than 1 of an integer input
    (token ids: no weight's shape fixes theirs) and the first of every input (the batch's). ``module`` is the
    program's, its input guards still in it.

    [Note: dimensions the capture fixes]
    ``Dim.AUTO`` lets torch.export fix a dimension where the model's code depends on its size: a Python loop
    over positions (Mamba's, RWKV's, RecurrentGemma's sequential scans without their kernels), a length read as
    a number and compared. It says nothing, and the captured graph then runs inputs of that size alone: the
    first micro-batch of another length failed inside its stage with ``select(): index 8 out of range``. Or it
    keeps the dimension free and guards it (Bamba's chunked scan holds for one count of chunks: ``16 >= L + (16 -
    L % 16) % 16``); the stages run without the guards, and a micro-batch of 20 tokens failed with ``shape '[2,
    8, 64]' is invalid``. So a dimension is fixed where its size is a number in the program, or where the
    program's guards take neither one less nor one more (a bound on the length alone, such as the model's
    positions, takes one of them). Sizes of 0 and 1 are always fixed ([Note: a batch of one is exported as
    two]) and are not named here, nor are a floating-point input's dimensions after its first: a ``Linear``
    fixes its input's features, rightly.
    """
    from torch.fx.experimental.symbolic_shapes import is_concrete_int
    from torch.utils import _pytree as pytree

    leaves = pytree.tree_flatten_with_path((example, kwargs))[0]
    specs = [spec for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"]
    values = {node.name: node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"}
    shapes = [getattr(values.get(getattr(spec.arg, "name", "")), "shape", ()) for spec in specs]
    passes = _guards(module, [leaf for _, leaf in leaves], [[str(size) for size in shape] for shape in shapes])
    fixed = []
    for i, ((path, _), spec) in enumerate(zip(leaves, specs, strict=False)):
        value = values.get(getattr(spec.arg, "name", ""))
        if not isinstance(value, torch.Tensor):
            continue
        where, key = getattr(path[0], "idx", 1), path[1]
        label = f"input {getattr(key, 'idx', key)}" if where == 0 else str(getattr(key, "key", key))
        sized = value.is_floating_point() or value.is_complex()  # a feature dimension is a weight's (Linear's)
        for d, size in enumerate(value.shape[:1] if sized else value.shape):
            if is_concrete_int(size) and size > 1:
                fixed.append((label, d, int(size)))
            elif passes is not None and not (passes(i, d, -1) or passes(i, d, 1)):
                fixed.append((label, d, int(leaves[i][1].shape[d])))
    return tuple(fixed)


def _guards(
    module: fx.GraphModule, leaves: list[Any], symbols: list[list[str]]
) -> Callable[[int, int, int], bool] | None:
    """Whether ``module``'s input guards take the inputs ``leaves`` with input ``i``'s dimension ``d`` changed by
    ``by``, and with it every dimension of the same symbol in ``symbols`` (a mask's length is its ids': the
    program says so); checked on ``meta`` tensors, guards reading sizes. None: no guards, or inputs the module
    does not take as given."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    calls = [n for n in module.graph.nodes if n.op == "call_module" and str(n.target).startswith("_guards")]
    if not calls or len(placeholders) != len(leaves):
        return None

    def passes(i: int, d: int, by: int) -> bool:
        shaped = []
        for j, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                shaped.append(leaf)
                continue
            shape = list(leaf.shape)
            for e, symbol in enumerate(symbols[j] if j < len(symbols) else ()):
                shape[e] += by if symbol == symbols[i][d] else 0
            shaped.append(torch.empty(shape, dtype=leaf.dtype, device="meta"))
        bound = dict(zip(placeholders, shaped, strict=True))
        try:
            for call in calls:
                getattr(module, str(call.target))(*(bound.get(a, a) for a in call.args))
        except AssertionError:  # "Guard failed: ..."
            return False
        except Exception:  # a guard that cannot be read on meta tensors: taken as passed
            return True
        return True

    return passes


def _batch_of_two(example: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The example and keyword inputs as a batch of two (each tensor's first dimension repeated), when they are a
    batch of one: every tensor's first dimension 1; else None.

    [Note: a batch of one is exported as two]
    torch.export fixes every dimension of size 0 or 1 of its example (it cannot tell a size 1 that broadcasts
    from one that varies), whatever ``dynamic_shapes`` says. A model planned on a batch of one (a tokenizer's
    ``input_ids`` of one text are) was captured for batches of one alone, and its first micro-batch of three
    rows failed in its stage with ``shape '[1, 16, 96]' is invalid for input of size 4608``. So a batch of one
    is exported as the same rows twice: the graph takes any batch. A model that refuses two (one whose code
    needs a batch of one) is exported on the example as given. Only the capture sees the two rows; the
    profile measures the example as given.
    """
    tensors = [v for v in (*example, *kwargs.values()) if isinstance(v, torch.Tensor)]
    if not tensors or any(t.dim() == 0 or t.shape[0] != 1 for t in tensors):
        return None

    def two(value: Any) -> Any:
        return torch.cat([value, value]) if isinstance(value, torch.Tensor) else value

    return tuple(two(v) for v in example), {k: two(v) for k, v in kwargs.items()}


def _fix_for(root: nn.Module, error: str, kwargs: dict[str, Any]) -> str:
    """What to do about torch.export's ``error``: a model that returns something other than tensors (a Hugging
    Face model's key-value cache) takes a keyword that turns it off; otherwise name submodules to run."""
    returned = re.search(r"Found <class '([\w.]+)'> in output", error)
    if returned is None:
        return "pass modules=[...] naming the submodules to run in sequence"
    parameters = inspect.signature(root.forward).parameters
    if "use_cache" in parameters and "use_cache" not in kwargs:
        return "pass kwargs={'use_cache': False} (to hintpipe.plan or capture) so that it returns no cache"
    return (
        f"make forward return tensors only (it returns a {returned.group(1).rsplit('.', 1)[-1]}): a keyword input "
        "that turns it off (kwargs={...}), or a wrapper module whose forward returns the tensors"
    )


def _shortened(error: str) -> str:
    """torch.export's first line without its advice on pytrees and links (the fix comes after)."""
    return error.split(" If this type holds tensors")[0].rstrip(".")


def _by_name(root: nn.Module, shapes: dict[str, Any]) -> dict[str, Any]:
    """Dynamic shapes keyed by ``forward``'s parameter names, as torch.export wants them (a ``forward`` that takes
    keywords through ``**kwargs`` is given them by name: :func:`_keywords_bound`); positional inputs past its named
    parameters under its ``*inputs``, as a tuple."""
    parameters = inspect.signature(root.forward).parameters
    kinds = inspect.Parameter
    names = [n for n, p in parameters.items() if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    given = shapes.pop("args")
    by_name: dict[str, Any] = dict(zip(names, given, strict=False))
    more = next((n for n, p in parameters.items() if p.kind is kinds.VAR_POSITIONAL), None)
    if more is not None and len(given) > len(names):  # ``def forward(self, *inputs)``
        by_name[more] = tuple(given[len(names) :])
    return {**by_name, **shapes}
