"""One reader's plan: what each slot reads in each epoch, and how it mixes it.

:class:`ReadPlan` ties the pure functions of :mod:`.split` and the shuffle
buffer of :mod:`.shuffle` to one dataset's sample counts and one
:class:`~shardkit.read.options.ReaderOptions`. It does no I/O and keeps no
position: the dataset reads what it says, and the resume code replays it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shardkit.errors import UsageError
from shardkit.read.options import ReaderOptions
from shardkit.read.shuffle import INITIAL_FILL, ShuffleBuffer
from shardkit.read.split import (
    SAMPLE_SHUFFLE_DOMAIN,
    Piece,
    assign_shards,
    epoch_order,
    iter_pieces,
    part_span,
    samples_per_rank,
    seed_sequence,
    slot_span,
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
class WholeDataset:
    """The schedule of one dataset read alone: the whole dataset every epoch.

    The counterpart of :class:`~shardkit.read.schedule.MixSchedule` for a
    reader of one source (see :class:`~shardkit.read.slot.SlotReader`).
    """

    stable_from: int = 0

    def shares(self, epoch: int) -> tuple[int, ...]:
        """The source's part of the epoch, as a weight: all of it."""
        return (1,)

    def layout(
        self, index: int, counts: np.ndarray | None, *, seed: int, words: tuple[int, ...], shuffle: bool
    ) -> EpochLayout | None:
        """The dataset's epochs: its shards in each epoch's order (None
        without counts: whole shards are dealt to slots)."""
        return None if counts is None else DatasetLayout(counts, seed, shuffle)


def check_infinite(plans: Sequence[ReadPlan], world: World, *, epoch: int) -> None:
    """Refuse ``"infinite"`` mode when the sources' epochs hold fewer samples
    than ``world``'s slots have read parts (a part with nothing to read would
    never end), at ``epoch`` and once the shares are stable.

    Raises:
        UsageError: Too few samples, with the numbers.
    """
    layouts = [p.layout for p in plans]
    if not plans or plans[0].options.mode != "infinite" or any(layout is None for layout in layouts):
        return
    parts = world.num_slots * plans[0].options.interleave
    stable = max(layout.stable_from for layout in layouts)  # type: ignore[union-attr]
    for e in sorted({epoch, max(epoch, stable)}):
        total = sum(layout.length(e) for layout in layouts)  # type: ignore[union-attr]
        if total < parts:
            raise UsageError(
                f"mode='infinite' needs at least one sample per slot and read part: {total} samples in epoch {e} "
                f"for {world.world_size} ranks x {world.num_workers} workers x interleave "
                f"{plans[0].options.interleave}"
            )


@dataclass(frozen=True, eq=False)
class ReadPlan:
    """Which pieces each slot reads in which order, per epoch.

    Attributes:
        counts: Samples per shard in manifest order, or None when unknown
            (shards without a manifest or index: whole shards are dealt to
            slots instead of sample ranges).
        num_shards: Shards in the dataset.
        options: The reader options.
        layout: How an epoch's sequence maps to shards (from the reader's
            schedule: :class:`WholeDataset` or
            :class:`~shardkit.read.schedule.MixSchedule`); None without counts.
        seed_tag: Extra words of the shuffle buffer's seed: a mixture's
            stream's seed word; none for one dataset read alone.
        initial_fill: Samples the shuffle buffer holds before its first
            output (a reader's sources share the default between them).
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

    @classmethod
    def of_source(
        cls,
        counts: np.ndarray | None,
        num_shards: int,
        options: ReaderOptions,
        *,
        layout: EpochLayout | None,
        seed_tag: tuple[int, ...],
        shares: tuple[int, ...],
        index: int,
    ) -> ReadPlan:
        """The plan of source ``index`` of a reader whose sources give
        ``shares`` of the epoch (one source: all of it). The reader's shuffle
        buffer and its initial fill are cut in proportion: the sources share
        one buffer's worth, so the first batch comes as soon as with one
        dataset."""
        total = max(sum(shares), 1)
        fraction = shares[index] / total
        size = options.buffer_size
        if size > 1:
            size = max(2, int(size * fraction))
        nbytes = None if options.buffer_bytes is None else max(1, int(options.buffer_bytes * fraction))
        own = dataclasses.replace(options, buffer_size=size, buffer_bytes=nbytes)
        initial = max(1, round(INITIAL_FILL * shares[index] / total))
        return cls(counts, num_shards, own, layout=layout, seed_tag=seed_tag, initial_fill=initial)

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

    def samples_per_slot(self, world: World, *, epoch: int = 0) -> int | None:
        """Samples ``world``'s (rank, worker) slot reads in ``epoch``; None if unknown or endless."""
        if self.layout is None or self.options.mode == "infinite":
            return None
        start, stop = slot_span(self.layout.length(epoch), world, mode=self.options.mode, pad=self.options.pad)
        return stop - start

    def pieces(self, world: World, *, epoch: int, part: int = 0) -> Iterator[Piece]:
        """The pieces read part ``part`` of ``world``'s slot reads from
        ``epoch`` on: one epoch, or every epoch after it in ``"infinite"``
        mode (endless). A slot has ``options.interleave`` read parts.
        (:func:`check_infinite` checks that each part has samples.)

        Raises:
            UsageError: ``"infinite"`` mode without counts and with fewer
                shards than read parts over all slots.
        """
        opts = self.options
        parts = world.num_slots * opts.interleave
        epochs = itertools.count(epoch) if opts.mode == "infinite" else (epoch,)
        layout = self.layout
        if layout is not None:
            for e in epochs:
                lo, hi = part_span(
                    layout.length(e), world, mode=opts.mode, pad=opts.pad, part=part, num_parts=opts.interleave
                )
                if hi == lo and opts.mode == "infinite" and e >= layout.stable_from:
                    return  # every later epoch is as empty for this part
                yield from layout.pieces(e, lo, hi)
            return
        if opts.mode == "infinite" and self.num_shards < parts:
            raise UsageError(
                f"mode='infinite' without sample counts needs a shard per slot and read part: "
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
        seeds = seed_sequence(opts.seed, epoch, SAMPLE_SHUFFLE_DOMAIN, world.rank, world.worker, *self.seed_tag)
        return ShuffleBuffer(
            size=opts.buffer_size,
            rng=np.random.Generator(np.random.PCG64(seeds)),
            max_bytes=opts.buffer_bytes,
            nbytes=nbytes if opts.buffer_bytes is not None else None,
            initial=self.initial_fill,
        )
