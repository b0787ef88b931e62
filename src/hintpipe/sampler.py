"""Which samples of a dataset each data-parallel replica trains on, step by step, micro-batch by micro-batch.

A pipeline step takes ``microbatches`` micro-batches on every replica; the
global batch of a step is replicas x micro-batches x micro-batch size
samples. :class:`ReplicaSampler` deals an epoch out that way: the
permutation and each replica's share are torch's own
:class:`~torch.utils.data.DistributedSampler`'s (seeded by ``seed + epoch``,
every replica the same length, no sample twice), cut into steps of
micro-batches. Every replica computes the same permutation on its own, so
nothing is exchanged, and a step's indices can be asked for by number, which
is all a resumed run needs (its step count says the epoch and the step).

The samples left over once an epoch holds no further whole step (fewer than
a global batch) are not trained in that epoch; shuffled, they are other
samples each epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

from torch.utils.data import Dataset, DistributedSampler


class _Indices(Dataset[int]):
    """``size`` samples by index: all DistributedSampler reads of a dataset is its length."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


class ReplicaSampler:
    """One replica's steps of an epoch: per step, ``microbatches`` lists of ``microbatch_size`` dataset indices.

    Args:
        dataset: the dataset (anything with a length) or its number of samples.
        microbatches: micro-batches per step (the pipeline's).
        microbatch_size: samples per micro-batch.
        replicas: data-parallel replicas (``pipe.layout.dp``).
        replica: this rank's replica (``pipe.layout.replica_of(rank)``); the ranks of one pipeline and the
            tensor-parallel members of a stage share it, and so get the same samples.
        shuffle: a new permutation each epoch (:meth:`set_epoch`); without it, the dataset's order.
        seed: the permutation's seed, the same on every rank.

    Raises:
        ValueError: for a count below one, a replica outside ``0..replicas - 1``, or a dataset smaller than one
            step's global batch.
    """

    def __init__(
        self,
        dataset: Sized | int,
        *,
        microbatches: int,
        microbatch_size: int,
        replicas: int = 1,
        replica: int = 0,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        size = dataset if isinstance(dataset, int) else len(dataset)
        for name, value in (("microbatches", microbatches), ("microbatch_size", microbatch_size)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if replicas < 1 or not 0 <= replica < replicas:
            raise ValueError(f"replica {replica} does not exist: there are replicas 0..{replicas - 1}")
        per_step = replicas * microbatches * microbatch_size
        if size < per_step:
            raise ValueError(
                f"the dataset has {size} samples, fewer than one step's {per_step} (replicas {replicas} x "
                f"microbatches {microbatches} x microbatch_size {microbatch_size}): use fewer or smaller micro-batches"
            )
        self.size = size
        self.microbatches = microbatches
        self.microbatch_size = microbatch_size
        self._share: DistributedSampler[int] = DistributedSampler(
            _Indices(size), num_replicas=replicas, rank=replica, shuffle=shuffle, seed=seed, drop_last=True
        )
        self._indices: list[int] | None = None

    @property
    def epoch(self) -> int:
        return int(self._share.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Deal epoch ``epoch``'s permutation (call on every rank, with the same epoch, before its steps)."""
        self._share.set_epoch(epoch)
        self._indices = None

    def __len__(self) -> int:
        """Steps per epoch."""
        return len(self._share) // (self.microbatches * self.microbatch_size)

    def step(self, index: int) -> list[list[int]]:
        """Step ``index`` of the current epoch: this replica's micro-batches, each a list of dataset indices.

        Raises:
            IndexError: for a step outside the epoch.
        """
        if not 0 <= index < len(self):
            raise IndexError(f"step {index} is outside the epoch's steps 0..{len(self) - 1}")
        if self._indices is None:
            self._indices = list(self._share)
        size = self.microbatch_size
        first = index * self.microbatches * size
        return [self._indices[first + m * size : first + (m + 1) * size] for m in range(self.microbatches)]

    def __iter__(self) -> Iterator[list[list[int]]]:
        """The epoch's steps in order."""
        for index in range(len(self)):
            yield self.step(index)
