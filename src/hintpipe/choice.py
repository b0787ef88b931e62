"""Options with a fixed set of values, converted from strings once, at the boundary.

This module is torch-free.
"""

from __future__ import annotations

import enum
from typing import Self


class Choice(enum.StrEnum):
    """A string option; :meth:`parse` refuses an unknown value, listing the known ones."""

    @classmethod
    def noun(cls) -> str:
        """What the option is called in messages."""
        return cls.__name__.lower()

    @classmethod
    def alternatives(cls) -> str:
        """Anything a user may give besides the members (appended to the message)."""
        return ""

    @classmethod
    def parse(cls, value: str | Self) -> Self:
        """The member named ``value``.

        Raises:
            ValueError: naming the value and every known one.
        """
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(member.value for member in cls)
            raise ValueError(f"unknown {cls.noun()} {value!r}: choose one of {known}{cls.alternatives()}") from None
