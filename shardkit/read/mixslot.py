"""What one slot of a mixture reads: its part of each stream, interleaved.

:class:`MixSlotReader` is the mixture's counterpart of
:class:`~shardkit.read.slot.SlotReader`, with the same ``items()``. Each
stream is planned like one dataset whose epochs are windows of the stream's
walk (:class:`~shardkit.read.mix.WalkLayout`), and read through its own
read-ahead and its own shuffle buffer (the reader's ``buffer_size`` and
read-ahead budget are shared among the streams). The slot's stratified
schedule (:func:`~shardkit.read.mix.schedule_labels`) then says which
stream each delivered sample comes from, so the buffers never blur the
proportions of a batch.

Resuming needs nothing new in the state: a slot's delivered count and the
schedule give how many samples each stream's buffer had let out, and each
stream is replayed like one dataset (:mod:`shardkit.read.resume`). Another
topology splits what each stream had left, stream by stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import StateError, UsageError
from shardkit.io.base import SourceOptions
from shardkit.read.catalog import ShardCatalog
from shardkit.read.decode import Decoder
from shardkit.read.mix import MixSchedule, WalkLayout, schedule_labels, split_count
from shardkit.read.options import ReaderOptions
from shardkit.read.plan import ReadPlan
from shardkit.read.resume.elastic import EpochSequence, LevelPlan, part_spans, remainder
from shardkit.read.resume.restore import SlotRestorer
from shardkit.read.resume.state import Level
from shardkit.read.shuffle import INITIAL_FILL
from shardkit.read.slot import Sample, finish_items, fresh_raws, restored_raws
from shardkit.read.pieces import Located, OnError, PieceReader
from shardkit.world import World


def stream_options(options: ReaderOptions, shares: tuple[int, ...], index: int) -> ReaderOptions:
    """One stream's reader options: the reader's, with the shuffle buffer
    cut in proportion to the stream's share of the starting epoch."""
    total = max(sum(shares), 1)
    fraction = shares[index] / total
    size = options.buffer_size
    if size > 1:
        size = max(2, int(size * fraction))
    nbytes = None if options.buffer_bytes is None else max(1, int(options.buffer_bytes * fraction))
    return ReaderOptions(
        mode=options.mode,
        seed=options.seed,
        shuffle=options.shuffle,
        buffer_size=size,
        buffer_bytes=nbytes,
        pad=options.pad,
        interleave=1,
    )


def slot_epoch_counts(plans: list[LevelPlan], world: World, options: ReaderOptions) -> Iterator[list[int]]:
    """Per epoch of the level (in order), how many samples each stream gives
    ``world``'s slot; ends when every stream's part has ended."""
    spans = [part_spans(p, world, mode=options.mode, pad=options.pad, part=0, num_parts=1) for p in plans]
    while True:
        counts = []
        alive = False
        for it in spans:
            span = next(it, None)
            if span is not None:
                alive = True
                counts.append(span[2] - span[1])
            else:
                counts.append(0)
        if not alive:
            return
        yield counts


def _labels(epochs: Iterator[list[int]], skip: int) -> Iterator[int]:
    for counts in epochs:
        total = sum(counts)
        if skip >= total:
            skip -= total
            continue
        yield from schedule_labels(counts, start=skip)
        skip = 0


def _merged(labels: Iterator[int], streams: list[Iterator[Located]]) -> Iterator[tuple[Located, int]]:
    for label in labels:
        item = next(streams[label], None)
        if item is not None:  # None: the stream ended early (faults skipped); the others go on
            yield item, label


