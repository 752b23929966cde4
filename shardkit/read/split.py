"""Epoch order and the rank x worker split, as pure functions.

Everything here is a function of (sample counts, seed, epoch, world), so
every rank computes the same plan without talking to the others, and the
plan can be tested without starting any process.

The epoch's *global sequence* is the samples of all shards, shards taken in
the epoch's permuted order, each shard's samples in stored order. Each
(rank, worker) slot gets one contiguous range of positions in it:

* the sequence is first cut into one range per rank (how depends on the mode),
* each rank's range is then cut evenly among its DataLoader workers.

A range maps to a few :class:`Piece` s (a shard and a run of its samples), so
a slot may start or stop inside a shard and the reader seeks there with the
offset index. Memory is O(number of shards), never O(number of samples).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

# numpy loads numpy.random on first use. It is loaded here, in the process
# that makes a dataset: torch seeds it in every DataLoader worker it starts,
# and each forked worker would otherwise import it once more (about 7 ms of
# CPU each, spent while its siblings are still starting).
import numpy.random  # noqa: F401

from shardkit.errors import UsageError
from shardkit.world import World

Mode = Literal["exact", "balanced", "infinite"]
MODES: tuple[str, ...] = ("exact", "balanced", "infinite")

# Seed domains: the word after (seed, epoch) that keeps the random number
# generators drawn from one seed apart. Every domain lives here.
#: The epoch's shard order (:func:`shard_permutation`); words (seed, epoch, 0).
SHARD_ORDER_DOMAIN = 0
#: A slot's shuffle buffer (:meth:`~shardkit.read.plan.ReadPlan.shuffle_buffer`);
#: words (seed, epoch, 1, rank, worker, *stream seed word).
SAMPLE_SHUFFLE_DOMAIN = 1
#: A mixture stream's walk order (:class:`~shardkit.read.schedule.WalkLayout`);
#: words (seed, pass, 2, stream seed word).
WALK_ORDER_DOMAIN = 2
#: :class:`~shardkit.ShardWindowSampler`'s shuffle within a window; words
#: (seed, epoch, 2, window). It shares the value 2 with the walk because both
#: orders shipped before the domains had one home, and users' runs depend on
#: them; changing either would change the samples those runs see. The two
#: generators serve different readers (a mixture of ``ShardDataset`` and the
#: sampler of ``IndexedDataset``), and no reader draws from both, so equal
#: words (a stream seed word equal to a window number) would make two
#: unrelated orders alike, never repeat or drop a sample. New domains take 3
#: and up.
WINDOW_SHUFFLE_DOMAIN = 2


def seed_sequence(seed: int, epoch: int, *more: int) -> np.random.SeedSequence:
    """The numpy seed for a stream identified by ``(seed, epoch, *more)``.

    Raises:
        UsageError: A negative seed or epoch.
    """
    if seed < 0 or epoch < 0:
        raise UsageError(f"seed and epoch must be >= 0 (got seed={seed}, epoch={epoch})")
    return np.random.SeedSequence([seed, epoch, *more])


def shard_permutation(num_shards: int, *, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard order: a permutation of ``range(num_shards)``.

    A pure function of ``(seed, epoch)``: identical on every rank and run.
    """
    rng = np.random.Generator(np.random.PCG64(seed_sequence(seed, epoch, SHARD_ORDER_DOMAIN)))
    return rng.permutation(num_shards).astype(np.int64)


def epoch_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Shard order for an epoch: permuted when ``shuffle``, else stored order."""
    if shuffle:
        return shard_permutation(num_shards, seed=seed, epoch=epoch)
    return np.arange(num_shards, dtype=np.int64)


def even_cut(length: int, parts: int, index: int) -> tuple[int, int]:
    """Range ``index`` of ``parts`` near-equal contiguous ranges of ``range(length)``.

    Sizes differ by at most one; the first ``length % parts`` ranges are the
    longer ones.
    """
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def rank_span(num_samples: int, *, rank: int, world_size: int, mode: Mode, pad: bool = False) -> tuple[int, int]:
    """Positions ``[start, stop)`` of the global sequence that ``rank`` reads.

    * ``exact`` and ``infinite``: near-equal ranges covering every position
      once (per-rank sizes differ by at most one).
    * ``balanced``: ``num_samples // world_size`` positions per rank, the
      remainder (fewer than ``world_size`` samples) dropped; with ``pad``,
      ``ceil(num_samples / world_size)`` per rank, where positions past the
      end wrap around to the start of the sequence (repeating samples).
    """
    if mode == "balanced":
        per_rank = -(-num_samples // world_size) if pad else num_samples // world_size
        return rank * per_rank, (rank + 1) * per_rank
    if mode in ("exact", "infinite"):
        return even_cut(num_samples, world_size, rank)
    raise UsageError(f"mode must be one of {MODES}, not {mode!r}")


def slot_span(num_samples: int, world: World, *, mode: Mode, pad: bool = False) -> tuple[int, int]:
    """Positions ``[start, stop)`` that one (rank, worker) slot reads."""
    start, stop = rank_span(num_samples, rank=world.rank, world_size=world.world_size, mode=mode, pad=pad)
    lo, hi = even_cut(stop - start, world.num_workers, world.worker)
    return start + lo, start + hi


def part_span(
    length: int, world: World, *, mode: Mode, pad: bool = False, part: int = 0, num_parts: int = 1
) -> tuple[int, int]:
    """Positions ``[start, stop)`` that read part ``part`` of ``num_parts``
    of one slot covers: the slot's span cut into near-equal contiguous parts."""
    start, stop = slot_span(length, world, mode=mode, pad=pad)
    lo, hi = even_cut(stop - start, num_parts, part)
    return start + lo, start + hi


