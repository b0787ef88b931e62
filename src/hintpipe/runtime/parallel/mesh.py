"""Where a rank sits in data x pipeline x tensor parallelism.

A :class:`~torch.distributed.device_mesh.DeviceMesh` with named dimensions
``("dp", "pp", "tp")`` (any subset, any order) lays the world out; hintpipe
reads it as :class:`Layout`: every *pipeline* (the ranks along ``pp`` at one
``(dp, tp)`` coordinate, in stage order) and every *replica group* (the ranks
along ``dp`` at one ``(pp, tp)`` coordinate: they hold the same stages and
average their gradients). Without a mesh the whole world is one pipeline.

A rank's *position* is its place in its pipeline: what the hint calls its
rank. Everything the runtime does inside one pipeline (messages, the
per-step agreement, reports) is addressed by position, on process groups
whose ranks are the pipeline's, so two pipelines never share a message or a
collective.

torchtitan's names are read too: ``dp_replicate`` and ``dp_shard`` (HSDP:
replicas of shards) together are the data-parallel axis, flattened with
``dp_replicate`` outer, as torchtitan flattens them into its ``dp``; FSDP2
then shards over :func:`dp_mesh`, the 2-D ``(dp_replicate, dp_shard)`` mesh.
Context parallelism (``cp``) has no place in a pipeline's stages yet and is
refused.

Process groups are created collectively: every rank builds the same
:class:`Layout` and creates every pipeline's groups, in the same order
(``new_subgroups_by_enumeration``).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hintpipe.renamed import retired_attribute

AXES = ("dp", "pp", "tp")
#: torchtitan's data-parallel dimensions, outer first: replicas of FSDP2 shards (HSDP).
DP_AXES = ("dp_replicate", "dp_shard")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every pipeline and replica group of the world, as global ranks (the same on every rank)."""

    pipelines: tuple[tuple[int, ...], ...]  # each (dp, tp) coordinate's ranks along pp, in stage order
    replicas: tuple[tuple[int, ...], ...]  # each (pp, tp) coordinate's ranks along dp
    tensors: tuple[tuple[int, ...], ...] = ()  # each (dp, pp) coordinate's ranks along tp (leader first)
    dp: int = 1
    tp: int = 1

    @classmethod
    def world(cls, size: int) -> Layout:
        """The whole world as one pipeline (no mesh)."""
        singles = tuple((r,) for r in range(size))
        return cls(pipelines=(tuple(range(size)),), replicas=singles, tensors=singles)

    @classmethod
    def of(cls, mesh: DeviceMesh) -> Layout:
        """Read a mesh whose dimensions are named from ``dp``, ``pp`` and ``tp``, or torchtitan's
        ``dp_replicate`` and ``dp_shard`` in place of ``dp``.

        Raises:
            ValueError: for other dimension names, ``dp`` beside ``dp_replicate``/``dp_shard``, or ranks that
                do not increase along ``pp``.
        """
        names = tuple(mesh.mesh_dim_names or ())
        known = (*DP_AXES, *AXES)
        if len(names) != mesh.ndim or len(set(names)) != len(names) or not set(names) <= set(known):
            raise ValueError(
                f"the mesh's dimensions must be named from {AXES} or torchtitan's {DP_AXES} in place of dp (each "
                f"once), got {names or 'no names'}"
            )
        if "dp" in names and set(DP_AXES) & set(names):
            raise ValueError(f"the mesh names dp and {[n for n in names if n in DP_AXES]}: give one data-parallel axis")
        grid = mesh.mesh
        for axis in known:  # missing dimensions have size 1
            if axis not in names:
                grid = grid.unsqueeze(-1)
                names = (*names, axis)
        grid = grid.permute(*[names.index(a) for a in known])  # dp_replicate, dp_shard, dp, pp, tp
        grid = grid.reshape(-1, *grid.shape[3:])  # one data-parallel axis, replicate outer (torchtitan's flatten)
        dp, pp, tp = grid.shape
        pipelines = tuple(tuple(int(r) for r in grid[d, :, t]) for d, t in itertools.product(range(dp), range(tp)))
        for ranks in pipelines:
            if list(ranks) != sorted(ranks):
                raise ValueError(f"a pipeline's ranks must increase along the mesh's pp dimension, got {list(ranks)}")
        replicas = tuple(tuple(int(r) for r in grid[:, p, t]) for p, t in itertools.product(range(pp), range(tp)))
        tensors = tuple(tuple(int(r) for r in grid[d, p, :]) for d, p in itertools.product(range(dp), range(pp)))
        return cls(pipelines=pipelines, replicas=replicas, tensors=tensors, dp=int(dp), tp=int(tp))

    @property
    def pp(self) -> int:
        """Ranks per pipeline (the mesh's ``pp``, beside :attr:`dp` and :attr:`tp`)."""
        return len(self.pipelines[0])

    @property
    def stages_ranks(self) -> int:
        """Deprecated: :attr:`pp` (its name before 0.7)."""
        retired_attribute("Layout.stages_ranks", "Layout.pp")
        return self.pp

    def pipeline_of(self, rank: int) -> tuple[int, ...]:
        return next(p for p in self.pipelines if rank in p)

    def position_of(self, rank: int) -> int:
        """The rank's place in its pipeline (the hint's rank)."""
        return self.pipeline_of(rank).index(rank)

    def replica_group_of(self, rank: int) -> tuple[int, ...]:
        return next(r for r in self.replicas if rank in r)

    def tensor_group_of(self, rank: int) -> tuple[int, ...]:
        return next(g for g in self.tensors if rank in g)

    def replica_of(self, rank: int) -> int:
        """Which data-parallel replica the rank belongs to (its ``dp`` coordinate)."""
        return self.replica_group_of(rank).index(rank)

    def groups(self, lists: Sequence[Sequence[int]], timeout: float | None = None) -> dist.ProcessGroup | None:
        """One gloo group per list (call on every rank, same order); returns this rank's, or None if none holds
        it."""
        rank = dist.get_rank()
        wanted = [list(ranks) for ranks in lists]
        span = None if timeout is None else datetime.timedelta(seconds=timeout)
        mine, _ = dist.new_subgroups_by_enumeration(wanted, timeout=span, backend="gloo")  # type: ignore[no-untyped-call]
        return mine if any(rank in ranks for ranks in wanted) else None


def dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards a stage over: ``mesh["dp"]``, or for torchtitan's names the 2-D
    ``(dp_replicate, dp_shard)`` mesh (``fully_shard`` then replicates across the first and shards within the
    second: HSDP), or the one of them the mesh has.

    Raises:
        ValueError: if the mesh has no data-parallel dimension.
    """
    names = tuple(mesh.mesh_dim_names or ())
    if "dp" in names:
        return mesh["dp"]
    present = tuple(axis for axis in DP_AXES if axis in names)
    if not present:
        raise ValueError(f"the mesh has no data-parallel dimension (dp, or {' and '.join(DP_AXES)}), got {names}")
    return mesh[present[0]] if len(present) == 1 else mesh[present]


def build_mesh(world: int, *, dp: int = 1, tp: int = 1, device: str | torch.device = "cpu") -> DeviceMesh:
    """A mesh ``(dp, pp, tp)`` over ``world`` ranks, ``pp = world / (dp * tp)`` (dimensions of size one left
    out), of the ranks' ``device`` type: FSDP2 and tensor parallelism put a stage's parameters on the mesh's
    device, so a mesh on CUDA would move a CPU run's stages to the GPU.

    Raises:
        ValueError: if ``dp * tp`` does not divide the world.
    """
    if dp < 1 or tp < 1 or world % (dp * tp):
        raise ValueError(f"dp x tp = {dp} x {tp} must divide the {world} ranks")
    shape = {"dp": dp, "pp": world // (dp * tp), "tp": tp}
    kept = [a for a in AXES if shape[a] > 1 or a == "pp"]
    kind = torch.device(device).type
    return init_device_mesh(kind, tuple(shape[a] for a in kept), mesh_dim_names=tuple(kept))