@dataclass(frozen=True, kw_only=True, eq=False)
class MixSlotReader:
    """Builds the item stream of any slot of a mixture.

    Attributes:
        catalogs: Each stream's shards.
        tags: Each stream's seed word.
        names: What ``__stream__`` holds for each stream.
        schedule: The shares per epoch.
        options: The reader options.
        source_options: Each stream's storage options.
        on_error: The fault policy.
        verify_checksums: Check samples against their index's checksums.
        read_ahead_bytes: Read-ahead budget of one slot, shared by the streams.
        decoder, map, batch_size, collate, partial_batches: As for
            :class:`~shardkit.read.slot.SlotReader`.
    """

    catalogs: tuple[ShardCatalog, ...]
    tags: tuple[int, ...]
    names: tuple[Any, ...]
    schedule: MixSchedule
    options: ReaderOptions
    source_options: tuple[SourceOptions, ...]
    on_error: OnError
    read_ahead_bytes: int
    verify_checksums: bool = False
    decoder: Decoder | None = None
    map: Callable[[Sample], Any] | None = None
    batch_size: int | None = None
    collate: Callable[[list[Any]], Any] | None = None
    partial_batches: bool = True

    def plans(self, epoch: int) -> list[ReadPlan]:
        """Each stream's plan for an iteration that starts at ``epoch``."""
        shares = self.schedule.shares(epoch)
        out = []
        for i, catalog in enumerate(self.catalogs):
            assert catalog.counts is not None
            layout = WalkLayout(
                catalog.counts, self.schedule, i, self.options.seed, self.tags[i], self.options.shuffle
            )
            options = stream_options(self.options, shares, i)
            # The streams share one buffer's initial fill, so the first batch comes as soon as with one dataset.
            initial = max(1, round(INITIAL_FILL * shares[i] / max(sum(shares), 1)))
            plan = ReadPlan(
                catalog.counts,
                catalog.num_shards,
                options,
                layout=layout,
                seed_tag=(self.tags[i],),
                initial_fill=initial,
            )
            out.append(plan)
        return out

    def samples_per_rank(self, world: World, *, epoch: int) -> int | None:
        """Samples ``world``'s rank reads in ``epoch``; None when endless."""
        counts = [p.samples_per_rank(world, epoch=epoch) for p in self.plans(epoch)]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def _readers(self, on_skip: Callable[[Exception], None], shares: tuple[int, ...]) -> list[PieceReader]:
        total = max(sum(shares), 1)
        n = len(self.catalogs)
        out = []
        for i, catalog in enumerate(self.catalogs):
            # Half the budget evenly, half by share: a small stream still reads ahead.
            budget = int(self.read_ahead_bytes * (0.5 / n + 0.5 * shares[i] / total))
            out.append(
                PieceReader(
                    catalog,
                    on_error=self.on_error,
                    verify_checksums=self.verify_checksums,
                    on_skip=on_skip,
                    options=self.source_options[i],
                    read_ahead_bytes=max(budget, 1),
                )
            )
        return out

    def _check_infinite(self, world: World, epoch: int) -> None:
        if self.options.mode != "infinite":
            return
        for e in {epoch, max(epoch, self.schedule.stable_from)}:
            total = sum(self.schedule.shares(e))
            if total < world.num_slots:
                raise UsageError(
                    f"mode='infinite' needs at least one sample per slot: samples_per_epoch={total} for "
                    f"{world.world_size} ranks x {world.num_workers} workers"
                )

    def items(
        self,
        world: World,
        *,
        epoch: int,
        base: tuple[Level, ...] = (),
        count: int = 0,
        on_skip: Callable[[Exception], None],
    ) -> Iterator[tuple[int, Any]]:
        """``world``'s items, each with the slot's delivered-sample count
        after it (see :meth:`SlotReader.items <shardkit.read.slot.SlotReader.items>`)."""
        self._check_infinite(world, epoch)
        plans = self.plans(epoch)
        readers = self._readers(on_skip, self.schedule.shares(epoch))
        endless = self.options.mode == "infinite"
        streams: list[Iterator[Located]]
        if not base and count == 0:
            levels = [LevelPlan.start(p.layout, epoch=epoch, endless=endless) for p in plans]  # type: ignore[arg-type]
            streams = [fresh_raws(plan, reader, world, epoch=epoch) for plan, reader in zip(plans, readers)]
        else:
            restorers = [SlotRestorer(p, r, epoch=epoch) for p, r in zip(plans, readers)]
            levels = self.level_plans(restorers, base, epoch=epoch)
            delivered = split_count(slot_epoch_counts(levels, world, self.options), count)
            if delivered is None:
                raise StateError(
                    f"reader state says rank {world.rank} worker {world.worker} delivered {count} samples, more "
                    f"than its share of epoch {epoch}: the state does not belong to this mixture and topology"
                )
            streams = [
                restored_raws(r, world, level, count=own) for r, level, own in zip(restorers, levels, delivered)
            ]
        labels = _labels(slot_epoch_counts(levels, world, self.options), count)
        merged = _merged(labels, streams)
        catalogs = self.catalogs
        samples = (
            (n, _as_dict(located, self.names[label]), catalogs[label].url(located[0]))
            for n, (located, label) in zip(itertools.count(count + 1), merged)
        )
        return finish_items(
            samples,
            on_error=self.on_error,
            on_skip=on_skip,
            decoder=self.decoder,
            map=self.map,
            batch_size=self.batch_size,
            collate=self.collate,
            partial_batches=self.partial_batches,
        )

    def level_plans(self, restorers: list[SlotRestorer], base: tuple[Level, ...], *, epoch: int) -> list[LevelPlan]:
        """Each stream's plan at the level after ``base``: what the base
        levels' slots had not delivered of it, each slot's count split over
        the streams by its schedule."""
        opts = self.options
        endless = opts.mode == "infinite"
        plans = [LevelPlan.start(r.plan.layout, epoch=epoch, endless=endless) for r in restorers]  # type: ignore[arg-type]
        for level in base:
            replays: list[dict[tuple[int, int], Any]] = [{} for _ in restorers]
            for rank in range(level.world_size):
                for worker in range(level.num_workers):
                    slot = World(rank=rank, world_size=level.world_size, worker=worker, num_workers=level.num_workers)
                    count = level.count(rank, worker)
                    assert count is not None  # levels before the last are complete
                    own = split_count(slot_epoch_counts(plans, slot, opts), count)
                    if own is None:
                        raise StateError(
                            f"reader state says rank {rank} worker {worker} delivered {count} samples, more than "
                            "its share: the state does not belong to this mixture"
                        )
                    for i, restorer in enumerate(restorers):
                        replays[i][rank, worker] = restorer.replay(slot, plan=plans[i], count=own[i])
            plans = [
                remainder(p, level, r, mode=opts.mode, pad=opts.pad, num_parts=1) for p, r in zip(plans, replays)
            ]
            plans = _aligned(plans)
        return plans


def _aligned(plans: list[LevelPlan]) -> list[LevelPlan]:
    """Endless plans that dropped different finished epochs, padded back to
    a common first epoch with empty sequences (the schedule goes epoch by
    epoch over all streams)."""
    first = min(p.epoch for p in plans)
    out = []
    for p in plans:
        if p.epoch > first:
            empty = tuple(_empty() for _ in range(p.epoch - first))
            p = LevelPlan(first, empty + p.carried, p.layout, p.endless)
        out.append(p)
    return out


def _empty() -> EpochSequence:
    return EpochSequence(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _as_dict(located: Located, name: Any) -> Sample:
    raw = located[2]
    sample: Sample = {"__key__": raw.key, "__stream__": name}
    sample.update(raw.fields)
    return sample
