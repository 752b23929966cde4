"""``ShardDataset``: the streaming reader users put in their training loop.

It composes the pieces of :mod:`shardkit.read`: the catalog of shards
(:mod:`.catalog`), the epoch plan (:mod:`.split`), reading with read-ahead and
the fault policy (:mod:`.stream`), the swap-buffer shuffle (:mod:`.shuffle`)
and decoding (:mod:`.decode`).
"""

from __future__ import annotations

import copy
import itertools
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from shardkit.errors import StateError, UsageError
from shardkit.format.manifest import Manifest
from shardkit.read.catalog import ShardCatalog, resolve_catalog
from shardkit.read.decode import Decoder, ImageMode, make_decoder
from shardkit.read.prefetch import DEFAULT_READ_AHEAD_BYTES
from shardkit.read.restore import SlotRestorer
from shardkit.read.resume import (
    Level,
    ReaderState,
    catalog_fingerprint,
    check_compatible,
    rank_local_level,
    round_robin,
    start_for,
)
from shardkit.read.shuffle import ShuffleBuffer
from shardkit.io.base import SourceOptions
from shardkit.read.split import (
    MODES,
    SAMPLE_SHUFFLE_STREAM,
    Mode,
    Piece,
    assign_shards,
    plan_epoch,
    samples_per_rank,
    seed_sequence,
    skip_samples,
)
from shardkit.read.stream import ON_ERROR, Located, OnError, PieceReader
from shardkit.world import World, detect_rank, detect_worker

log = logging.getLogger(__name__)

#: Default number of samples held by the shuffle buffer.
DEFAULT_BUFFER_SIZE = 1000

Sample = dict[str, Any]


def _located_nbytes(located: Located) -> int:
    """A sample's size as stored (tar headers included): O(1), and the same
    figure the offset index gives without reading the sample."""
    raw = located[2]
    return raw.end - raw.start


class _Progress:
    """What this process's iteration has delivered (for ``state_dict()``)."""

    __slots__ = ("epoch", "base", "world", "count")

    def __init__(self) -> None:
        self.epoch = -1
        self.base: tuple[Level, ...] = ()
        self.world: World | None = None
        self.count = 0


