"""Sizes written for people: ``512MiB``, ``2GiB``, ``1.5e9``, ``6``."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> float:
    """A size in bytes (or plain units when no suffix is given).

    Raises:
        ValueError: naming the text and the accepted forms.
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"bad size {text!r}: expected a number with an optional unit such as 512MiB, 2GiB or 1e9")
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value):
        raise ValueError(f"bad size {text!r}: not finite")
    return value


def format_size(value: float) -> str:
    """``1536`` -> ``'1.5KiB'``; small plain numbers stay as they are."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            x = value / scale
            return f"{x:.3g}{unit}" if abs(x) < 100 else f"{x:.0f}{unit}"
    return f"{value:g}"


def parse_sizes(text: str | float | Sequence[str | float], count: int, what: str) -> tuple[float, ...]:
    """One size for each of ``count`` ranks or stages: one value (for all) or ``count``
    values (a sequence, or text separated by commas).

    Raises:
        ValueError: naming ``what`` and the counts when they do not match.
    """
    if isinstance(text, (int, float)):
        values = [float(text)]
    elif isinstance(text, str):
        values = [parse_size(part) for part in text.split(",")]
    else:
        values = [parse_size(v) if isinstance(v, str) else float(v) for v in text]
    if len(values) == 1:
        return (values[0],) * count
    if len(values) != count:
        raise ValueError(f"{what} has {len(values)} values for {count}: give one, or one each")
    return tuple(values)
