"""What one (rank, worker) slot reads, from plan to delivered items.

:class:`SlotReader` chains the stages of a slot's items, for one dataset
and for a mixture alike (one dataset is a mixture of one source): each
source's plan, its pieces read through read-ahead (:mod:`.pieces`) in
``interleave`` parts mixed sample by sample, shuffled in the source's seeded
buffer; the sources interleaved by the mixture's schedule; then sample
dicts, decoded, selected, mapped and batched (:class:`OutputOptions`). It may start from a resumed position (see
:mod:`shardkit.read.resume`). It keeps nothing between iterations, so any
process holding one (the dataset, the loader's workers) reads any slot.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch.utils.data import default_collate

from shardkit.errors import TRANSFORM_FAULTS, StateError
from shardkit.io.base import SourceOptions
from shardkit.read.blocks import BlockCatalog, BlockReader, token_world_check
from shardkit.read.budget import BatchCatalog, BatchReader
from shardkit.read import sample_rng
from shardkit.read.catalog import ShardCatalog
from shardkit.read.collate import collate_samples
from shardkit.read.decode import describe_fault, undecodable
from shardkit.read.options import OutputOptions, ReaderOptions
from shardkit.read.plan import EpochLayout, ReadPlan, check_infinite
from shardkit.read.resume.elastic import LevelPlan, part_spans
from shardkit.read.resume.restore import SlotRestorer, level_plans
from shardkit.read.resume.state import Level
from shardkit.read.schedule import schedule_labels, schedule_prefix, split_count
from shardkit.read.shuffle import ShuffleBuffer, round_robin
from shardkit.read.split import skip_samples
from shardkit.read import stats
from shardkit.read.joined import reader_type
from shardkit.read.pieces import Located, OnError, PieceReader
from shardkit.world import World

Sample = dict[str, Any]

#: A sample with the slot's delivered count after it, its shard's URL, and
#: ``(source, shard, position)``, which names it for its seeded generator.
Numbered = tuple[int, Sample, str, tuple[int, int, int]]

log = logging.getLogger(__name__)


def located_nbytes(located: Located) -> int:
    """A sample's size as stored (tar headers included): O(1), and the same
    figure the offset index gives without reading the sample."""
    raw = located[2]
    return raw.end - raw.start


def _as_dicts(
    located: Iterator[tuple[int, tuple[Located, int]]], catalogs: tuple[ShardCatalog, ...], names: tuple[Any, ...] | None
) -> Iterator[Numbered]:
    """Sample dicts (with ``__stream__`` when the sources are named), each
    with its shard's URL for errors and where it is in the sources."""
    for count, ((shard, position, raw), source) in located:
        sample: Sample = {"__key__": raw.key}
        if names is not None:
            sample["__stream__"] = names[source]
        sample.update(raw.fields)
        yield count, sample, catalogs[source].url(shard), (source, shard, position)


def _as_dicts_timed(
    located: Iterator[tuple[int, tuple[Located, int]]],
    catalogs: tuple[ShardCatalog, ...],
    names: tuple[Any, ...] | None,
    clock: stats.StageClock,
) -> Iterator[Numbered]:
    """:func:`_as_dicts` with loader statistics: the time taken to get
    each sample is charged to ``parse``, less the waits for bytes meanwhile
    (``read``, charged by the read-ahead), and to its shard, which becomes
    the clock's (one layer, locals only: this runs once a sample)."""
    now, stages, shards = time.monotonic, clock.stages, clock.shards
    # Token blocks and budget batches are virtual shards over stored ones: their time goes to the stored
    # shard being read (a virtual shard's name is a description, for errors).
    virtual = tuple(isinstance(c, (BlockCatalog, BatchCatalog)) for c in catalogs)
    asked, waited = now(), stages[stats.READ]
    for count, ((shard, position, raw), source) in located:  # the time since ``asked`` went to get this one
        url = catalogs[source].url(shard)
        clock.shard = clock.reading if virtual[source] else url
        spent = now() - asked - (stages[stats.READ] - waited)
        stages[stats.PARSE] += spent
        shards[clock.shard] = shards.get(clock.shard, 0.0) + spent
        clock.samples += 1
        sample: Sample = {"__key__": raw.key}
        if names is not None:
            sample["__stream__"] = names[source]
        sample.update(raw.fields)
        yield count, sample, url, (source, shard, position)
        asked, waited = now(), stages[stats.READ]


