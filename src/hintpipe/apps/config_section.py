"""A section of a run's config (see :mod:`~hintpipe.apps.run_sections`): plain data whose fields are options,
each checked by its key's row of the options table as the section is made.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from hintpipe.option import ChoiceField
from hintpipe.options import OPTIONS, check_options


def keyed(default: Any, key: str, **more: Any) -> Any:
    """A field whose key is ``key``, not its name (see [Note: a key per field] in
    :mod:`~hintpipe.apps.run_sections`)."""
    return dataclasses.field(default=default, metadata={"key": key}, **more)


def key_of(owner: type, field: dataclasses.Field[Any]) -> str:
    """The key of ``owner``'s field: the option's name (see [Note: a key per field] in
    :mod:`~hintpipe.apps.run_sections`), a choice's its :class:`~hintpipe.option.ChoiceField`'s."""
    descriptor = vars(owner).get(field.name)
    if isinstance(descriptor, ChoiceField):
        return descriptor.option.name
    key: str = field.metadata.get("key", field.name)
    return key


class Section:
    """A section of the run's config: its fields checked by their keys' options as it is made."""

    #: The section's name in the run's config (the attribute that holds it).
    name: ClassVar[str]

    def __post_init__(self) -> None:
        fields = [f for f in dataclasses.fields(self) if f.init]  # type: ignore[arg-type]
        keyed = {key_of(type(self), f): f.name for f in fields if key_of(type(self), f) in OPTIONS}
        checked = check_options({key: getattr(self, name) for key, name in keyed.items()})
        for key, value in checked.items():
            object.__setattr__(self, keyed[key], value)

    def keys(self) -> dict[str, Any]:
        """The section's values by key (the names :meth:`TrainConfig.of
        <hintpipe.apps.train_config.TrainConfig.of>` takes)."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {key_of(type(self), f): getattr(self, f.name) for f in fields if f.init}
