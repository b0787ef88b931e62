"""The rule every command's ``--json`` keeps: a key that holds a time says its unit."""

from __future__ import annotations

import re
from typing import Any

#: Words that make a key a time (``timeline`` is a file name, not a time).
TIME_WORDS = re.compile(r"time(?!line)|makespan|bound|seconds|overlap|exposed|coordination|latency|duration|elapsed")
#: The units a time key may end in: seconds, milliseconds, or the simulator's cost units.
UNITS = ("_s", "_ms", "_seconds", "_cost")


def unitless_time_keys(payload: Any, where: str = "") -> list[str]:
    """Every key of ``payload`` (nested objects and lists too) whose value is a time (numbers, or lists of
    them, under a time word) without its unit; an object under such a word (the planner's ``time``
    baseline) is a name, not a time."""
    found: list[str] = []
    if isinstance(payload, dict):
        for key, value in payload.items():
            path = f"{where}.{key}" if where else str(key)
            if TIME_WORDS.search(str(key)) and _numbers(value) and not str(key).endswith(UNITS):
                found.append(path)
            found += unitless_time_keys(value, path)
    elif isinstance(payload, list):
        for index, value in enumerate(payload):
            found += unitless_time_keys(value, f"{where}[{index}]")
    return found


def _numbers(value: Any) -> bool:
    if isinstance(value, list):
        return all(_numbers(v) for v in value)
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
