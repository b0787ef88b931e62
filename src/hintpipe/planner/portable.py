"""A captured graph made free of the capture's device and mode.

torch.export records what ``forward`` did on the example it ran: a position
index made with ``arange(..., device=input.device)`` becomes
``aten.arange(n, device=cpu)``, and a dropout becomes ``aten.dropout(x, 0.1,
True)``, the training flag of the moment. A stage cut from such a graph keeps
the capture's device and mode for good: planned on a CPU, it fails on a GPU;
planned in train mode, it drops out in evaluation; planned after
``from_pretrained`` (eval mode), it trains without dropout, silently.

[Note: operators that follow their module]
Every operator call that names a device, a training flag (an argument named
``train`` or ``training``) or an attention's dropout probability
(``dropout_p``, which the model's code passes as ``p if self.training else
0.0``) is replaced by a call of a :class:`FollowingOp` sub-module: the same
operator, its device read from an empty buffer of the module (which
``.to(device)`` moves like any buffer), its training flag from
the module's own ``training`` (which ``.train()`` and ``.eval()`` set like any
module's), its dropout probability 0 in eval mode. The node keeps its place
(a re-trace names it after its module, ``following_dropout_3``), so the
planner's positions do not change; the buffer is not persistent, so no state
dict sees it. The graph's code then names no device: a plan made on one
device captures to the same code on another, which is what a plan file checks.
torch's own ``move_to_device_pass`` writes another fixed device instead, and
its train/eval rewrites recognise dropout and batch norm patterns only; one
rule by argument names covers every operator with such an argument.

[Note: every form of a device]
A device is named in many forms, and each one left in a graph pins its stage to the capture's device
(each was seen failing on ``meta``). :func:`_device_at` finds them all, in ``call_function`` and
``call_method`` nodes alike:

- a keyword, ``device=``: ``aten.arange(n, device=cpu)``, ``x.new_ones(n, device="cpu")``;
- a position: where the operator's schema has a ``Device`` argument (export's ``aten.to.device(y,
  device(type='cpu'), torch.float32, ...)``), where a Python function's parameter is named ``device``, the
  device of ``x.to("cpu")`` or ``x.to(0)``, and any ``torch.device`` object wherever it stands;
- a method that names its device itself: ``x.cpu()`` and ``x.cuda()`` become ``x.to(<the stage's device>)``,
  as torch.export's own ``_to_copy(x, device=cpu)`` for ``x.cpu()`` is.

Each form's value may be a ``torch.device``, a string (``"cpu"``, ``"cuda:1"``) or an int (a CUDA
index); a device given as a graph value (``x.to(h.device)`` that tracing kept symbolic) follows already.
The literal leaves the node's arguments, and the :class:`FollowingOp` puts the module's device back at
the same place when it runs, so the graph's code names no device at all (a test scans every stage of
every architecture in the zoo for one). A call that names no device but makes a tensor (``torch.zeros(n)``
in a torch.fx trace) is on the default device, as in the model: torch.export writes the device out
(``aten.zeros(n, device=cpu)``), so a model it captures has none such.

Every device is taken to mean "where the model runs": a model that puts
a tensor on the CPU on purpose inside ``forward`` gets it on the stage's device.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
import torch.fx as fx
from torch import nn

#: The sub-module under which the graph keeps its following operators (one child per node).
CONTAINER = "following"

#: Argument names that carry an operator's training flag.
_TRAINING_NAMES = ("train", "training")

#: Argument names of a dropout probability that the model's code passes only in training
#: (``dropout_p=self.p if self.training else 0.0``, as attention layers call ``scaled_dot_product_attention``).
_PROBABILITY_NAMES = ("dropout_p",)

#: How an operator's schema types a device argument.
_DEVICE_TYPES = ("Device", "Optional[Device]")

#: Tensor methods whose name says their device, and the names of their other arguments, in order.
_MOVING_METHODS = {"cpu": ("memory_format",), "cuda": ("device", "non_blocking", "memory_format")}


@dataclasses.dataclass(frozen=True)
class Method:
    """A tensor method as a function (what a ``call_method`` node calls): ``Method("to")(x, *args)`` is
    ``x.to(*args)``. A plain value, so that it pickles with the plan."""

    name: str

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(target, self.name)(*args, **kwargs)


class FollowingOp(nn.Module):
    """One operator call whose device follows the module's device and whose training flag follows its mode.

    Args:
        op: the operator (an ``OpOverload`` such as ``aten.arange.default``, a function such as
            ``torch.arange``, or a tensor :class:`Method`).
        training_at: where the training flag is: a positional index, a keyword's name, or None.
        device_at: where the module's device goes ([Note: every form of a device]): a keyword's name, a
            positional index (the device is inserted there: the node's arguments no longer hold it), or None.
        probability_at: where a dropout probability is that holds in training and is 0 in eval mode.
        autocast_dtype_at: where a dtype is that the model read off a tensor which an autocast makes its own
            dtype: under an autocast on the module's device, that autocast's dtype ([Note: a dtype read off a
            tensor] in :mod:`~hintpipe.planner.autocast_dtypes`).
    """

    def __init__(
        self,
        op: Any,
        training_at: int | str | None,
        device_at: int | str | None,
        probability_at: int | str | None = None,
        autocast_dtype_at: int | str | None = None,
    ) -> None:
        super().__init__()
        self.op_name, self._op = _op_name(op), op
        self.training_at = training_at
        self.device_at = device_at
        self.probability_at = probability_at
        self.autocast_dtype_at = autocast_dtype_at
        # Empty, not persistent: it moves with .to() and stays out of every state dict.
        self.register_buffer("anchor", torch.empty(0), persistent=False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # The device first: the other places are positions of the call as the model made it.
        if isinstance(self.device_at, str):
            kwargs[self.device_at] = self.anchor.device
        elif self.device_at is not None:
            args = (*args[: self.device_at], self.anchor.device, *args[self.device_at :])
        if self.training_at is not None:
            args = _replaced(args, kwargs, self.training_at, self.training)
        if self.probability_at is not None and not self.training:
            args = _replaced(args, kwargs, self.probability_at, 0.0)
        if self.autocast_dtype_at is not None and _autocast_on(device := str(self.anchor.device.type)):
            args = _replaced(args, kwargs, self.autocast_dtype_at, torch.get_autocast_dtype(device))
        return self.op(*args, **kwargs)

    @property
    def op(self) -> Any:
        if self._op is None:
            self._op = _resolve(self.op_name)
        return self._op

    def extra_repr(self) -> str:
        return (
            f"{self.op_name}, training_at={self.training_at!r}, device_at={self.device_at!r}, "
            f"probability_at={self.probability_at!r}, autocast_dtype_at={self.autocast_dtype_at!r}"
        )

    def __getstate__(self) -> dict[str, Any]:
        # An OpOverload does not pickle (a plan travels to every rank pickled): keep its name.
        state = dict(self.__dict__)
        state["_op"] = None if isinstance(self._op, torch._ops.OpOverload) else self._op
        return state


def _autocast_on(device: str) -> bool:
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def _replaced(args: tuple[Any, ...], kwargs: dict[str, Any], at: int | str, value: Any) -> tuple[Any, ...]:
    """``args`` with ``value`` at position ``at``, or ``kwargs[at] = value`` (in place) for a keyword."""
    if isinstance(at, str):
        kwargs[at] = value
        return args
    return (*args[:at], value, *args[at + 1 :])


def _op_name(op: Any) -> str:
    if isinstance(op, Method):
        return f"torch.Tensor.{op.name}"
    if isinstance(op, torch._ops.OpOverload):
        return f"torch.ops.{op.namespace}.{op._opname}.{op._overloadname}"
    return f"{getattr(op, '__module__', '')}.{getattr(op, '__qualname__', repr(op))}"


def _resolve(name: str) -> Any:
    """The operator ``torch.ops.NS.NAME.OVERLOAD`` named by :func:`_op_name`."""
    value: Any = torch
    for part in name.removeprefix("torch.").split("."):
        value = getattr(value, part)
    return value


def _argument_at(node: fx.Node, names: tuple[str, ...]) -> int | str | None:
    """Where ``node``'s call passes an argument of one of these names (a positional index or a keyword) as a
    constant, or None: a graph value there (``training=self.training`` that tracing kept) follows already."""
    at: int | str | None = next((name for name in names if name in node.kwargs), None)
    if at is None:
        positions = [i for i, name in enumerate(_positional_names(node.target)) if name in names]
        at = next((i for i in positions if i < len(node.args)), None)
    if at is None or isinstance(node.kwargs[at] if isinstance(at, str) else node.args[at], fx.Node):
        return None
    return at


def _positional_names(target: Any) -> list[str]:
    """The names of the arguments ``target`` takes by position: from an operator's schema, or a Python
    function's signature (``F.dropout(x, 0.1, True)`` as torch.fx records it); none where neither tells."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return [a.name for a in schema.arguments if not a.kwarg_only]
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _is_device(value: Any) -> bool:
    """Whether ``value`` names a device as a constant: a ``torch.device``, a string, or an int (a CUDA index;
    not a bool)."""
    return isinstance(value, (torch.device, str)) or (isinstance(value, int) and not isinstance(value, bool))


def _device_at(node: fx.Node) -> int | str | None:
    """Where ``node``'s call names a device as a constant (a keyword's name or a positional index), or None
    (see [Note: every form of a device])."""
    if "device" in node.kwargs:
        return "device" if _is_device(node.kwargs["device"]) else None
    for i in _device_positions(node):
        if i < len(node.args) and _is_device(node.args[i]):
            return i
    return next((i for i, value in enumerate(node.args) if isinstance(value, torch.device)), None)


def _device_positions(node: fx.Node) -> list[int]:
    """The positions where ``node``'s call takes a device: ``x.to(device, ...)`` (after ``x``), a ``Device``
    argument of an operator's schema, a Python function's parameter named ``device``."""
    if node.op == "call_method":
        return [1] if node.target == "to" else []
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        positional = [a for a in schema.arguments if not a.kwarg_only]
        return [i for i, a in enumerate(positional) if str(a.type) in _DEVICE_TYPES]
    return [i for i, name in enumerate(_positional_names(node.target)) if name == "device"]


def _as_moving_to(node: fx.Node) -> fx.Node:
    """``x.cpu(...)`` or ``x.cuda(...)`` as a new node in its place, ``x.to(...)`` with its device left out
    (the :class:`FollowingOp` that calls it puts the module's device first): the method's name is its device,
    and a node named after it would name it in the code."""
    names = _MOVING_METHODS[str(node.target)]
    kwargs = dict(zip(names, node.args[1:], strict=False)) | dict(node.kwargs)
    kwargs.pop("device", None)
    with node.graph.inserting_before(node):
        moved = node.graph.call_method("to", node.args[:1], kwargs)
    moved.meta = dict(node.meta)
    node.replace_all_uses_with(moved)
    node.graph.erase_node(node)
    return moved


def _followed_target(node: fx.Node) -> Any:
    """What a :class:`FollowingOp` calls in ``node``'s place: its function, or its tensor method."""
    return Method(str(node.target)) if node.op == "call_method" else node.target


def make_portable(module: fx.GraphModule) -> int:
    """Replace, in place, every call in ``module``'s graph that names a device (in any form: [Note: every form
    of a device]), a training flag or an attention's dropout probability by a :class:`FollowingOp` (see
    [Note: operators that follow their module]); the number replaced.

    A flag given as a graph value (``training=self.training`` that tracing kept symbolic) follows already
    and stays as it is.
    """
    container = nn.Module()
    where = next((t.device for t in [*module.parameters(), *module.buffers()]), torch.device("cpu"))
    for node in list(module.graph.nodes):
        if node.op not in ("call_function", "call_method"):
            continue
        device_at = _device_at(node)
        training_at = _argument_at(node, _TRAINING_NAMES)
        probability_at = _argument_at(node, _PROBABILITY_NAMES)
        if node.op == "call_method" and node.target in _MOVING_METHODS:
            node = _as_moving_to(node)
            device_at = 1
        elif isinstance(device_at, str):
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != device_at}
        elif device_at is not None:
            node.args = (*node.args[:device_at], *node.args[device_at + 1 :])
        if training_at is None and probability_at is None and device_at is None:
            continue
        # The node's own name (a re-traced graph names the node after it); ``to`` or ``eval`` must not meet
        # nn.Module's own attributes.
        child = f"{node.name}_" if hasattr(container, node.name) else node.name
        container.add_module(child, FollowingOp(_followed_target(node), training_at, device_at, probability_at))
        node.op, node.target = "call_module", f"{CONTAINER}.{child}"
    if not container._modules:
        return 0
    module.add_module(CONTAINER, container.to(where))  # where the captured model is
    module.graph.lint()
    module.recompile()
    return len(container._modules)
