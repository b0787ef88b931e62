"""One option of the pipeline: its definition and the check of a value given for it.

The options themselves, every one, are the table in :mod:`hintpipe.options`; this module is what an
entry of that table is, and how a value becomes the option's (a choice's string its enum, a size's
``2GiB`` its bytes), refused in one message that names the option the way the caller wrote it.

This module is torch-free.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator
from typing import Any, Generic, TypeVar, overload

from hintpipe.choice import Choice
from hintpipe.units import parse_size

#: What ranks may agree on about an option (:attr:`Option.agreement`).
AGREEMENTS = ("equal", "given", "own", "resolved")
#: The longest watchdog timeout: a week. The watchdog exists to end a stuck run, and far larger values
#: overflow the process groups' own timeouts (``datetime.timedelta``).
MAX_TIMEOUT = 7 * 24 * 3600.0
#: Whether a config being built names its options as flags (see :func:`said_as_flags`).
_AS_FLAGS: contextvars.ContextVar[bool] = contextvars.ContextVar("hintpipe_options_as_flags", default=False)


@contextlib.contextmanager
def said_as_flags() -> Iterator[None]:
    """Within: a config's checks name its options as flags (``--warmup-steps``), not keywords
    (``warmup_steps``). The command line builds its config here, so that each rule of a config is checked once,
    in the config, and still speaks to the command line's user in the words they typed."""
    token = _AS_FLAGS.set(True)
    try:
        yield
    finally:
        _AS_FLAGS.reset(token)


def said_as_flags_now() -> bool:
    """Whether messages name options as flags here (within :func:`said_as_flags`): for a message that shows a
    value as the caller wrote it, too (``--data a --data b`` against ``data ('a', 'b')``)."""
    return _AS_FLAGS.get()


def flag_of(name: str) -> str:
    """The command line's flag of the option or field ``name`` (``warmup_steps``: ``--warmup-steps``)."""
    return "--" + name.replace("_", "-")


def said(name: str, *, cli: bool = False) -> str:
    """How a message names the option or field ``name``: its flag on the command line (``cli``, or within
    :func:`said_as_flags`), its keyword in Python."""
    return flag_of(name) if cli or _AS_FLAGS.get() else name


#: The shortest watchdog timeout: below a second, a message delayed by a busy machine would end the run.
MIN_TIMEOUT = 1.0


@dataclasses.dataclass(frozen=True)
class Option:
    """One option.

    Attributes:
        name: the Python keyword and config field; the command line's flag is ``--`` + ``name`` with dashes.
        kind: ``int``, ``float``, ``bool``, ``choice``, ``size``, ``str`` (a name or a path), ``specs`` (a
            repeatable flag: a tuple of strings), ``sources`` (a repeatable flag whose one value is a string: one
            string, or a tuple of several) or ``object`` (Python only). A ``size`` is an amount of memory whose
            value carries its unit: a string such as ``"2GiB"`` or ``"512MB"``, a bare number being bytes; so a
            size's name says what it measures and no unit (``activation_budget``, ``stage_memory``), where a
            number of another kind names its unit (``slack_microbatches``: micro-batches;
            ``device_budget_fraction``: a fraction; ``timeout``: seconds, as Python's own timeouts are).
        default: the default value (as the Python API takes it).
        help: what the option does, for ``--help`` and the docstrings.
        choices: the enum of a ``choice`` option.
        minimum, maximum: the inclusive range of a number (None: unbounded).
        optional: whether ``None`` is a value (the option then means "not given").
        required: whether every caller must give it (no default).
        metavar: the command line's placeholder.
        commands: the commands that take it as a flag (empty: Python only).
        pipeline: whether :class:`~hintpipe.runtime.pipeline.Pipeline` takes it.
        agreement: what the ranks must agree on, compared at start-up
            (:mod:`hintpipe.runtime.option_agreement`): ``equal`` (the value), ``given`` (whether it is given:
            objects each rank builds its own of, a mesh, FSDP's options, emulated costs), ``own`` (each rank
            its own: byte budgets, how much history it keeps) or ``resolved`` (compared as what it resolves
            to: the hint and its chunks as the hint's name and stages).
        before: the option's name before a rename, still taken until :data:`~hintpipe.renamed.REMOVED_IN`, each
            use warned with the new name: a keyword of the configs and of the pipeline's constructors, an attribute
            read (:func:`~hintpipe.options.taking_names_before`), a flag of the command line (hidden from
            ``--help``: :class:`~hintpipe.cli.common.RetiredFlag`) and a key of a config file. None: never renamed.
    """

    name: str
    kind: str
    default: Any
    help: str
    choices: type[Choice] | None = None
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False
    required: bool = False
    metavar: str | None = None
    commands: frozenset[str] = frozenset()
    pipeline: bool = True
    agreement: str = "equal"
    before: str | None = None

    def __post_init__(self) -> None:
        assert self.agreement in AGREEMENTS, self.agreement

    @property
    def flag(self) -> str:
        return flag_of(self.name)

    def label(self, cli: bool) -> str:
        """How a message names the option: its flag on the command line, its keyword in Python (see
        :func:`said`)."""
        return said(self.name, cli=cli)

    def check(self, value: Any, *, cli: bool = False) -> Any:
        """``value`` converted (a choice's string to its enum) and checked against the range.

        Raises:
            ValueError: naming the option (as :meth:`label`), the value and what is accepted.
        """
        if value is None and self.optional:
            return None
        label = self.label(cli)
        if self.choices is not None:
            try:
                return self.choices.parse(value)
            except ValueError:
                known = ", ".join(member.value for member in self.choices)
                raise ValueError(f"{label} {value!r} is unknown: choose one of {known}") from None
        if self.kind == "size" and isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError as exc:
                raise ValueError(f"{label}: {exc}") from None
        if self.kind in ("int", "float", "size"):
            return self._number(value, label)
        if self.kind == "specs":
            return tuple(value)
        if self.kind == "sources":
            return self._sources(value, label)
        if self.kind == "str" and not isinstance(value, str):
            raise ValueError(f"{label} must be a string, got {value!r}")
        return value

    def _number(self, value: Any, label: str) -> float | int:
        integral = self.kind == "int"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integral and value != int(value)):
            raise ValueError(f"{label} must be {'an integer' if integral else 'a number'}, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{label} must be finite, got {value!r}")
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{label} must be {_range(low, high)}, got {_number(value)}{self._why()}")
        if integral and high is None and value > LARGEST_INT:  # see [Note: no integer without a bound]
            raise ValueError(f"{label} must be at most {LARGEST_INT}, got {_number(value)}")
        return int(value) if integral else float(value)

    def _sources(self, value: Any, label: str) -> Any:
        """One string, or several as a tuple (a list or tuple of one is its string); none given: the default."""
        items = [value] if isinstance(value, str) else value
        if items is None or (isinstance(items, (list, tuple)) and not items):
            return self.default
        if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
            raise ValueError(f"{label} must be a string or a list of strings, got {value!r}")
        return items[0] if len(items) == 1 else tuple(items)

    def _why(self) -> str:
        return _REASONS.get(self.name, "")