class SourceSchedule(Protocol):
    """How a reader's sources share each epoch: :class:`~shardkit.read.plan.WholeDataset`
    for one dataset, :class:`~shardkit.read.schedule.MixSchedule` for a mixture."""

    @property
    def stable_from(self) -> int: ...

    def shares(self, epoch: int) -> tuple[int, ...]: ...

    def layout(
        self, index: int, counts: np.ndarray | None, *, seed: int, words: tuple[int, ...], shuffle: bool
    ) -> EpochLayout | None: ...


@dataclass(frozen=True, kw_only=True, eq=False)
class SlotReader:
    """Builds the items of any slot of a reader of one or more sources.

    One dataset is a mixture of one source that takes the whole epoch: its
    plan reads every shard each epoch, its items carry no ``__stream__``.
    A mixture's sources (its streams) each take their share of the epoch,
    are read through their own read-ahead and shuffle buffer (the budget and
    the buffer are shared in proportion), and are interleaved by the
    stratified schedule (:func:`~shardkit.read.schedule.schedule_labels`).

    Attributes:
        catalogs: Each source's shards.
        source_options: Each source's storage options.
        seed_words: Each source's extra shuffle seed words (none for one
            dataset read alone; a stream's seed word in a mixture).
        names: What ``__stream__`` holds for each source's samples, or None
            for no ``__stream__`` field (one dataset).
        schedule: How the sources share each epoch.
        options: The reader options.
        on_error: The fault policy (see :mod:`.pieces`).
        verify_checksums: Check samples against their index's checksums.
        read_ahead_bytes: Read-ahead budget of one slot, shared by its
            sources and their ``interleave`` read parts.
        output: How samples are presented (decode, map, batch).
        known_shards: ``(epoch, n)``: ``epoch`` is read over the first ``n``
            shards alone, as the dataset was before shards were appended to
            it (the resumed epoch of a state saved then); None: every epoch
            over every shard.
    """

    catalogs: tuple[ShardCatalog, ...]
    source_options: tuple[SourceOptions, ...]
    seed_words: tuple[tuple[int, ...], ...]
    names: tuple[Any, ...] | None
    schedule: SourceSchedule
    options: ReaderOptions
    on_error: OnError
    read_ahead_bytes: int
    verify_checksums: bool = False
    output: OutputOptions = OutputOptions()
    known_shards: tuple[int, int] | None = None

    def known_at(self, epoch: int) -> int | None:
        """The shards ``epoch`` is read over when not all (see :attr:`known_shards`)."""
        known = self.known_shards
        return known[1] if known is not None and known[0] == epoch else None

    def plans(self, epoch: int) -> list[ReadPlan]:
        """Each source's plan for an iteration that starts at ``epoch``
        (derived from the catalogs each time: nothing per shard is kept)."""
        shares = self.schedule.shares(epoch)
        opts = self.options
        known = self.known_at(epoch)
        out = []
        for i, catalog in enumerate(self.catalogs):
            counts, num_shards = catalog.counts, catalog.num_shards
            if known is not None and counts is not None:  # one dataset, as it was before an append
                counts, num_shards = counts[:known], known
            words = self.seed_words[i]
            layout = self.schedule.layout(i, counts, seed=opts.seed, words=words, shuffle=opts.shuffle)
            out.append(
                ReadPlan.of_source(counts, num_shards, opts, layout=layout, seed_tag=words, shares=shares, index=i)
            )
        return out

    @property
    def per_stream(self) -> int | None:
        """The batch size when every batch comes from one source
        (``batching="per_stream"`` or ``"device_per_stream"`` over several
        sources), else None."""
        if self.options.batching == "stratified" or len(self.catalogs) < 2:
            return None
        return self.output.batch_size

    def _spread(self, world: World) -> tuple[int, int] | None:
        """Where ``world``'s rank starts its order of batches, as ``(rank,
        world_size)``, with ``batching="device_per_stream"`` (None: every
        rank in the same order)."""
        return (world.rank, world.world_size) if self.options.batching == "device_per_stream" else None

    def samples_per_rank(self, world: World, *, epoch: int) -> int | None:
        """Samples ``world``'s rank reads in ``epoch``; None if unknown or endless."""
        if self.per_stream is not None:
            return _sum_known(self.samples_per_slot(world.with_worker(w, world.num_workers), epoch=epoch)
                              for w in range(world.num_workers))  # fmt: skip
        return _sum_known(p.samples_per_rank(world, epoch=epoch) for p in self.plans(epoch))

    def samples_per_slot(self, world: World, *, epoch: int) -> int | None:
        """Samples ``world``'s (rank, worker) slot reads in ``epoch``; None if unknown or endless."""
        batch = self.per_stream
        if batch is not None and self.options.mode != "infinite":
            levels = self._start_levels(epoch)
            _, batches = next(per_stream_epochs(levels, world, self.options, batch))
            return sum(batches) * batch
        return _sum_known(p.samples_per_slot(world, epoch=epoch) for p in self.plans(epoch))

    def _start_levels(self, epoch: int) -> list[LevelPlan]:
        endless = self.options.mode == "infinite"
        return [LevelPlan.start(p.layout, epoch=epoch, endless=endless) for p in self.plans(epoch)]  # type: ignore[arg-type]

    def _readers(
        self, world: World, on_skip: Callable[[Exception], None], shares: tuple[int, ...]
    ) -> list[PieceReader | BlockReader]:
        total = max(sum(shares), 1)
        n = len(self.catalogs)
        # The rank's remote requests are shared by its workers and every
        # range each has open (one per source and read part).
        ranges = max(world.num_workers, 1) * n * self.options.interleave
        out = []
        for i, catalog in enumerate(self.catalogs):
            # Half the budget evenly, half by share (a small source still
            # reads ahead), then split among the source's read parts.
            budget = int(self.read_ahead_bytes * (0.5 / n + 0.5 * shares[i] / total)) // self.options.interleave
            make = BlockReader if isinstance(catalog, BlockCatalog) else reader_type(catalog)
            make = BatchReader if isinstance(catalog, BatchCatalog) else make
            out.append(
                make(
                    catalog,  # type: ignore[arg-type]
                    on_error=self.on_error,
                    verify_checksums=self.verify_checksums,
                    on_skip=on_skip,
                    options=self.source_options[i].shared_by(ranges),
                    read_ahead_bytes=max(budget, 1),
                )
            )
        return out

    def items(
        self,
        world: World,
        *,
        epoch: int,
        base: tuple[Level, ...] = (),
        count: int = 0,
        on_skip: Callable[[Exception], None],
        on_filtered: Callable[[], None] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """``world``'s items, each with the slot's delivered-sample count after it.

        Plans (and, from a restored position, replays) at once; reads as the
        items are taken.

        Args:
            world: The slot.
            epoch: The epoch its iteration starts with.
            base: Levels of a restored state before the slot's own: the
                slot's plan is then the remainder they left.
            count: Samples the slot had delivered at its level (a restored
                state); they are skipped by replaying positions.
            on_skip: Called with each fault skipped under ``on_error="skip"``.
            on_filtered: Called for each sample ``output.select`` filters out.

        Raises:
            UsageError: ``"infinite"`` mode with too few samples for the slots.
            StateError: A restored count the plan cannot hold.
        """
        plans = self.plans(epoch)
        check_infinite(plans, world, epoch=epoch)
        token_world_check(self.catalogs, world)
        readers = self._readers(world, on_skip, self.schedule.shares(epoch))
        endless = self.options.mode == "infinite"
        levels: list[LevelPlan] | None = None
        raws: list[Iterator[Located]]
        if not base and count == 0:
            raws = [fresh_raws(plan, reader, world, epoch=epoch) for plan, reader in zip(plans, readers)]
        else:
            restorers = [SlotRestorer(p, r, epoch=epoch) for p, r in zip(plans, readers)]
            levels = level_plans(restorers, base, epoch=epoch, split=self._split)
            own = self._split(levels, world, count)
            if own is None:
                raise StateError(
                    f"reader state says rank {world.rank} worker {world.worker} delivered {count} samples, more "
                    f"than its share of epoch {epoch}: the state does not belong to this dataset and topology"
                )
            raws = [restored_raws(r, world, level, count=n) for r, level, n in zip(restorers, levels, own)]
        if len(raws) == 1:  # one source gives every sample: no schedule to follow
            merged: Iterator[tuple[Located, int]] = zip(raws[0], itertools.repeat(0))
        else:
            if levels is None:
                levels = [LevelPlan.start(p.layout, epoch=epoch, endless=endless) for p in plans]  # type: ignore[arg-type]
            batch = self.per_stream
            if batch is not None:
                epochs = per_stream_epochs(levels, world, self.options, batch)
                merged = _per_stream_merged(epochs, batch, count, raws, spread=self._spread(world))
            else:
                merged = _merged(_labels(slot_epoch_counts(levels, world, self.options), count), raws)
        numbered = zip(itertools.count(count + 1), merged)
        if stats.current is None:
            samples = _as_dicts(numbered, self.catalogs, self.names)
        else:  # loader statistics
            samples = _as_dicts_timed(numbered, self.catalogs, self.names, stats.current)
        return finish_items(
            samples,
            on_error=self.on_error,
            on_skip=on_skip,
            output=self.output,
            on_filtered=on_filtered,
            seeds=(self.options.seed, epoch),
        )

    def _split(self, plans: list[LevelPlan], world: World, count: int) -> list[int] | None:
        """How many of the first ``count`` samples ``world``'s slot
        delivered came from each source (None: more than its share). One
        source gave them all (its replay checks the count)."""
        if len(plans) == 1:
            return [count]
        batch = self.per_stream
        if batch is not None:
            epochs = per_stream_epochs(plans, world, self.options, batch)
            return per_stream_split(epochs, batch, count, spread=self._spread(world))
        return split_count(slot_epoch_counts(plans, world, self.options), count)


def slot_epoch_counts(plans: list[LevelPlan], world: World, options: ReaderOptions) -> Iterator[list[int]]:
    """Per epoch of the level (in order), how many samples each source gives
    ``world``'s slot; ends when every source's part has ended."""
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


def per_stream_epochs(
    plans: list[LevelPlan], world: World, options: ReaderOptions, batch: int
) -> Iterator[tuple[list[int], list[int]]]:
    """Per epoch of the level, with ``batching="per_stream"``: how many
    samples each source gives ``world``'s slot, and how many whole batches
    of each source every slot of the topology makes (the fewest any slot's
    share of that source holds), so that batch *j* of every slot is of the
    same source."""
    everyone = [World(rank=r, world_size=world.world_size, worker=w, num_workers=world.num_workers)
                for r in range(world.world_size) for w in range(world.num_workers)]  # fmt: skip
    own = slot_epoch_counts(plans, world, options)
    slots = [slot_epoch_counts(plans, slot, options) for slot in everyone]
    for mine, *each in zip(own, *slots):
        yield mine, [min(counts[i] for counts in each) // batch for i in range(len(mine))]


def _rotation(batches: list[int], spread: tuple[int, int] | None) -> int:
    """Where a rank's order of an epoch's batches starts in their stratified
    order: 0, or with ``device_per_stream`` its share of the way round."""
    return 0 if spread is None else spread[0] * sum(batches) // spread[1]


def _batch_labels(batches: list[int], start: int, offset: int) -> Iterator[int]:
    """The source of each batch of the stratified order of ``batches``,
    rotated to begin at ``offset``, from (rotated) position ``start`` on."""
    total = sum(batches)
    at = (offset + start) % total if total else 0
    head = min(total - start, total - at)
    yield from itertools.islice(schedule_labels(batches, start=at), head)
    yield from itertools.islice(schedule_labels(batches), total - start - head)


def _batch_prefix(batches: list[int], count: int, offset: int) -> list[int]:
    """How many batches of each source the first ``count`` of that rotated order hold."""
    total = sum(batches)
    end = offset + count
    before = schedule_prefix(batches, offset)
    if end <= total:
        return [b - a for a, b in zip(before, schedule_prefix(batches, end))]
    return [whole - a + b for whole, a, b in zip(batches, before, schedule_prefix(batches, end - total))]


def _per_stream_merged(
    epochs: Iterator[tuple[list[int], list[int]]],
    batch: int,
    skip: int,
    sources: list[Iterator[Located]],
    *,
    spread: tuple[int, int] | None = None,
) -> Iterator[tuple[Located, int]]:
    """The sources' samples in batches of one source each: per epoch, the
    stratified order of the batches (:func:`schedule_labels` over whole
    batches; with ``spread``, rotated by the rank's share of the way round),
    each batch ``batch`` samples of its source; a source's samples past its
    whole batches are read and dropped at the epoch's end. Starts after the
    slot's first ``skip`` delivered samples (a restored position; the
    sources start where they were then, see :func:`per_stream_split`)."""
    for own, batches in epochs:
        total = sum(batches) * batch
        if skip >= total:
            skip -= total
            continue
        first, within = divmod(skip, batch)
        for j, label in enumerate(_batch_labels(batches, first, _rotation(batches, spread))):
            for _ in range(batch - within if j == 0 else batch):
                item = next(sources[label], None)
                if item is not None:  # None: the source ended early (faults skipped)
                    yield item, label
        for source, count, whole in zip(sources, own, batches):
            for _ in range(count - whole * batch):  # not a whole batch: left out of the epoch
                next(source, None)
        skip = 0


def per_stream_split(
    epochs: Iterator[tuple[list[int], list[int]]], batch: int, count: int, *, spread: tuple[int, int] | None = None
) -> list[int] | None:
    """Per source, how many of its samples a slot had consumed when it had
    delivered ``count`` in per-stream batches (an epoch delivered whole
    consumed each source's share, the samples left out included); None if
    the slot delivers fewer than ``count``."""
    out: list[int] | None = None
    left = count
    for own, batches in epochs:
        if out is None:
            out = [0] * len(own)
        total = sum(batches) * batch
        if left >= total:
            take = list(own)
        else:
            whole, rest = divmod(left, batch)
            offset = _rotation(batches, spread)
            take = [b * batch for b in _batch_prefix(batches, whole, offset)]
            if rest:
                take[next(_batch_labels(batches, whole, offset))] += rest
        out = [a + b for a, b in zip(out, take)]
        left -= min(left, total)
        if left == 0:
            return out
    return out if left == 0 and out is not None else None


def _labels(epochs: Iterator[list[int]], skip: int) -> Iterator[int]:
    for counts in epochs:
        total = sum(counts)
        if skip >= total:
            skip -= total
            continue
        yield from schedule_labels(counts, start=skip)
        skip = 0


def _merged(labels: Iterator[int], sources: list[Iterator[Located]]) -> Iterator[tuple[Located, int]]:
    for label in labels:
        item = next(sources[label], None)
        if item is not None:  # None: the source ended early (faults skipped); the others go on
            yield item, label


def fresh_raws(plan: ReadPlan, reader: PieceReader, world: World, *, epoch: int) -> Iterator[Located]:
    """A slot's raw samples from the start of ``epoch``: its read parts,
    mixed (``interleave``), through its seeded shuffle buffer."""
    parts = [reader.read(plan.pieces(world, epoch=epoch, part=p)) for p in range(plan.options.interleave)]
    raws: Iterator[Located] = parts[0] if len(parts) == 1 else round_robin(parts)
    buffer = plan.shuffle_buffer(world, epoch=epoch, nbytes=located_nbytes)
    return raws if buffer is None else buffer.shuffle(raws)


def restored_raws(restorer: SlotRestorer, world: World, level: LevelPlan, *, count: int) -> Iterator[Located]:
    """A slot's raw samples after the first ``count`` it delivered at
    ``level``: the replay gives where each read part was and what the
    buffer held (read again through the index), then reading goes on."""
    opts = restorer.plan.options
    parts = range(opts.interleave)
    replay = restorer.replay(world, plan=level, count=count)
    pieces = [skip_samples(restorer.part_pieces(world, level, p), replay.consumed[p]) for p in parts]
    buffer: ShuffleBuffer[Any] | None = None
    resident: list[Located] | None = None
    if replay.buffer is not None:
        buffer = replay.buffer.follow(nbytes=located_nbytes if opts.buffer_bytes is not None else None)
        resident = restorer.read_resident(replay)
    read = [restorer.reader.read(p) for p in pieces]
    raws: Iterator[Located] = read[0] if len(read) == 1 else round_robin(read, first=replay.next_part)
    return raws if buffer is None else buffer.shuffle(raws, resident=resident, held=replay.held)


def finish_items(
    samples: Iterator[Numbered],
    *,
    on_error: OnError,
    on_skip: Callable[[Exception], None],
    output: OutputOptions,
    on_filtered: Callable[[], None] | None = None,
    seeds: tuple[int, int] = (0, 0),
) -> Iterator[tuple[int, Any]]:
    """The last stages of a slot's items: decode, select, map, batch. Items
    keep the slot's delivered count (a batch, its last sample's), which
    counts the samples ``select`` dropped before them as consumed (each
    reported to ``on_filtered``). ``samples`` come with their shard's URL, for
    errors, and where they are; with ``seeds``, ``(seed, epoch)``, that names
    each sample for :func:`~shardkit.read.sample_rng.sample_generator` while
    ``map`` runs."""
    out: Iterator[tuple[int, Any]]
    if output.decoder is None and output.map is None and output.select is None:
        out = ((n, s) for n, s, _, _ in samples)
    else:
        out = _decoded(samples, output, on_error, on_skip, on_filtered, seeds)
    if output.batch_size is not None:
        collate = default_collate if output.collate is None else output.collate
        batch = functools.partial(collate_samples, collate=collate)
        if stats.current is not None:
            batch = stats.timed_call(batch, stats.current, stats.COLLATE)
        out = _batches(out, output.batch_size, batch, output.partial_batches)
    return out


def _sum_known(counts: Iterable[int | None]) -> int | None:
    """The sum of ``counts``, or None if any is unknown."""
    total = 0
    for count in counts:
        if count is None:
            return None
        total += count
    return total


def _decoded(
    samples: Iterator[Numbered],
    output: OutputOptions,
    on_error: OnError,
    on_skip: Callable[[Exception], None],
    on_filtered: Callable[[], None] | None,
    seeds: tuple[int, int],
) -> Iterator[tuple[int, Any]]:
    """Decode, select and map each sample. A field that does not decode
    (:func:`~shardkit.read.decode.undecodable`), a member over a limit
    (:class:`~shardkit.errors.MemberTooLargeError`, from the decoder or a
    transform in ``map``) and media that do not decode
    (:class:`~shardkit.errors.MediaError`, from a transform) are data
    faults: raised, or under ``on_error="skip"`` logged, counted and the
    sample dropped (it still counts as consumed, so a checkpoint resumes
    past it)."""
    decoder, select, fn = output.decoder, output.select, output.map
    if (clock := stats.current) is not None:  # loader statistics: decode and map timed
        decoder = None if decoder is None else stats.timed_call(decoder, clock, stats.DECODE)
        fn = None if fn is None else stats.timed_call(fn, clock, stats.MAP)
    for n, sample, url, where in samples:
        if decoder is not None:
            try:
                sample = decoder(sample, path=url)
            except Exception as exc:
                if on_error == "raise" or not undecodable(exc):
                    raise
                log.warning("skipping sample (on_error='skip'): %s", describe_fault(exc))
                on_skip(exc)
                continue
        try:
            if select is not None and not select(sample):
                if on_filtered is not None:
                    on_filtered()
                continue
            if fn is None:
                yield n, sample
                continue
            token = sample_rng.current.set((*seeds, *where))
            try:
                item = fn(sample)
            finally:
                sample_rng.current.reset(token)
            yield n, item
        except TRANSFORM_FAULTS as exc:
            error = exc if exc.path is not None else exc.located(path=url, member=exc.member)
            if on_error == "raise":
                raise error from None
            log.warning("skipping sample (on_error='skip'): %s", error)
            on_skip(error)


def _batches(
    samples: Iterator[tuple[int, Any]], size: int, batch: Callable[[list[Any]], Any], partial: bool
) -> Iterator[tuple[int, Any]]:
    while True:
        items = list(itertools.islice(samples, size))
        if not items or (len(items) < size and not partial):
            return
        yield items[-1][0], batch([s for _, s in items])
