"""A process's children and descendants, read with ``pgrep`` (the tests that kill ranks find them so)."""

from __future__ import annotations

import subprocess

from conftest import allow


def children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid``."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=allow(30)).stdout.split()
    return [int(p) for p in found]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, each child before its own descendants."""
    return [d for child in children(pid) for d in (child, *descendants(child))]
