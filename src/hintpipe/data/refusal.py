"""A data source, a tokenizer or a prepared folder refused: one line, naming the option it is about.

The data package does not know how its caller names options (``--data`` on the command line, ``data`` in
Python): a refusal carries the option's name, and the boundary that catches it words the line
(:meth:`DataRefused.said`).

This module is torch-free.
"""

from __future__ import annotations


class DataRefused(ValueError):
    """Data that cannot be used: ``option`` is the option the message is about (``data``, ``data_field``,
    ``data_split``, ``tokenizer``), the message names the path and says what is wrong."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option

    def said(self, cli: bool) -> ValueError:
        """The refusal as the caller reads it: ``--data PATH: ...`` on the command line, ``data PATH: ...`` in
        Python."""
        label = "--" + self.option.replace("_", "-") if cli else self.option
        return ValueError(f"{label} {self}")
