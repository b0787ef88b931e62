"""A training loop's checkpoints: resume once, then save and prune after every step."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from hintpipe.runtime.checkpoint.saving import WriterFactory, prune_checkpoints, resume, save_checkpoint


class Checkpointer:
    """A training loop's checkpoints: resume once, then :meth:`after_step` after every step (every rank).

    It saves every ``every`` steps and when the loop is stopping, and prunes to
    ``keep`` verified checkpoints one step after a save (so the newest has been
    verified and a step after it completed before anything older goes).
    """

    def __init__(
        self,
        directory: str | Path,
        modules: Mapping[int, nn.Module],
        optimizer: torch.optim.Optimizer | None,
        *,
        every: int = 0,
        keep: int = 2,
        hint: str = "",
        group: dist.ProcessGroup | None = None,
        storage_writer: WriterFactory = FileSystemWriter,
    ) -> None:
        if every < 0 or keep < 1:
            raise ValueError(f"every must be >= 0 and keep >= 1, got every={every}, keep={keep}")
        self.directory = Path(directory)
        self.modules = modules
        self.optimizer = optimizer
        self.every = every
        self.keep = keep
        self.hint = hint
        self.group = group
        #: Damaged checkpoints the resume skipped, one line each.
        self.skipped: list[str] = []
        #: The last checkpoint this run saved.
        self.last: Path | None = None
        self.storage_writer = storage_writer
        self._prune_due = False

    def resume(self) -> int:
        """Load the newest verified checkpoint; returns the step to continue from (0 if there is none)."""
        step, self.skipped = resume(self.directory, self.modules, self.optimizer, hint=self.hint, group=self.group)
        return step

    def after_step(self, done: int, *, stopping: bool = False) -> Path | None:
        """Call when step ``done - 1`` has completed (``done`` steps done); returns the checkpoint it saved."""
        if self._prune_due and dist.get_rank(self.group) == 0:
            prune_checkpoints(self.directory, self.keep)
        self._prune_due = False
        if not (stopping or (self.every and done % self.every == 0)):
            return None
        self.last = save_checkpoint(
            self.directory,
            self.modules,
            self.optimizer,
            done,
            hint=self.hint,
            group=self.group,
            storage_writer=self.storage_writer,
        )
        self._prune_due = True
        return self.last
