"""A training loop's checkpoints: start or resume once, then save and prune after every step."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from hintpipe.runtime.checkpoint.collective import together
from hintpipe.runtime.checkpoint.description import checked_description
from hintpipe.runtime.checkpoint.folder_lock import FolderLock
from hintpipe.runtime.checkpoint.manifest import step_folders
from hintpipe.runtime.checkpoint.permissions import use as use_modes
from hintpipe.runtime.checkpoint.rank_state import Stateful
from hintpipe.runtime.checkpoint.run_folder import adopt, check_layout, claim, read_run
from hintpipe.runtime.checkpoint.saving import (
    WriterFactory,
    foreign_owner,
    prune_checkpoints,
    resume,
    save_checkpoint,
    step_name,
)
from hintpipe.runtime.errors import CheckpointError
from hintpipe.runtime.launcher_env import LAUNCHER_ENV
from hintpipe.runtime.liveness import phase_group
from hintpipe.runtime.model_names import ModelNames

log = logging.getLogger(__name__)


class Staged(Protocol):
    """What a checkpoint needs of a pipeline: its stages and the model's names for their tensors
    (:class:`~hintpipe.runtime.pipeline.Pipeline` is one)."""

    @property
    def modules(self) -> Mapping[int, nn.Module]: ...

    @property
    def names(self) -> ModelNames: ...

    @property
    def hint_name(self) -> str: ...

    #: The steps run so far: :meth:`Checkpointer.resume` sets it to the step it continues from, so that the
    #: pipeline's :class:`~hintpipe.runtime.loop.reports.StepReport` steps go on counting from there.
    step_count: int


class Checkpointer:
    """A training loop's checkpoints (every rank): :meth:`start` a new run or :meth:`resume` the folder's own,
    then :meth:`after_step` after every step.

    ``pipe``: the :class:`~hintpipe.runtime.pipeline.Pipeline` (its tensors are saved by the model's names, so a
    run resumes under another plan of the same model), or stage modules alone (``<stage>.<name>``).
    ``scheduler`` and ``state`` (anything with ``state_dict`` and ``load_state_dict``: a data position, a
    sampler) are saved with each checkpoint and restored by :meth:`resume`, once for all ranks.
    ``model_description`` (plain JSON values; for a Hugging Face model
    :func:`~hintpipe.runtime.checkpoint.description.hf_description`) is recorded in every checkpoint's manifest,
    so that ``hintpipe export`` rebuilds the model from the checkpoint alone; without it a checkpoint is
    exported by hand (``model.load_state_dict(load_merged(folder))``).

    It saves every ``every`` steps, after the loop's last step and when the loop is stopping, and prunes to
    exactly ``keep`` verified checkpoints of its run right after each save, the newest verified again first
    (see [Note: keeping exactly keep checkpoints] in :mod:`hintpipe.runtime.checkpoint.pruning`). Its files
    are its owner's alone (0600, folders 0700) unless ``group_readable`` (0640, 0750; see [Note: a run folder
    is its owner's] in :mod:`hintpipe.runtime.checkpoint.permissions`). A folder belongs to one run (see
    :mod:`hintpipe.runtime.checkpoint.run_folder`), and one run at a time holds it: rank 0 locks it in
    :meth:`start` or :meth:`resume` unless its launcher holds it already, until :meth:`close` or the process
    ends (see [Note: one run per folder at a time] in :mod:`hintpipe.runtime.checkpoint.folder_lock`).
    """

    def __init__(
        self,
        directory: str | Path,
        pipe: Staged | Mapping[int, nn.Module],
        optimizer: torch.optim.Optimizer | None,
        *,
        every: int = 0,
        keep: int = 2,
        scheduler: Stateful | None = None,
        state: Stateful | None = None,
        hint: str = "",
        group: dist.ProcessGroup | None = None,
        storage_writer: WriterFactory | None = None,
        model_description: Mapping[str, Any] | None = None,
        group_readable: bool = False,
    ) -> None:
        if every < 0 or keep < 1:
            raise ValueError(f"every must be >= 0 and keep >= 1, got every={every}, keep={keep}")
        #: What rebuilds the model, recorded in every manifest (checked here, not at the first save).
        self.model_description = None if model_description is None else checked_description(model_description)
        self.directory = Path(directory)
        self.pipe = None if isinstance(pipe, Mapping) else pipe
        if isinstance(pipe, Mapping):  # stage modules alone: named ``<stage>.<name>``
            self.modules: Mapping[int, nn.Module] = pipe
            self.names = ModelNames()
        else:
            self.modules, self.names, hint = pipe.modules, pipe.names, hint or pipe.hint_name
        self.optimizer = optimizer
        #: Saved with every checkpoint and restored by :meth:`resume`: the LR scheduler, the caller's state.
        given = {"scheduler": scheduler, "state": state}
        self.extra: dict[str, Stateful] = {key: value for key, value in given.items() if value is not None}
        self.every = every
        self.keep = keep
        self.hint = hint
        self.group = group if group is not None else phase_group()  # None: torch's default group
        #: Damaged checkpoints the resume skipped, one line each.
        self.skipped: list[str] = []
        #: The last checkpoint this run saved.
        self.last: Path | None = None
        self.storage_writer = storage_writer
        #: The run the folder's checkpoints belong to (set by :meth:`start` or :meth:`resume`).
        self.run: str | None = None
        #: The checkpoint :meth:`resume` continued from (None: a new run).
        self.resumed: Path | None = None
        self._saved_at = -1
        use_modes(group_readable)
        self._lock = FolderLock(self.directory)

    def _hold(self) -> None:
        """Rank 0: hold the folder for this run (a launcher of ours may hold it already)."""
        launcher = os.environ.get(LAUNCHER_ENV)
        self._lock.acquire(ours=int(launcher) if launcher else None)
        check_layout(self.directory)

    def close(self) -> None:
        """Give the folder back (rank 0; the process's end does it too). Call when the run is over."""
        self._lock.release()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, *, replace: bool = False) -> int:
        """Start a new run in the folder; returns 0 (the step to start from).

        Raises:
            CheckpointError: on every rank, when the folder holds another run's checkpoints and ``replace`` is
                False (``replace`` deletes them).
        """

        def claimed_here() -> str | None:
            if not self._rank0:
                return None
            self._hold()
            return claim(self.directory, replace=replace)

        claimed = together(
            claimed_here,
            f"starting a run in {self.directory}",
            group=self.group,
            error=CheckpointError,
        )
        self.run = claimed[0]
        return 0

    def resume(self) -> int:
        """Continue the folder's own run from its newest verified checkpoint; returns the step to continue
        from (the pipeline's ``step_count`` is set to it, so its step reports count on from there). A folder with
        no checkpoint starts a new run there (0), saying so in :attr:`skipped`."""

        def owner_here() -> str | None:
            if not self._rank0:
                return None
            self._hold()
            owner = read_run(self.directory)
            return adopt(self.directory) if owner == "" else owner  # run.json lost: its checkpoints' run

        owner = together(
            owner_here,
            f"resuming from {self.directory}",
            group=self.group,
            error=CheckpointError,
        )[0]
        if owner is None or not step_folders(self.directory):
            self.start(replace=True)  # nothing to lose: a run.json without checkpoints
            self.skipped = [f"{self.directory} holds no checkpoint to resume: a new run starts there"]
            return 0
        self.run = owner
        step, self.skipped, self.resumed = resume(
            self.directory,
            self.modules,
            self.optimizer,
            hint=self.hint,
            group=self.group,
            run=owner,
            names=self.names,
            extra=self.extra,
        )
        if self.pipe is not None:
            self.pipe.step_count = step
        return step

    @property
    def _rank0(self) -> bool:
        return dist.get_rank(self.group) == 0

    def after_step(self, done: int, *, stopping: bool = False, last: bool = False) -> Path | None:
        """Call when step ``done - 1`` has completed (``done`` steps done; ``last``: the loop's last step);
        returns the checkpoint it saved."""
        if self.run is None:
            raise RuntimeError("call start() or resume() before after_step(): a checkpoint belongs to a run")
        due = stopping or last or (self.every and done % self.every == 0)
        if not due or done == self._saved_at:
            return None
        run = self.run
        foreign = together(
            lambda: foreign_owner(self.directory, done, run) if self._rank0 else None,
            f"saving checkpoint step {done} in {self.directory}",
            group=self.group,
            error=CheckpointError,
        )[0]
        if foreign is not None:  # another run's folder of this step: kept, and this step is not saved
            note = (
                f"step {done} was not saved: {self.directory / step_name(done)} belongs to another run "
                f"({foreign}) and is kept; move it elsewhere to save this run's checkpoints at that step"
            )
            log.warning("%s", note)
            self.skipped.append(note)
            return None
        self.last = save_checkpoint(
            self.directory,
            self.modules,
            self.optimizer,
            done,
            hint=self.hint,
            group=self.group,
            storage_writer=self.storage_writer,
            run=self.run,
            names=self.names,
            extra=self.extra,
            model_description=self.model_description,
        )
        self._saved_at = done
        if self._rank0:  # published: the newest verified again, then exactly ``keep`` kept
            prune_checkpoints(self.directory, self.keep, run=self.run)
        return self.last