class _Pending:
    """A loaded state waiting for the iteration of its epoch. Shared by
    reference between a dataset and its shallow copies (the loader's)."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state: ReaderState | None = None


def _as_dict(located: Iterator[tuple[int, Located]]) -> Iterator[tuple[int, Sample]]:
    for count, (_, _, raw) in located:
        sample: Sample = {"__key__": raw.key}
        sample.update(raw.fields)
        yield count, sample


class ShardDataset(IterableDataset):
    """Stream samples from tar shards, split across ranks and workers.

    Each epoch the shards are put in an order that is a pure function of
    ``(seed, epoch)``; the samples of all shards in that order form the epoch's
    global sequence, which is cut into one contiguous range per (rank,
    DataLoader worker) slot. With a manifest the cut is at sample precision:
    a slot may begin or end inside a shard, seeking there with the shard's
    offset index. Each slot reads its range with large sequential requests
    through a read-ahead thread and mixes it with a shuffle buffer seeded from
    ``(seed, epoch, rank, worker)``. The same seed, epoch, world size and
    worker count give the same samples in the same order on every run.

    Modes:
        * ``"exact"``: every sample exactly once per epoch over all ranks and
          workers; per-rank counts differ by at most one (for evaluation).
        * ``"balanced"`` (default): every rank gets ``num_samples //
          world_size`` samples, so all ranks take the same number of steps;
          the remainder (fewer than ``world_size`` samples, different ones
          each epoch) is **dropped**. With ``pad=True`` every rank gets
          ``ceil(num_samples / world_size)`` instead and the shortfall is
          filled by repeating samples from the start of the epoch's sequence.
        * ``"infinite"``: an endless stream; when a slot finishes its share of
          an epoch it goes on with the next epoch's (freshly permuted) share.

    Without a manifest (a list or brace pattern of shard paths without
    ``.idx`` sidecars) sample counts are unknown, so the reader works at
    shard granularity: whole shards are dealt round-robin to slots, which
    loses per-rank balance (``"balanced"`` is refused), ``len()``, and
    parallelism when there are fewer shards than slots (idle slots); and a
    corrupt shard cannot be resumed after the fault.

    Checkpoints: :meth:`state_dict` / :meth:`load_state_dict` (and those of
    the loader :func:`~shardkit.make_loader` builds, which count what reached
    the training loop) save a slot's position as a delivered-sample count.
    The same topology resumes with the identical sequence; another world
    size or worker count splits the rest of the epoch over the new slots, in
    every mode. In ``"infinite"`` mode, where slots may be in different
    epochs at a checkpoint, the new slots first share the rest of each epoch
    some old slot had begun (oldest first), then go on with whole epochs.
    See :mod:`shardkit.read.resume`.
    Resuming assumes no faults were skipped (``on_error="skip"``) before the
    checkpoint; after skipped faults the restored buffer is not the one the
    run had, so a few samples near the fault may repeat or be missed.

    Example, one process per GPU under ``torchrun``::

        torch.distributed.init_process_group("nccl")
        ds = shardkit.ShardDataset("data/train", mode="balanced", seed=0,
                                   decode="tensor", map=my_transform)
        loader = shardkit.make_loader(ds, batch_size=256, num_workers=8, pin_memory=True)
        for epoch in range(num_epochs):
            ds.set_epoch(epoch)
            for batch in loader:
                ...

    Args:
        source: A manifest path or URL, a dataset directory (or URL ending in
            ``/``) holding ``manifest.json``, a :class:`~shardkit.Manifest`, a
            brace pattern (``data/shard-{000000..000099}.tar``), one shard, or
            a list of shard paths/URLs.
        mode: ``"exact"``, ``"balanced"`` or ``"infinite"``.
        seed: Seed of all randomness (shard order and sample shuffle); >= 0.
        shuffle: Permute shards per epoch and shuffle samples in a buffer.
            False reads in manifest order.
        buffer_size: Samples held by the shuffle buffer (per worker).
        buffer_bytes: Optional byte cap on the shuffle buffer (per worker),
            counting samples at their stored size (tar headers included).
        pad: In ``"balanced"`` mode, pad by repetition instead of dropping.
        interleave: Streams each worker reads at once: its share of the epoch
            is cut into this many contiguous parts (usually in different
            shards), read side by side and mixed sample by sample before the
            shuffle buffer. Improves shuffle quality at the same buffer size
            when shards are internally homogeneous (see the reader benchmark),
            at the cost of this many read streams per worker (more seeking on
            disks); the read-ahead budget is shared between them.
        rank: This process's rank; default from ``torch.distributed`` when
            initialized, else ``RANK``, else 0. Create the dataset after
            ``init_process_group``.
        world_size: Number of ranks, detected like ``rank``.
        epoch: Starting epoch (see :meth:`set_epoch`).
        decode: None for raw bytes; ``"pil"`` / ``"tensor"`` for the standard
            decoders with images as PIL images or uint8 tensors; or a
            :class:`~shardkit.read.decode.Decoder`.
        map: A function applied to each (decoded) sample dict, e.g. a
            torchvision transform wrapper; runs in the worker.
        batch_size: Batch samples in the worker (then use the DataLoader with
            ``batch_size=None``); None yields single samples.
        collate: Turns a list of samples into a batch; default
            ``torch.utils.data.default_collate`` (bytes and str fields stay
            lists).
        partial_batches: Yield each worker's last, smaller batch (else drop it).
        on_error: ``"raise"`` (default) raises
            :class:`~shardkit.CorruptShardError` naming shard, member and
            offset; ``"skip"`` logs a warning, counts the fault in
            :attr:`num_skipped`, and goes on with the next readable sample.
        source_options: Storage options; ``chunk_bytes`` (default 4 MiB) is
            the size of one read request.
        read_ahead_bytes: Byte budget of each worker's read-ahead thread.

    Raises:
        UsageError: Invalid options, or ``"balanced"`` mode without sample
            counts.
        ManifestError: The manifest is missing or invalid.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str] | Manifest,
        *,
        mode: Mode = "balanced",
        seed: int = 0,
        shuffle: bool = True,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        buffer_bytes: int | None = None,
        pad: bool = False,
        interleave: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int = 0,
        decode: ImageMode | Decoder | None = None,
        map: Callable[[Sample], Any] | None = None,  # noqa: A002 - the documented name
        batch_size: int | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        partial_batches: bool = True,
        on_error: OnError = "raise",
        source_options: SourceOptions | None = None,
        read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
    ):
        super().__init__()
        if mode not in MODES:
            raise UsageError(f"mode must be one of {MODES}, not {mode!r}")
        if on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        if seed < 0 or epoch < 0:
            raise UsageError(f"seed and epoch must be >= 0 (got seed={seed}, epoch={epoch})")
        if buffer_size < 0 or (buffer_bytes is not None and buffer_bytes <= 0):
            raise UsageError("buffer_size must be >= 0 and buffer_bytes > 0 (or None)")
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch_size must be >= 1 or None, not {batch_size}")
        if read_ahead_bytes <= 0:
            raise UsageError(f"read_ahead_bytes must be > 0, not {read_ahead_bytes}")
        if interleave < 1:
            raise UsageError(f"interleave must be >= 1, not {interleave}")
        if pad and mode != "balanced":
            raise UsageError("pad=True applies to mode='balanced' only")
        self.options = source_options or SourceOptions()
        self.catalog: ShardCatalog = resolve_catalog(source, options=self.options)
        if mode == "balanced" and self.catalog.counts is None:
            raise UsageError(
                "mode='balanced' needs per-shard sample counts: read a dataset with a manifest "
                "(or .idx sidecars), or use mode='exact' / 'infinite' at shard granularity"
            )
        self.mode: Mode = mode
        self.seed = seed
        self.shuffle = shuffle
        self.buffer_size = buffer_size
        self.buffer_bytes = buffer_bytes
        self.pad = pad
        self.interleave = interleave
        self.world = detect_rank(rank=rank, world_size=world_size)
        self.decoder = make_decoder(decode)
        self.map = map
        self.batch_size = batch_size
        self.collate = collate
        self.partial_batches = partial_batches
        self.on_error: OnError = on_error
        self.read_ahead_bytes = read_ahead_bytes
        # Shared with DataLoader worker processes (persistent ones included):
        # workers read the epoch at the start of each iteration and add to
        # the fault counter.
        # (Created with the spawn context's lock, which fork, forkserver and
        # spawn workers can all share.)
        shared = multiprocessing.get_context("spawn")
        self._epoch = shared.Value("q", epoch)
        self._skipped = shared.Value("q", 0)
        # Checkpoint bookkeeping: per process (the progress), and a loaded
        # state that the next iteration of its epoch starts from.
        self._progress = _Progress()
        self._pending = _Pending()
        self._tag_items = False  # the loader's copy yields (worker, count, item)
        self._worker_shift: Any = None  # the loader's copy: worker process i reads slot (i + shift) % workers

    # ------------------------------------------------------------ state

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next iteration reads (call before each epoch).

        Reaches DataLoader workers, persistent ones included, because the
        value lives in shared memory and is read when iteration starts.
        """
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, not {epoch}")
        pending = self._pending.state
        if pending is not None and pending.epoch != epoch:
            log.info("set_epoch(%d) drops the loaded state of epoch %d", epoch, pending.epoch)
            self._pending.state = None
        self._epoch.value = epoch

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    @property
    def num_skipped(self) -> int:
        """Faults skipped under ``on_error="skip"``, summed over all workers."""
        return int(self._skipped.value)

    def _count_skip(self, exc: Exception) -> None:
        with self._skipped.get_lock():
            self._skipped.value += 1

    @property
    def num_samples(self) -> int | None:
        """Samples this rank reads per epoch, or None if unknown / endless."""
        total = self.catalog.num_samples
        if total is None or self.mode == "infinite":
            return None
        return samples_per_rank(total, rank=self.world.rank, world_size=self.world.world_size, mode=self.mode, pad=self.pad)

    def __len__(self) -> int:
        """Samples this rank reads per epoch (single samples, finite modes only)."""
        count = self.num_samples
        if count is None or self.batch_size is not None:
            raise TypeError("len() is defined for single samples in 'exact'/'balanced' mode with sample counts")
        return count

    # ------------------------------------------------------------ plan

    def pieces(self, world: World, *, epoch: int, part: int = 0, num_parts: int = 1) -> Iterator[Piece]:
        """The pieces ``world``'s slot reads from ``epoch`` on (endless in
        ``"infinite"`` mode); with ``num_parts`` > 1, only part ``part`` of
        each epoch's share (see ``interleave``)."""
        epochs = itertools.count(epoch) if self.mode == "infinite" else (epoch,)
        counts = self.catalog.counts
        if counts is not None:
            total = int(counts.sum())
            if self.mode == "infinite" and total < world.num_slots * num_parts:
                raise UsageError(
                    f"mode='infinite' needs at least one sample per slot and stream: {total} samples for "
                    f"{world.world_size} ranks x {world.num_workers} workers x interleave {num_parts}"
                )
            for e in epochs:
                yield from plan_epoch(
                    counts,
                    world,
                    seed=self.seed,
                    epoch=e,
                    mode=self.mode,
                    shuffle=self.shuffle,
                    pad=self.pad,
                    part=part,
                    num_parts=num_parts,
                )
            return
        if self.mode == "infinite" and self.catalog.num_shards < world.num_slots * num_parts:
            raise UsageError(
                f"mode='infinite' without sample counts needs a shard per slot and stream: "
                f"{self.catalog.num_shards} shards for {world.world_size} ranks x {world.num_workers} workers "
                f"x interleave {num_parts}"
            )
        for e in epochs:
            shards = assign_shards(self.catalog.num_shards, world, seed=self.seed, epoch=e, shuffle=self.shuffle)
            for shard in shards[part::num_parts]:
                yield Piece(int(shard), 0, 0)

    # ------------------------------------------------------------ iteration

    def iter_slot(self, world: World, *, epoch: int, state: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """Samples (or batches) of one slot for ``epoch``.

        ``__iter__`` calls this with the current process's slot; calling it
        directly shows what any rank/worker would read.

        Args:
            world: The slot.
            epoch: The epoch.
            state: A reader state of ``epoch`` to resume from (as
                :meth:`load_state_dict` would), or None to start the epoch.

        Raises:
            StateError: An unusable state (see :meth:`load_state_dict`).
        """
        base: tuple[Level, ...] = ()
        count = 0
        if state is not None:
            parsed = ReaderState.from_dict(state)
            check_compatible(parsed, fingerprint=self.fingerprint, options=self._state_options())
            if parsed.epoch != epoch:
                raise StateError(f"reader state is of epoch {parsed.epoch}, not {epoch}")
            base, count = start_for(parsed, world)
        return (item for _, item in self._slot_stream(world, epoch=epoch, base=base, count=count))

    def _reader(self) -> PieceReader:
        return PieceReader(
            self.catalog,
            on_error=self.on_error,
            on_skip=self._count_skip,
            options=self.options,
            read_ahead_bytes=max(self.read_ahead_bytes // self.interleave, 1),
        )

    def shuffle_buffer(self, world: World, *, epoch: int, nbytes: Callable[[Any], int]) -> ShuffleBuffer[Any] | None:
        """A fresh shuffle buffer of ``world``'s slot for ``epoch`` (None
        without shuffling); ``nbytes`` sizes its items for ``buffer_bytes``."""
        if not (self.shuffle and self.buffer_size > 1):
            return None
        rng = np.random.Generator(
            np.random.PCG64(seed_sequence(self.seed, epoch, SAMPLE_SHUFFLE_STREAM, world.rank, world.worker))
        )
        return ShuffleBuffer(
            size=self.buffer_size,
            rng=rng,
            max_bytes=self.buffer_bytes,
            nbytes=nbytes if self.buffer_bytes is not None else None,
        )

    def _slot_stream(
        self, world: World, *, epoch: int, base: tuple[Level, ...], count: int
    ) -> Iterator[tuple[int, Any]]:
        """One slot's items, each with the slot's delivered count after it.

        With ``base`` levels or a ``count`` (a restored state), the slot's
        plan is the remainder the base levels left, and its first ``count``
        samples are skipped by replaying positions (see :mod:`.resume`).
        """
        reader = self._reader()
        parts = range(self.interleave)
        first = 0
        resident: list[Located] | None = None
        held = 0
        if not base and count == 0:
            pieces = [self.pieces(world, epoch=epoch, part=p, num_parts=self.interleave) for p in parts]
            buffer = self.shuffle_buffer(world, epoch=epoch, nbytes=_located_nbytes)
        else:
            restorer = SlotRestorer(self, reader, epoch=epoch)
            plan = restorer.level_plan(base)
            replay = restorer.replay(world, plan=plan, count=count)
            pieces = [skip_samples(restorer.part_pieces(world, plan, p), replay.consumed[p]) for p in parts]
            first = replay.next_part
            buffer = None
            if replay.buffer is not None:
                buffer = replay.buffer.follow(nbytes=_located_nbytes if self.buffer_bytes is not None else None)
                resident = restorer.read_resident(replay)
                held = replay.held
        streams = [reader.read(p) for p in pieces]
        raws: Iterator[Located] = streams[0] if len(streams) == 1 else round_robin(streams, first=first)
        if buffer is not None:
            raws = buffer.shuffle(raws, resident=resident, held=held)
        samples: Iterator[tuple[int, Any]] = _as_dict(zip(itertools.count(count + 1), raws))
        if self.decoder is not None:
            decoder = self.decoder
            samples = ((n, decoder(s)) for n, s in samples)
        if self.map is not None:
            fn = self.map
            samples = ((n, fn(s)) for n, s in samples)
        if self.batch_size is not None:
            samples = self._batches(samples)
        return samples

    def _batches(self, samples: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        if self.collate is None:
            from torch.utils.data import default_collate

            collate: Callable[[list[Any]], Any] = default_collate
        else:
            collate = self.collate
        assert self.batch_size is not None
        while True:
            batch = list(itertools.islice(samples, self.batch_size))
            if not batch or (len(batch) < self.batch_size and not self.partial_batches):
                return
            yield batch[-1][0], collate([s for _, s in batch])

    def __iter__(self) -> Iterator[Any]:
        world = detect_worker(self.world)
        if self._worker_shift is not None and world.num_workers > 1:
            shifted = (world.worker + int(self._worker_shift.value)) % world.num_workers
            world = world.with_worker(shifted, world.num_workers)
        epoch = self.epoch
        base: tuple[Level, ...] = ()
        count = 0
        pending = self._pending.state
        if pending is not None and pending.epoch == epoch:
            self._pending.state = None  # one iteration resumes; later ones start afresh
            base, count = start_for(pending, world)
        progress = self._progress
        progress.epoch, progress.base, progress.world, progress.count = epoch, base, world, count
        stream = self._slot_stream(world, epoch=epoch, base=base, count=count)
        if self._tag_items:
            return self._tagged(stream, world.worker, progress)
        return self._untagged(stream, progress)

    @staticmethod
    def _untagged(stream: Iterator[tuple[int, Any]], progress: _Progress) -> Iterator[Any]:
        for count, item in stream:
            progress.count = count
            yield item

    @staticmethod
    def _tagged(stream: Iterator[tuple[int, Any]], worker: int, progress: _Progress) -> Iterator[Any]:
        for count, item in stream:
            progress.count = count
            yield worker, count, item

    # ------------------------------------------------------------ checkpoint

    def require_index(self) -> np.ndarray:
        """Per-shard sample counts, checking that offset indexes exist too.

        Raises:
            UsageError: Without them (no manifest and no ``.idx`` sidecars).
        """
        counts = self.catalog.counts
        if counts is None or self.catalog.index_urls is None:
            raise UsageError(
                "checkpoint/resume needs per-shard sample counts and offset indexes: read a dataset with a "
                "manifest (or .idx sidecars)"
            )
        return counts

    @property
    def fingerprint(self) -> str:
        """What identifies this dataset's content in a state."""
        counts = self.require_index()
        manifest = self.catalog.manifest
        return catalog_fingerprint(
            self.catalog.urls, counts.tolist(), None if manifest is None else manifest.fingerprint
        )

    def _state_options(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "buffer_size": self.buffer_size,
            "buffer_bytes": self.buffer_bytes,
            "pad": self.pad,
            "interleave": self.interleave,
        }

    def make_state(
        self, *, base: tuple[Level, ...], world: World, counts: Sequence[int | None], next_worker: int = 0
    ) -> dict[str, Any]:
        """A state for the current epoch: ``base`` levels, then ``world``'s
        rank with its workers' delivered ``counts`` (None where unknown) and
        the worker its loader takes the next batch from."""
        levels = base + (rank_local_level(world, counts, next_worker=next_worker),)
        return ReaderState(self.fingerprint, self._state_options(), self.epoch, levels).to_dict()

    def state_dict(self) -> dict[str, Any]:
        """This process's position in the epoch (torchdata ``Stateful`` protocol).

        In the main process with ``num_workers=0`` (or inside a DataLoader
        worker, as ``StatefulDataLoader`` calls it) this is what the
        iteration has handed out so far. With worker processes, take the
        state from the loader of :func:`~shardkit.make_loader` instead, which
        counts what reached the training loop.

        Returns:
            A small JSON-serializable dict (see :mod:`shardkit.read.resume`).

        Raises:
            UsageError: The dataset has no sample counts and offset indexes.
        """
        progress = self._progress
        pending = self._pending.state
        if pending is not None and pending.epoch == self.epoch:
            return pending.to_dict()
        if progress.world is not None and progress.epoch == self.epoch:
            counts: list[int | None] = [None] * progress.world.num_workers
            counts[progress.world.worker] = progress.count
            return self.make_state(base=progress.base, world=progress.world, counts=counts)
        return ReaderState(self.fingerprint, self._state_options(), self.epoch, ()).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` at the next iteration (torchdata ``Stateful``).

        Sets the epoch to the state's. With the same world size and workers
        the next iteration continues exactly where the state was taken; with
        another topology (which needs a state knowing every old rank, see
        :func:`shardkit.read.resume.merge_states`) the new slots share what
        the epoch had not yet delivered (in ``"infinite"`` mode: what each
        epoch in flight had not, then whole epochs). A later
        :meth:`set_epoch` to another epoch drops the loaded state.

        Raises:
            StateError: A malformed state, or one from another dataset or
                with different options (the message names the mismatch).
            UsageError: The dataset has no sample counts and offset indexes.
        """
        parsed = ReaderState.from_dict(state)
        check_compatible(parsed, fingerprint=self.fingerprint, options=self._state_options())
        if parsed.levels and parsed.levels[-1].world_size != self.world.world_size:
            # Only a complete state can move to another world size; say so now, not in a worker.
            start_for(parsed, self.world.with_worker(0, 1))
        self._pending.state = parsed
        self._progress.world = None
        self._epoch.value = parsed.epoch

    def _tagged_copy(self) -> ShardDataset:
        """A shallow copy (sharing epoch, counters and loaded state) whose
        items carry ``(worker, delivered count, item)`` for the loader."""
        clone = copy.copy(self)
        clone._tag_items = True
        clone._worker_shift = multiprocessing.get_context("spawn").Value("q", 0)
        return clone

    def pending_start(self, world: World) -> tuple[tuple[Level, ...], int, int]:
        """Where ``world``'s slot starts the next iteration: the loaded
        state's levels before the slot's, its delivered count, and the worker
        the rank's loader took its next batch from (0 on another topology)."""
        pending = self._pending.state
        if pending is None or pending.epoch != self.epoch:
            return (), 0, 0
        base, count = start_for(pending, world)
        same = len(base) == len(pending.levels) - 1
        return base, count, pending.levels[-1].first_worker(world.rank) if same else 0

    def drop_pending(self) -> None:
        """Forget a loaded state (its iteration has started)."""
        self._pending.state = None

    def __repr__(self) -> str:
        return (
            f"ShardDataset({self.catalog.num_shards} shards, {self.catalog.num_samples} samples, mode={self.mode!r}, "
            f"seed={self.seed}, rank={self.world.rank}/{self.world.world_size})"
        )
