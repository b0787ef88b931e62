"""Checkpoints and the phases around them: saving and resuming verified checkpoints, their manifests,
collective phases whose failures reach every rank, and stopping on a signal.

Modules: :mod:`~hintpipe.runtime.checkpoint.saving` (save, find, resume, prune, merge),
:mod:`~hintpipe.runtime.checkpoint.checkpointer` (:class:`Checkpointer`, a training loop's checkpoints),
:mod:`~hintpipe.runtime.checkpoint.manifest` (what a checkpoint belongs to; torch-free),
:mod:`~hintpipe.runtime.checkpoint.description` (what rebuilds the model a checkpoint holds; torch-free),
:mod:`~hintpipe.runtime.checkpoint.collective` and :mod:`~hintpipe.runtime.checkpoint.stopping`;
:mod:`~hintpipe.runtime.checkpoint.links` (no link in a run folder followed) and
:mod:`~hintpipe.runtime.checkpoint.readers` (a checkpoint being read is not pruned),
:mod:`~hintpipe.runtime.checkpoint.pruning` (exactly ``keep`` kept), :mod:`~hintpipe.runtime.checkpoint.permissions`
(a run folder is its owner's) and :mod:`~hintpipe.runtime.checkpoint.disk` (a full disk named), all torch-free;
:mod:`~hintpipe.runtime.checkpoint.files` (a checkpoint's files as torch.distributed.checkpoint opens them).
Importing this package imports no torch; its modules do.
"""
