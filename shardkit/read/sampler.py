"""A sampler for :class:`~shardkit.IndexedDataset` that keeps reads local.

Uniform random indices make every read land in a different shard: fine on
a local SSD, slow against an object store (a request per sample, no reuse of
cached shards) or a spinning disk. :class:`ShardWindowSampler` gives up a
little randomness for locality, the way webdataset's ``wids`` chunked sampler
does. Each epoch:

1. the shards are permuted (the same order :class:`~shardkit.ShardDataset`
   uses for that seed and epoch);
2. consecutive runs of ``window_shards`` shards form windows;
3. within a window every sample is drawn in a uniformly random order, then
   the next window follows.

So at any time a reader touches at most ``window_shards`` shards (plus one at
a rank's edges), and a shard cache holds few shards at once, while a batch
still mixes samples of several shards.

Over ``world_size`` ranks the epoch's sequence is cut into one contiguous
block per rank, so ranks read different shards. As with
:class:`torch.utils.data.DistributedSampler`, with ``drop_last=False`` the
sequence is padded to a multiple of ``world_size`` by repeating its start,
with ``drop_last=True`` its tail is dropped; every rank gets the same count.

The arithmetic is in pure functions of ``(counts, window_shards, seed,
epoch, rank, world_size)`` that hold one window of indices at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from shardkit.errors import UsageError
from shardkit.read.split import WINDOW_SHUFFLE_DOMAIN, seed_sequence, shard_permutation
from shardkit.world import detect_rank

__all__ = [
    "ShardWindowSampler",
    "epoch_window_sequence",
    "rank_window_indices",
    "samples_per_rank_padded",
    "window_indices",
]



def _starts(counts: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts


def _as_counts(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    array = np.asarray(counts, dtype=np.int64).reshape(-1)
    if array.size and array.min() < 0:
        raise UsageError("per-shard sample counts must be >= 0")
    return array


def window_indices(
    counts: Sequence[int] | np.ndarray,
    window: int,
    *,
    window_shards: int,
    seed: int,
    epoch: int,
    order: np.ndarray | None = None,
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """The global sample indices of one window, in their drawn order.

    Args:
        counts: Samples per shard, in manifest order.
        window: Window number in the epoch.
        window_shards: Shards per window.
        seed: Seed of all randomness.
        epoch: The epoch.
        order: The epoch's shard order, if already computed.
        starts: Cumulative counts (``num_shards + 1`` entries, from 0), if
            already computed.

    Returns:
        An int64 array: the samples of the window's shards, uniformly permuted.
    """
    counts = _as_counts(counts)
    if order is None:
        order = shard_permutation(len(counts), seed=seed, epoch=epoch)
    if starts is None:
        starts = _starts(counts)
    shards = order[window * window_shards : (window + 1) * window_shards]
    ranges = [np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in shards]
    members = np.concatenate(ranges) if ranges else np.empty(0, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(seed_sequence(seed, epoch, WINDOW_SHUFFLE_DOMAIN, window)))
    return rng.permutation(members)


def epoch_window_sequence(
    counts: Sequence[int] | np.ndarray, *, window_shards: int, seed: int, epoch: int
) -> np.ndarray:
    """The whole epoch's sequence of global sample indices (all windows)."""
    counts = _as_counts(counts)
    order = shard_permutation(len(counts), seed=seed, epoch=epoch)
    num_windows = -(-len(counts) // window_shards)
    starts = _starts(counts)
    parts = [
        window_indices(counts, w, window_shards=window_shards, seed=seed, epoch=epoch, order=order, starts=starts)
        for w in range(num_windows)
    ]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def samples_per_rank_padded(num_samples: int, *, world_size: int, drop_last: bool) -> int:
    """Samples each rank gets: ``floor`` with ``drop_last``, else ``ceil`` of
    ``num_samples / world_size`` (as :class:`DistributedSampler`)."""
    if drop_last:
        return num_samples // world_size
    return -(-num_samples // world_size)


def rank_window_indices(
    counts: Sequence[int] | np.ndarray,
    *,
    window_shards: int,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    drop_last: bool = False,
) -> Iterator[np.ndarray]:
    """Yield one rank's share of the epoch's sequence, window by window.

    The rank's share is the contiguous block ``[rank * per, (rank + 1) * per)``
    of the epoch's sequence, padded by wrapping around to its start when
    ``drop_last`` is False (see :func:`samples_per_rank_padded` for ``per``).
    Only one window's indices are held at a time.

    Raises:
        UsageError: Invalid window size, rank or world size.
    """
    if window_shards < 1:
        raise UsageError(f"window_shards must be >= 1, not {window_shards}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
    counts = _as_counts(counts)
    total = int(counts.sum())
    per = samples_per_rank_padded(total, world_size=world_size, drop_last=drop_last)
    if per == 0:
        return
    order = shard_permutation(len(counts), seed=seed, epoch=epoch)
    window_sizes = np.add.reduceat(counts[order], np.arange(0, len(counts), window_shards)) if len(counts) else counts
    window_starts = _starts(window_sizes)
    starts = _starts(counts)
    cache: dict[int, np.ndarray] = {}

    def window(w: int) -> np.ndarray:
        if w not in cache:
            cache.clear()
            cache[w] = window_indices(
                counts, w, window_shards=window_shards, seed=seed, epoch=epoch, order=order, starts=starts
            )
        return cache[w]

    pos, stop = rank * per, (rank + 1) * per
    while pos < stop:
        # A stretch that does not wrap around the end of the sequence.
        base = pos // total * total
        lo, hi = pos - base, min(stop, base + total) - base
        w = int(np.searchsorted(window_starts, lo, side="right")) - 1
        while lo < hi:
            w_start, w_end = int(window_starts[w]), int(window_starts[w + 1])
            take = min(hi, w_end) - lo
            if take > 0:
                yield window(w)[lo - w_start : lo - w_start + take]
                lo += take
            w += 1
        pos = base + hi


class ShardWindowSampler(Sampler[int]):
    """Shuffle shards, then samples within a window of a few shards at a time.

    See the module docstring for the order. Over all ranks an epoch holds
    every index exactly once, plus repeats of the first few that pad it to a
    multiple of ``world_size`` (``drop_last=False``), or less its last few
    (fewer than ``world_size``, with ``drop_last=True``); every rank gets
    :func:`len` indices. The order is a pure function of
    ``(seed, epoch, rank, world_size)``, so ``StatefulDataLoader`` resumes it
    by fast-forwarding.

    Example::

        ds = shardkit.IndexedDataset("s3://bucket/train/", source_options=SourceOptions(cache_dir="/tmp/c"))
        sampler = shardkit.ShardWindowSampler(ds, window_shards=4, seed=0)
        loader = DataLoader(ds, sampler=sampler, batch_size=256, num_workers=8)
        for epoch in range(num_epochs):
            sampler.set_epoch(epoch)
            ...

    Args:
        dataset_or_counts: An :class:`~shardkit.IndexedDataset` (its
            ``shard_counts``) or the samples per shard in manifest order.
        window_shards: Shards read side by side; larger mixes better and
            touches more shards at once.
        seed: Seed of the shard order and the window shuffles; >= 0.
        rank: This process's rank; detected like :class:`~shardkit.ShardDataset`'s
            (``torch.distributed``, then ``RANK``, else 0).
        world_size: Number of ranks, detected like ``rank``.
        replication: Consecutive ranks that draw the same indices (a tensor-
            or sequence-parallel group); the ``world_size / replication``
            groups split the epoch as ranks do. Must divide ``world_size``.
        drop_last: Drop the tail so all ranks get ``floor(n / world_size)``
            indices, instead of padding them to ``ceil`` by repetition.
        epoch: Starting epoch (see :meth:`set_epoch`).

    Raises:
        UsageError: Invalid options.
    """

    def __init__(
        self,
        dataset_or_counts: object,
        *,
        window_shards: int = 4,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        replication: int = 1,
        drop_last: bool = False,
        epoch: int = 0,
    ):
        counts = getattr(dataset_or_counts, "shard_counts", dataset_or_counts)
        self.counts = _as_counts(counts)  # type: ignore[arg-type]
        if window_shards < 1:
            raise UsageError(f"window_shards must be >= 1, not {window_shards}")
        if seed < 0 or epoch < 0:
            raise UsageError(f"seed and epoch must be >= 0 (got seed={seed}, epoch={epoch})")
        world = detect_rank(rank=rank, world_size=world_size, replication=replication)
        if not 0 <= world.rank < world.world_size:
            raise UsageError(f"rank must be in [0, world_size), got rank={world.rank} world_size={world.world_size}")
        self.window_shards = window_shards
        self.seed = seed
        self.rank = world.rank
        self.world_size = world.world_size
        self.drop_last = drop_last
        self.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order on the next iteration."""
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, not {epoch}")
        self.epoch = epoch

    def __len__(self) -> int:
        return samples_per_rank_padded(int(self.counts.sum()), world_size=self.world_size, drop_last=self.drop_last)

    def __iter__(self) -> Iterator[int]:
        for chunk in rank_window_indices(
            self.counts,
            window_shards=self.window_shards,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
        ):
            yield from chunk.tolist()
