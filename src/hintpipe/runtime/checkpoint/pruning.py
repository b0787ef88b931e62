"""Old checkpoints go, ``keep`` stay: exactly, but for one a reader holds.

[Note: keeping exactly keep checkpoints]
A run pruned one step after each save, so that a step had run past the newest checkpoint first; the last
save was never pruned after, and ``--checkpoint-keep 3`` left 4 step folders. Now the run prunes right after
each save, once its checkpoint is published, and the newest is verified again first (every file read back
and hashed): a run keeps ``keep`` checkpoints at the end of every save, the last one's included. During a
save there are ``keep`` finished ones and the one being written (never fewer than ``keep`` whole ones); a
checkpoint that a reader holds (``hintpipe export``, see [Note: a reader's hold on a checkpoint] in
:mod:`hintpipe.runtime.checkpoint.readers`) is kept one save longer, so there is one more only while it is
read.

This module is torch-free.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hintpipe.runtime.checkpoint.manifest import Manifest, step_folders
from hintpipe.runtime.checkpoint.readers import remove_unread
from hintpipe.runtime.errors import DamagedCheckpoint

log = logging.getLogger(__name__)


def prune_checkpoints(directory: str | Path, keep: int = 2, run: str | None = None) -> list[Path]:
    """Keep the ``keep`` newest checkpoints that verify; remove older ones and damaged ones older than the
    newest that verifies, except one a reader holds (``hintpipe export``: a later call removes it). Returns
    what was removed.

    Call on rank 0, once the newest checkpoint is published: it is verified again here (read back from
    disk) before anything older goes, and nothing is removed while it is damaged: the older ones are then
    all there is. With ``run``, only that run's checkpoints are looked at (a
    folder's run owns every checkpoint in it; see :mod:`hintpipe.runtime.checkpoint.run_folder`).
    """
    folders = step_folders(Path(directory))
    kept: list[Path] = []
    removed: list[Path] = []
    for folder in folders:
        try:
            manifest = Manifest.read(folder)
            manifest.verify(folder)
        except DamagedCheckpoint as exc:
            if not kept:
                log.warning("keeping every older checkpoint: %s", exc)
                return []
            removed.append(folder)
            continue
        if run is not None and manifest.identity.run != run:
            continue  # another run's: never touched
        (kept if len(kept) < max(keep, 1) else removed).append(folder)
    gone = []
    for old in removed:
        if remove_unread(old):
            gone.append(old)
        else:  # see [Note: a reader's hold on a checkpoint] in hintpipe.runtime.checkpoint.readers
            log.info("%s is being read: kept until a later save prunes it", old)
    return gone
