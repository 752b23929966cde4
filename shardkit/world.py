"""Where this process sits: distributed rank and DataLoader worker.

:class:`World` is the one object the reader consults for rank and worker
math, and this module is the only place shardkit touches
``torch.distributed``. The epoch split treats the ``world_size *
num_workers`` (rank, worker) pairs as *slots*, numbered rank-major so that a
rank's workers hold neighbouring slots.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from shardkit.errors import UsageError


@dataclass(frozen=True)
class World:
    """A (rank, worker) position among ``world_size * num_workers`` slots.

    Attributes:
        rank: Distributed rank, ``0 <= rank < world_size``.
        world_size: Number of distributed ranks.
        worker: DataLoader worker id within the rank (0 in the main process).
        num_workers: DataLoader workers per rank (1 when loading in-process).
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is not within world_size {self.world_size}")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise UsageError(f"worker {self.worker} is not within num_workers {self.num_workers}")

    @property
    def num_slots(self) -> int:
        """All (rank, worker) slots: ``world_size * num_workers``."""
        return self.world_size * self.num_workers

    @property
    def slot(self) -> int:
        """This slot's number, rank-major: ``rank * num_workers + worker``."""
        return self.rank * self.num_workers + self.worker

    def replicated(self, replication: int) -> World:
        """The group this rank belongs to when every ``replication``
        consecutive ranks form one group that reads as one rank (the ranks
        of a tensor- or sequence-parallel group): rank ``rank //
        replication`` of ``world_size // replication``.

        Raises:
            UsageError: ``replication`` is not an int >= 1, or does not
                divide ``world_size``.
        """
        if isinstance(replication, bool) or not isinstance(replication, int) or replication < 1:
            raise UsageError(f"replication must be an int >= 1 (ranks per group that see the same data), not {replication!r}")
        if self.world_size % replication:
            raise UsageError(
                f"replication={replication} does not divide world_size {self.world_size}: the ranks form groups of "
                f"{replication} consecutive ranks that read the same samples, so world_size must be a multiple of "
                "it (pass the size of your tensor- or sequence-parallel group)"
            )
        return replace(self, rank=self.rank // replication, world_size=self.world_size // replication)

    def with_worker(self, worker: int, num_workers: int) -> World:
        """The same rank seen from DataLoader worker ``worker`` of ``num_workers``."""
        return replace(self, worker=worker, num_workers=num_workers)


def detect_rank(*, rank: int | None = None, world_size: int | None = None, replication: int = 1) -> World:
    """Find this process's rank and world size, as the reader splits by them.

    Explicit arguments win; then an initialized ``torch.distributed`` process
    group; then the ``RANK`` / ``WORLD_SIZE`` environment that ``torchrun``
    sets; else a single process.

    Args:
        rank: Rank to use, or None to detect it.
        world_size: World size to use, or None to detect it.
        replication: Consecutive ranks that read as one (see
            :meth:`World.replicated`): the result is then their group's
            number among the groups.

    Returns:
        A World with worker 0 of 1 (see :func:`detect_worker`).

    Raises:
        UsageError: Only one of ``rank`` / ``world_size`` was given, they
            are inconsistent, or ``replication`` does not divide the world.
    """
    if (rank is None) != (world_size is None):
        raise UsageError("pass both rank= and world_size=, or neither to detect them")
    if rank is None or world_size is None:
        rank, world_size = 0, 1
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is a dependency
            dist = None  # type: ignore[assignment]
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        elif "WORLD_SIZE" in os.environ:
            rank = int(os.environ.get("RANK", "0"))
            world_size = int(os.environ["WORLD_SIZE"])
    world = World(rank=rank, world_size=world_size)
    return world.replicated(replication)


def detect_worker(world: World) -> World:
    """``world`` refined with the current DataLoader worker, if in one."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None:
        return world.with_worker(0, 1)
    return world.with_worker(info.id, info.num_workers)


def all_gather_objects(obj: object) -> list[object]:
    """``obj`` from every rank, in rank order (``[obj]`` when not distributed).

    A collective under ``torch.distributed``: every rank must call it.
    """
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return [obj]
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
