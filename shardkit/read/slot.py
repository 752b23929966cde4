"""What one (rank, worker) slot reads, from plan to delivered items.

:class:`SlotReader` chains the stages of a slot's stream: the plan's pieces,
read through read-ahead streams (:mod:`.pieces`), mixed (``interleave``),
shuffled in the seeded buffer, then turned into sample dicts, decoded,
mapped and batched. It may start from a resumed position (see
:mod:`shardkit.read.resume`). It keeps nothing between iterations, so any
process holding one (the dataset, the loader's workers) reads any slot.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from shardkit.errors import MemberTooLargeError, UsageError
from shardkit.io.base import SourceOptions
from shardkit.read.catalog import ShardCatalog
from shardkit.read.decode import Decoder
from shardkit.read.plan import ReadPlan
from shardkit.read.resume.elastic import LevelPlan
from shardkit.read.resume.restore import SlotRestorer
from shardkit.read.resume.state import Level
from shardkit.read.shuffle import ShuffleBuffer, round_robin
from shardkit.read.split import skip_samples
from shardkit.read.pieces import Located, OnError, PieceReader
from shardkit.world import World

Sample = dict[str, Any]

log = logging.getLogger(__name__)


def located_nbytes(located: Located) -> int:
    """A sample's size as stored (tar headers included): O(1), and the same
    figure the offset index gives without reading the sample."""
    raw = located[2]
    return raw.end - raw.start


def _as_dicts(located: Iterator[tuple[int, Located]], catalog: ShardCatalog) -> Iterator[tuple[int, Sample, str]]:
    for count, (shard, _, raw) in located:
        sample: Sample = {"__key__": raw.key}
        sample.update(raw.fields)
        yield count, sample, catalog.url(shard)


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tuple(value.shape)
    return None


def _ragged_field(samples: list[Any], path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], int, int] | None:
    """The first field (as a key path) whose tensors differ in shape across
    ``samples``, with the two sample numbers that differ; None if none does."""
    first = samples[0]
    if isinstance(first, dict):
        for key in first:
            if all(isinstance(s, dict) and key in s for s in samples):
                found = _ragged_field([s[key] for s in samples], path + (key,))
                if found is not None:
                    return found
        return None
    if isinstance(first, (tuple, list)) and not isinstance(first, str):
        if all(isinstance(s, (tuple, list)) and len(s) == len(first) for s in samples):
            for i in range(len(first)):
                found = _ragged_field([s[i] for s in samples], path + (i,))
                if found is not None:
                    return found
        return None
    shape = _shape(first)
    if shape is None:
        return None
    for j, value in enumerate(samples[1:], 1):
        other = _shape(value)
        if other is not None and other != shape:
            return path, 0, j
    return None


def _sample_name(sample: Any, number: int) -> str:
    key = sample.get("__key__") if isinstance(sample, dict) else None
    return f"sample {key!r}" if isinstance(key, str) else f"sample {number} of the batch"


def collate_samples(samples: list[Any], *, collate: Callable[[list[Any]], Any] = default_collate) -> Any:
    """``collate(samples)``, with a clear error when a field's tensors
    differ in shape (images of different sizes, say), which torch reports
    as a bare ``RuntimeError`` (in a worker: "Trying to resize storage that
    is not resizable").

    Args:
        samples: The samples of one batch.
        collate: The collation (default ``torch.utils.data.default_collate``).

    Returns:
        The batch.

    Raises:
        UsageError: A field's tensors differ in shape; names the field, two
            shapes and the remedies.
    """
    try:
        return collate(samples)
    except RuntimeError as exc:
        found = _ragged_field(samples)
        if found is None:
            raise
        path, a, b = found
        field = ".".join(map(str, path)) or "<sample>"
        top = path[0] if path and isinstance(path[0], str) else "jpg"  # the sample dict's field

        def value(sample: Any) -> Any:
            for part in path:
                sample = sample[part]
            return sample

        raise UsageError(
            f"cannot batch field {field!r}: its tensors differ in shape, {_shape(value(samples[a]))} in "
            f"{_sample_name(samples[a], a)} and {_shape(value(samples[b]))} in {_sample_name(samples[b], b)}. "
            "A batch stacks each field, so give it one size: decode and crop the image to a fixed size, e.g. "
            f"ShardDataset(..., decode=shardkit.Decoder(image=None), map=shardkit.transforms.MapField({top!r}, "
            "shardkit.transforms.DecodeRandomResizedCrop(224))), or keep the samples as a list "
            "(ShardDataset(..., batch_size=64, collate=list) with make_loader(dataset, batch_size=None))"
        ) from exc


@dataclass(frozen=True, kw_only=True, eq=False)
class SlotReader:
    """Builds the item stream of any slot of one dataset.

    Attributes:
        catalog: The shards.
        plan: Which pieces each slot reads.
        source_options: Storage options.
        on_error: The fault policy (see :mod:`.pieces`).
        verify_checksums: Check samples against their index's checksums.
        read_ahead_bytes: Read-ahead budget of one slot (shared by its
            ``interleave`` streams).
        decoder: Decodes each sample dict, or None for raw bytes.
        map: Applied to each (decoded) sample, or None.
        batch_size: Samples per batch, or None for single samples.
        collate: Turns a list of samples into a batch (None: torch's
            ``default_collate``).
        partial_batches: Yield the last, smaller batch.
    """

    catalog: ShardCatalog
    plan: ReadPlan
    source_options: SourceOptions
    on_error: OnError
    read_ahead_bytes: int
    verify_checksums: bool = False
    decoder: Decoder | None = None
    map: Callable[[Sample], Any] | None = None
    batch_size: int | None = None
    collate: Callable[[list[Any]], Any] | None = None
    partial_batches: bool = True

    def items(
        self,
        world: World,
        *,
        epoch: int,
        base: tuple[Level, ...] = (),
        count: int = 0,
        on_skip: Callable[[Exception], None],
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
        """
        opts = self.plan.options
        reader = PieceReader(
            self.catalog,
            on_error=self.on_error,
            verify_checksums=self.verify_checksums,
            on_skip=on_skip,
            options=self.source_options,
            read_ahead_bytes=max(self.read_ahead_bytes // opts.interleave, 1),
        )
        raws: Iterator[Located]
        if not base and count == 0:
            raws = fresh_raws(self.plan, reader, world, epoch=epoch)
        else:
            restorer = SlotRestorer(self.plan, reader, epoch=epoch)
            raws = restored_raws(restorer, world, restorer.level_plan(base), count=count)
        samples = _as_dicts(zip(itertools.count(count + 1), raws), self.catalog)
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


def fresh_raws(plan: ReadPlan, reader: PieceReader, world: World, *, epoch: int) -> Iterator[Located]:
    """A slot's raw samples from the start of ``epoch``: its read streams,
    mixed (``interleave``), through its seeded shuffle buffer."""
    streams = [reader.read(plan.pieces(world, epoch=epoch, part=p)) for p in range(plan.options.interleave)]
    raws: Iterator[Located] = streams[0] if len(streams) == 1 else round_robin(streams)
    buffer = plan.shuffle_buffer(world, epoch=epoch, nbytes=located_nbytes)
    return raws if buffer is None else buffer.shuffle(raws)


def restored_raws(restorer: SlotRestorer, world: World, level: LevelPlan, *, count: int) -> Iterator[Located]:
    """A slot's raw samples after the first ``count`` it delivered at
    ``level``: the replay gives where each read stream was and what the
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
    streams = [restorer.reader.read(p) for p in pieces]
    raws: Iterator[Located] = streams[0] if len(streams) == 1 else round_robin(streams, first=replay.next_part)
    return raws if buffer is None else buffer.shuffle(raws, resident=resident, held=replay.held)


def finish_items(
    samples: Iterator[tuple[int, Sample, str]],
    *,
    on_error: OnError,
    on_skip: Callable[[Exception], None],
    decoder: Decoder | None,
    map: Callable[[Sample], Any] | None,  # noqa: A002 - the reader's name for it
    batch_size: int | None,
    collate: Callable[[list[Any]], Any] | None,
    partial_batches: bool,
) -> Iterator[tuple[int, Any]]:
    """The last stages of a slot's stream: decode, map, batch. Items keep
    the slot's delivered count (a batch, its last sample's). ``samples``
    come with their shard's URL, for errors."""
    out: Iterator[tuple[int, Any]]
    if decoder is None and map is None:
        out = ((n, s) for n, s, _ in samples)
    else:
        out = _decoded(samples, decoder, map, on_error, on_skip)
    if batch_size is not None:
        out = _batches(out, batch_size, default_collate if collate is None else collate, partial_batches)
    return out


def _decoded(
    samples: Iterator[tuple[int, Sample, str]],
    decoder: Decoder | None,
    fn: Callable[[Sample], Any] | None,
    on_error: OnError,
    on_skip: Callable[[Exception], None],
) -> Iterator[tuple[int, Any]]:
    """Decode and map each sample. A member over a limit
    (:class:`~shardkit.errors.MemberTooLargeError`, from the decoder or a
    transform in ``map``) is a data fault: raised naming the shard, or under
    ``on_error="skip"`` logged, counted and the sample dropped."""
    for n, sample, url in samples:
        try:
            if decoder is not None:
                sample = decoder(sample, path=url)
            yield n, (sample if fn is None else fn(sample))
        except MemberTooLargeError as exc:
            error = exc if exc.path is not None else exc.located(path=url, member=exc.member)
            if on_error == "raise":
                raise error from None
            log.warning("skipping sample (on_error='skip'): %s", error)
            on_skip(error)


def _batches(
    samples: Iterator[tuple[int, Any]], size: int, collate: Callable[[list[Any]], Any], partial: bool
) -> Iterator[tuple[int, Any]]:
    while True:
        batch = list(itertools.islice(samples, size))
        if not batch or (len(batch) < size and not partial):
            return
        yield batch[-1][0], collate_samples([s for _, s in batch], collate=collate)