def _number(value: float) -> str:
    if isinstance(value, int):  # as given, however long: 9223372036854775807, not 9.22337e+18
        return str(value)
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _range(low: float | None, high: float | None) -> str:
    if high is None:
        return f"at least {_number(low)}" if low else ">= 0"
    if low is None:
        return f"at most {_number(high)}"
    return f"between {_number(low)} and {_number(high)}"


C = TypeVar("C", bound=Choice)


class ChoiceField(Generic[C]):
    """A config field whose option is a choice: given as its enum or the enum's string, read as the enum.

    [Note: choices typed as their enums]
    A choice option is given as a string (``policy="ready"``, ``--policy ready``, a config file's
    ``policy = "ready"``) and used as its enum (``Policy.READY``). Typed ``str | Policy``, every use
    converted again (``Policy.parse(config.policy)``), and what reached the runtime was untyped. As a
    data descriptor in a dataclass, a field is converted once, when the config is made (the generated
    ``__init__`` and :func:`dataclasses.replace` set it through :meth:`__set__`), and read as the enum:
    type checkers take the ``__init__`` parameter's type from ``__set__`` (``str | Policy``) and the
    attribute's from ``__get__`` (``Policy``). The value lives in the instance's ``__dict__`` under the
    field's own name, so pickling and copying see a plain dataclass.
    """

    def __init__(self, option: Option) -> None:
        assert option.choices is not None, option
        self.option = option
        self.attribute = option.name  # the field's name, once the class is made (a run's option: its key)
        self.default: C = option.choices.parse(option.default)  # type: ignore[assignment]

    def __set_name__(self, owner: type, name: str) -> None:
        self.attribute = name
        if not self.option.name:  # a pipeline option, named by its field (a run's option has its name already)
            self.option = dataclasses.replace(self.option, name=name)

    @overload
    def __get__(self, instance: None, owner: type) -> C: ...

    @overload
    def __get__(self, instance: object, owner: type) -> C: ...

    def __get__(self, instance: object | None, owner: type) -> C:
        if instance is None:  # the class's default (what dataclasses asks a descriptor field for)
            return self.default
        value: C = instance.__dict__[self.attribute]
        return value

    def __set__(self, instance: object, value: str | C) -> None:
        instance.__dict__[self.attribute] = self.option.check(value)


#: The largest value of an integer option that names no maximum of its own.
#:
#: [Note: no integer without a bound]
#: An integer option with no maximum took any Python int: ``--checkpoint-every 9223372036854775808`` or a config
#: file's ``steps = 9223372036854775807`` passed every check, the ranks started, and the value failed there, late
#: and on one rank (an ``OverflowError`` where it met a 64-bit tensor or a C call, after step 1). So every
#: integer option is bounded when it is parsed, by its own maximum or by this one (counts of steps, ranks,
#: micro-batches and the like; a size in bytes is a ``size`` option, not bounded here), and refused in one line.
LARGEST_INT = 2**31 - 1


_REASONS = {
    "timeout": f" ({MIN_TIMEOUT:g} s: a busy machine delays messages that long; {MAX_TIMEOUT:g} s: a week)",
}
