"""A run's config as 0.7 first had it, flat, still taken for a release (CHANGELOG: "Renamed").

Before the sections (:mod:`~hintpipe.apps.run_sections`), :class:`~hintpipe.apps.train_config.TrainConfig`
had every option as a field of its own: ``TrainConfig(model=..., ranks=2, microbatches=8, lr=3e-4)``,
``config.lr``. Until :data:`~hintpipe.renamed.REMOVED_IN` both still work, each with a ``DeprecationWarning``
that names what to write now (``TrainConfig.of(...)``, ``config.optimizer.lr``). Three keys name a section now,
so their reads cannot be kept: ``config.data`` is the data's section (its source is ``config.data.source``),
``config.optimizer`` the optimizer's (``config.optimizer.kind``), ``config.lr_schedule`` the schedule's
(``config.lr_schedule.kind``); given as keywords, all three are still read as before.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

from hintpipe.apps.config_section import Section
from hintpipe.apps.run_sections import SECTION_NAMED, place_of, sectioned
from hintpipe.renamed import REMOVED_IN


def taking_keys_before(config_class: type[Any]) -> None:
    """``config_class`` (the run's config) made from options' keys, as before the sections, with a warning:
    its constructor given a key that is no field of its own (``lr=``), or a section's name given a value that
    is no section (``data="corpus.txt"``), makes its sections of them."""
    generated = config_class.__init__
    fields = {f.name for f in dataclasses.fields(config_class) if f.init}
    kinds = SECTION_NAMED

    @functools.wraps(generated)
    def init(self: Any, **given: Any) -> None:
        flat = [k for k, v in given.items() if k not in fields or (k in kinds and not isinstance(v, kinds[k]))]
        if flat:
            sections = [k for k, v in given.items() if isinstance(v, Section) or k in ("pipeline", "parallelism")]
            if sections:
                raise TypeError(
                    f"TrainConfig() takes its sections or, as TrainConfig.of(), the options' keys, not both: got "
                    f"{', '.join(sections)} with {', '.join(flat)}"
                )
            warnings.warn(
                f"TrainConfig({flat[0]}=...) with the options' keys is now TrainConfig.of({flat[0]}=...), or "
                f"{_in_section(flat[0])}; the flat form goes in {REMOVED_IN}",
                DeprecationWarning,
                stacklevel=2,
            )
            given = sectioned(given)
        generated(self, **given)

    config_class.__init__ = init


def _in_section(key: str) -> str:
    """``TrainConfig(optimizer=OptimizerConfig(lr=...))``: the option ``key`` given in its section."""
    place = place_of(key) or key
    if "." not in place:
        return f"TrainConfig({place}=...)"
    section, field = place.split(".")
    kind = "PipelineConfig" if section == "pipeline" else SECTION_NAMED[section].__name__
    return f"TrainConfig({section}={kind}({field}=...))"


def read_by_key(config: object, name: str) -> Any:
    """The option ``name`` of a run's ``config`` read by its key (``config.lr``), as before the sections, with a
    warning that names where it is now (``config.optimizer.lr``).

    Raises:
        AttributeError: ``name`` is no option in a section (``__getattr__``'s contract).
    """
    place = None if name.startswith("_") else place_of(name)
    if place is None or "." not in place:
        raise AttributeError(f"'{type(config).__name__}' object has no attribute {name!r}")
    section, field = place.split(".")
    warnings.warn(
        f"{type(config).__name__}.{name} is now {type(config).__name__}.{place}", DeprecationWarning, stacklevel=3
    )
    return getattr(object.__getattribute__(config, section), field)
