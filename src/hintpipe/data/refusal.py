"""A data source, a tokenizer or a prepared folder refused: one line, naming the option it is about.

The data package does not know how its caller names options (``--data`` on the command line, ``data`` in
Python): a refusal carries the option's name, and the boundary that catches it words the line
(:meth:`DataRefused.said`).

This module is torch-free.
"""

from __future__ import annotations

#: The fix of a record or a dataset without the field that holds the text: the option that names another.
FIELD_FIX = ("name one with", "data_field")


class DataRefused(ValueError):
    """Data that cannot be used: ``option`` is the option the message is about (``data``, ``data_field``,
    ``data_split``, ``tokenizer``), the message names the path and says what is wrong."""

    def __init__(self, option: str, message: str, *, fix: tuple[str, str] | None = None) -> None:
        super().__init__(message)
        self.option = option
        #: The fix where it is another option, as the words before it and the option (``("name one with",
        #: "data_field")``): worded by :meth:`said` as the caller names options, as ``option`` is.
        self.fix = fix

    def __reduce__(self) -> tuple[type[DataRefused], tuple[str, str], dict[str, tuple[str, str] | None]]:
        """Pickled whole, option and fix with the message (an exception's default rebuilds it from its message
        alone, which this ``__init__`` refuses)."""
        return (DataRefused, (self.option, str(self)), {"fix": self.fix})

    def said(self, cli: bool) -> ValueError:
        """The refusal as the caller reads it: ``--data PATH: ...`` on the command line, ``data PATH: ...`` in
        Python, its fix ending the line (``; name one with --data-field``, ``; name one with data_field``)."""
        text = f"{_label(self.option, cli)} {self}"
        if self.fix is not None:
            words, option = self.fix
            text += f"; {words} {_label(option, cli)}"
        return ValueError(text)


def _label(option: str, cli: bool) -> str:
    """An option as the caller names it: its flag on the command line, its key in Python."""
    return "--" + option.replace("_", "-") if cli else option
