"""One reader's plan: what each slot reads in each epoch, and how it mixes it.

:class:`ReadPlan` ties the pure functions of :mod:`.split` and the shuffle
buffer of :mod:`.shuffle` to one dataset's sample counts and one
:class:`~shardkit.read.options.ReaderOptions`. It does no I/O and keeps no
position: the dataset reads what it says, and the resume code replays it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shardkit.errors import UsageError
from shardkit.read.options import ReaderOptions
from shardkit.read.shuffle import INITIAL_FILL, ShuffleBuffer
from shardkit.read.split import (
    SAMPLE_SHUFFLE_STREAM,
    Piece,
    assign_shards,
    epoch_order,
    iter_pieces,
    part_span,
    samples_per_rank,
    seed_sequence,
)
from shardkit.world import World


class EpochLayout(Protocol):
    """How each epoch's global sequence maps to samples of the shards.

    Attributes:
        stable_from: From this epoch on every epoch has the same length (so a
            slot with nothing to read in one has nothing in any later one).
    """

    stable_from: int

    def length(self, epoch: int) -> int:
        """Samples in ``epoch``'s sequence."""
        ...

    def pieces(self, epoch: int, start: int, stop: int) -> Iterator[Piece]:
        """Positions ``[start, stop)`` of ``epoch``'s sequence as pieces;
        positions at or past the length wrap around to its start (padding)."""
        ...


@dataclass(frozen=True, eq=False)
class DatasetLayout:
    """One dataset read whole each epoch: its shards in the epoch's order
    (permuted from ``(seed, epoch)`` with ``shuffle``), each shard's samples
    in stored order."""

    counts: np.ndarray
    seed: int
    shuffle: bool
    stable_from: int = 0

    def length(self, epoch: int) -> int:
        return int(self.counts.sum())

    def pieces(self, epoch: int, start: int, stop: int) -> Iterator[Piece]:
        order = epoch_order(len(self.counts), seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        return iter_pieces(self.counts, order, start, stop)


@dataclass(frozen=True, eq=False)
class ReadPlan:
    """Which pieces each slot reads in which order, per epoch.

    Attributes:
        counts: Samples per shard in manifest order, or None when unknown
            (shards without a manifest or index: whole shards are dealt to
            slots instead of sample ranges).
        num_shards: Shards in the dataset.
        options: The reader options.
        layout: How an epoch's sequence maps to shards; default the whole
            dataset each epoch (:class:`DatasetLayout`). A stream of a
            mixture has its own (:class:`~shardkit.read.mix.WalkLayout`).
        seed_tag: Extra words of the shuffle buffer's seed (a mixture's
            streams each have their own); empty for one dataset.
        initial_fill: Samples the shuffle buffer holds before its first
            output (a mixture's streams share the default between them).
    """

    counts: np.ndarray | None
    num_shards: int
    options: ReaderOptions
    layout: EpochLayout | None = field(default=None)
    seed_tag: tuple[int, ...] = ()
    initial_fill: int = INITIAL_FILL

    def __post_init__(self) -> None:
        if self.layout is None and self.counts is not None:
            layout = DatasetLayout(self.counts, self.options.seed, self.options.shuffle)
            object.__setattr__(self, "layout", layout)

    @property
    def num_samples(self) -> int | None:
        """Samples of one epoch, or None when the counts are unknown."""
        return None if self.counts is None else int(self.counts.sum())

    def samples_per_rank(self, world: World, *, epoch: int = 0) -> int | None:
        """Samples ``world``'s rank reads in ``epoch``; None if unknown or endless."""
        if self.layout is None or self.options.mode == "infinite":
            return None
        total = self.layout.length(epoch)
        opts = self.options
        return samples_per_rank(total, rank=world.rank, world_size=world.world_size, mode=opts.mode, pad=opts.pad)

    def pieces(self, world: World, *, epoch: int, part: int = 0) -> Iterator[Piece]:
        """The pieces read stream ``part`` of ``world``'s slot reads from
        ``epoch`` on: one epoch, or every epoch after it in ``"infinite"``
        mode (endless). A slot has ``options.interleave`` read streams.

        Raises:
            UsageError: ``"infinite"`` mode with fewer samples (or, without
                counts, shards) than read streams over all slots.
        """
        opts = self.options
        streams = world.num_slots * opts.interleave
        epochs = itertools.count(epoch) if opts.mode == "infinite" else (epoch,)
        layout = self.layout
        if layout is not None:
            total = layout.length(epoch)
            if opts.mode == "infinite" and not self.seed_tag and total < streams:
                raise UsageError(
                    f"mode='infinite' needs at least one sample per slot and stream: {total} samples for "
                    f"{world.world_size} ranks x {world.num_workers} workers x interleave {opts.interleave}"
                )
            for e in epochs:
                lo, hi = part_span(
                    layout.length(e), world, mode=opts.mode, pad=opts.pad, part=part, num_parts=opts.interleave
                )
                if hi == lo and opts.mode == "infinite" and e >= layout.stable_from:
                    return  # every later epoch is as empty for this stream
                yield from layout.pieces(e, lo, hi)
            return
        if opts.mode == "infinite" and self.num_shards < streams:
            raise UsageError(
                f"mode='infinite' without sample counts needs a shard per slot and stream: "
                f"{self.num_shards} shards for {world.world_size} ranks x {world.num_workers} workers "
                f"x interleave {opts.interleave}"
            )
        for e in epochs:
            shards = assign_shards(self.num_shards, world, seed=opts.seed, epoch=e, shuffle=opts.shuffle)
            for shard in shards[part :: opts.interleave]:
                yield Piece(int(shard), 0, 0)

    def shuffle_buffer(self, world: World, *, epoch: int, nbytes: Callable[[Any], int]) -> ShuffleBuffer[Any] | None:
        """A fresh shuffle buffer of ``world``'s slot for ``epoch``, seeded
        from ``(seed, epoch, rank, worker)``; None without shuffling.

        Args:
            world: The slot.
            epoch: The epoch the slot's iteration starts with.
            nbytes: Sizes the buffer's items (used with ``buffer_bytes``).
        """
        opts = self.options
        if not opts.shuffles_samples:
            return None
        seeds = seed_sequence(opts.seed, epoch, SAMPLE_SHUFFLE_STREAM, world.rank, world.worker, *self.seed_tag)
        return ShuffleBuffer(
            size=opts.buffer_size,
            rng=np.random.Generator(np.random.PCG64(seeds)),
            max_bytes=opts.buffer_bytes,
            nbytes=nbytes if opts.buffer_bytes is not None else None,
            initial=self.initial_fill,
        )
