"""What capture refuses, and the mark a model's code puts where a cut may fall: the two names of the capture
that model code and the trace itself need without the rest of it."""

from __future__ import annotations

from typing import Any

__all__ = ["CaptureError", "split_point"]


class CaptureError(ValueError):
    """The model cannot be captured as given."""


def split_point(x: Any) -> Any:
    """Mark a place in ``forward`` where the planner may cut (identity at run time).

    Once a model uses it, cuts are only placed right after split points.
    """
    return x