def samples_per_rank(num_samples: int, *, rank: int, world_size: int, mode: Mode, pad: bool = False) -> int:
    """How many samples ``rank`` reads in one epoch."""
    start, stop = rank_span(num_samples, rank=rank, world_size=world_size, mode=mode, pad=pad)
    return stop - start


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of samples ``[start, stop)`` of one shard.

    Attributes:
        shard: Shard number in the dataset (manifest order).
        start: First sample number within the shard.
        stop: One past the last sample number within the shard.
    """

    shard: int
    start: int
    stop: int

    @property
    def num_samples(self) -> int:
        return self.stop - self.start


def iter_pieces(counts: Sequence[int] | np.ndarray, order: np.ndarray, start: int, stop: int) -> Iterator[Piece]:
    """Map positions ``[start, stop)`` of a global sequence to pieces.

    Args:
        counts: Samples per shard, in manifest order.
        order: Shard order of the sequence (a permutation of shard numbers).
        start: First position.
        stop: One past the last position; positions at or past the total
            wrap around to the start (used for padding).

    Yields:
        Pieces in sequence order; empty shards never appear.
    """
    if stop <= start:
        return
    ordered = np.asarray(counts, dtype=np.int64)[order]
    ends = np.cumsum(ordered)
    total = int(ends[-1]) if len(ends) else 0
    if total == 0:
        raise UsageError("cannot read samples from a dataset with no samples")
    if start // total == (stop - 1) // total:
        # No wrap: keep only the shards the positions cover (a slot's share
        # of the epoch), so a long read does not hold the whole epoch's order.
        first = int(np.searchsorted(ends, start % total, side="right"))
        last = int(np.searchsorted(ends, (stop - 1) % total, side="right"))
        order, ordered, ends = (a[first : last + 1].copy() for a in (np.asarray(order), ordered, ends))
    pos = start
    while pos < stop:
        at = pos % total
        i = int(np.searchsorted(ends, at, side="right"))
        shard_first = int(ends[i] - ordered[i])
        first = at - shard_first
        take = min(int(ordered[i]) - first, stop - pos)
        yield Piece(int(order[i]), first, first + take)
        pos += take


def plan_epoch(
    counts: Sequence[int] | np.ndarray,
    world: World,
    *,
    seed: int,
    epoch: int,
    mode: Mode,
    shuffle: bool = True,
    pad: bool = False,
    part: int = 0,
    num_parts: int = 1,
) -> Iterator[Piece]:
    """The pieces one slot reads in one epoch, in order.

    Args:
        counts: Samples per shard, in manifest order.
        world: The slot.
        seed: Seed of the shard order.
        epoch: The epoch.
        mode: ``"exact"``, ``"balanced"`` or ``"infinite"`` (one epoch of it).
        shuffle: Permute the shards (else manifest order).
        pad: Pad ``"balanced"`` by repetition instead of dropping.
        part: Which of ``num_parts`` near-equal contiguous parts of the slot's
            range to plan (a slot may read several parts at once and mix them).
        num_parts: Parts the slot's range is cut into.
    """
    counts = np.asarray(counts, dtype=np.int64)
    order = epoch_order(len(counts), seed=seed, epoch=epoch, shuffle=shuffle)
    start, stop = part_span(int(counts.sum()), world, mode=mode, pad=pad, part=part, num_parts=num_parts)
    return iter_pieces(counts, order, start, stop)


def assign_shards(num_shards: int, world: World, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Whole shards for one slot when sample counts are unknown (no manifest).

    The epoch's shard order is dealt round-robin over the slots: slot ``s``
    gets positions ``s, s + num_slots, ...``. Every shard is read exactly once
    per epoch, but slots get whole shards, so per-rank sample counts are only
    as even as the shards are.
    """
    order = epoch_order(num_shards, seed=seed, epoch=epoch, shuffle=shuffle)
    return order[world.slot :: world.num_slots]


def skip_samples(pieces: Iterator[Piece], count: int) -> Iterator[Piece]:
    """``pieces`` without their first ``count`` samples.

    The piece holding the cut is shortened; empty pieces are dropped.
    Works on endless piece streams (``"infinite"`` mode).
    """
    left = count
    for piece in pieces:
        if left >= piece.num_samples:
            left -= piece.num_samples
            continue
        if left:
            piece = Piece(piece.shard, piece.start + left, piece.stop)
            left = 0
        yield piece
