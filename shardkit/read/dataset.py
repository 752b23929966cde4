"""``ShardDataset``: the streaming reader users put in their training loop.

It composes the catalog of shards (:mod:`.catalog`), the reader options (:mod:`.options`), the plan
they give (:mod:`.plan`) and one slot's items (:mod:`.slot`: read-ahead, faults, the swap-buffer
shuffle, decoding), and adds what is per process: the epoch, the skip counter, checkpoints.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from shardkit.errors import StateError, UsageError
from shardkit.format.manifest import Manifest
from shardkit.io.base import SourceOptions
from shardkit.read.blocks import TokenBlocks
from shardkit.read.budget import TokenBudget
from shardkit.read.catalog import ShardCatalog
from shardkit.read.counters import SharedCounters
from shardkit.read.decode import Decoder, ImageMode
from shardkit.read.frameworks import SplitWatch
from shardkit.read.mixture import Mixture, resolve_sources, with_batch_record, without_batch_record
from shardkit.read.notebook import STREAM, notebook_view
from shardkit.read.options import DEFAULT_BUFFER_SIZE, OutputOptions, ReaderOptions, check_count, check_flag, grouped
from shardkit.read.pieces import ON_ERROR, OnError
from shardkit.read.plan import ReadPlan
from shardkit.read.prefetch import DEFAULT_READ_AHEAD_BYTES, closed_at_exit
from shardkit.read.resume.state import Level, ReaderState, check_compatible, rank_state, start_for
from shardkit.read.schedule import Stream
from shardkit.read.slot import Sample, SlotReader
from shardkit.read.split import Mode
from shardkit.world import World, detect_rank, detect_worker

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BUFFER_SIZE", "ShardDataset"]


class _Progress:
    """What this process's iteration has delivered (for ``state_dict()``)."""

    __slots__ = ("epoch", "base", "world", "count")

    def __init__(self) -> None:
        self.epoch = -1
        self.base: tuple[Level, ...] = ()
        self.world: World | None = None
        self.count = 0


#: Why ``len()`` of a dataset, or of its loader, is undefined.
NO_LENGTH_MESSAGE = (
    "len() needs a finite epoch with known sample counts: not mode='infinite', and shards with "
    "a manifest or offset indexes (`shardkit index SOURCE` makes them for published shards)"
)


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

    The dataset pickles (``pickle``, ``copy.deepcopy``, Ray), carrying its
    epoch and skip count as plain values. DataLoader workers started by
    ``fork``, ``spawn`` or ``forkserver`` share the epoch and the skip count
    with it, so :meth:`set_epoch` reaches persistent workers and
    :attr:`num_skipped` sums over workers.

    Example, one process per GPU under ``torchrun``::

        torch.distributed.init_process_group("nccl")
        ds = shardkit.ShardDataset("data/train", mode="balanced", seed=0,
                                   decode="tensor", map=my_transform)
        loader = shardkit.make_loader(ds, batch_size=256, num_workers=8, pin_memory=True)
        for epoch in range(num_epochs):
            ds.set_epoch(epoch)
            for batch in loader:
                ...

    Mixing: give a list of :class:`~shardkit.Stream` s instead of one
    source, each a dataset with a manifest and a ``weight`` (or an absolute
    ``samples`` count). Each epoch has ``samples_per_epoch`` samples, stream
    *i* giving exactly its share; each stream is read as a walk through its
    passes (no sample again before all were taken), split over ranks and
    workers like one dataset, shuffled in its own part of the buffer and
    interleaved by a stratified schedule, so every batch holds each stream
    in proportion (within ``1 + p (S - 2)`` samples for a stream of share
    *p* among *S* streams: 1 for two, under ``S - 1`` always).
    Each sample carries ``__stream__`` (the stream's name, default its
    index). Every mode, checkpoints (the state records the streams) and the
    loader work as for one dataset; per-rank counts in ``"exact"`` mode
    differ by at most the number of streams. See :mod:`shardkit.read.schedule`
    and :mod:`shardkit.read.mixture` (changing a mixture at a checkpoint)::

        ds = shardkit.ShardDataset(
            [shardkit.Stream("s3://bucket/web/", weight=0.7),
             shardkit.Stream("data/curated", weight={0: 0.3, 5: 0.1})],
            samples_per_epoch=1_000_000, mode="balanced", seed=0)

    Args:
        source: A manifest path or URL, a dataset directory (or URL ending in
            ``/``) holding ``manifest.json``, a :class:`~shardkit.Manifest`, a
            brace pattern (``data/shard-{000000..000099}.tar``), one shard, or
            a list of shard paths/URLs; or a list of
            :class:`~shardkit.Stream` s to mix.
        mode: ``"exact"``, ``"balanced"`` or ``"infinite"``.
        seed: Seed of all randomness (shard order and sample shuffle); >= 0.
        shuffle: Permute shards per epoch and shuffle samples in a buffer.
            False reads in manifest order.
        buffer_size: Samples held by the shuffle buffer (per worker).
        buffer_bytes: Optional byte cap on the shuffle buffer (per worker),
            counting samples at their stored size (tar headers included).
        pad: In ``"balanced"`` mode, pad by repetition instead of dropping.
        interleave: Read parts each worker reads at once: its share of the epoch
            is cut into this many contiguous parts (usually in different
            shards), read side by side and mixed sample by sample before the
            shuffle buffer. Improves shuffle quality at the same buffer size
            when shards are internally homogeneous (see the reader benchmark),
            at the cost of this many read parts per worker (more seeking on
            disks); the read-ahead budget is shared between them.
        batching: How a mixture's streams share the workers' batches:
            ``"stratified"`` (default), each in every batch; ``"per_stream"``
            (``"device_per_stream"``): every batch of one stream, the same
            (its own) on every rank at a step (:mod:`shardkit.read.slot`).
        rank: This process's rank; default from ``torch.distributed`` when
            initialized, else ``RANK``, else 0. Create the dataset after
            ``init_process_group``. Under ``accelerator.prepare`` a
            detected rank gives way: see :meth:`set_epoch`.
        world_size: Number of ranks, detected like ``rank``.
        replication: Consecutive ranks that read as one (a tensor-parallel
            group, see :meth:`~shardkit.World.replicated`); counts,
            checkpoints and :attr:`world` are then per group.
        epoch: Starting epoch (see :meth:`set_epoch`).
        decode: None for raw bytes; ``"pil"`` / ``"tensor"`` for the standard
            decoders with images as PIL images or uint8 tensors; or a
            :class:`~shardkit.read.decode.Decoder`.
        select: A predicate on each (decoded) sample dict, run in the worker
            after ``decode`` and before ``map`` (webdataset's ``.select``):
            a sample for which it returns false is dropped and counted in
            :attr:`num_filtered`. A dropped sample counts as consumed: a
            checkpoint's position includes it, so resuming gives every
            selected sample of the epoch exactly once (``"exact"`` mode:
            every selected sample once over all ranks). It must be a pure
            function of the sample. ``len()`` and :attr:`num_samples` count
            samples before ``select``, and in ``"balanced"`` mode ranks may
            then yield different numbers of samples (use ``"infinite"``
            mode with a fixed number of steps where ranks must stay in
            step). To filter on raw bytes before decoding, leave ``decode``
            None and decode in ``map``.
        map: A function applied to each (decoded, selected) sample dict, e.g.
            a torchvision transform wrapper; runs in the worker. Returns what
            the dataset yields (see :mod:`shardkit.transforms` for
            ``rename``/``to_tuple`` recipes).
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
            A damaged sample is left out whole: a partial sample is never
            yielded. A field that ``decode`` cannot decode (a broken image,
            a label that is no number) is such a fault too: raised as its
            decoder's error, with a note naming field, sample and shard.
        verify_checksums: Check every sample against the CRC-32 its offset
            index stores (``shardkit write`` stores one per sample), so a
            changed byte in a member's data is a fault naming the sample's
            key, under either policy. Costs one CRC-32 pass over the bytes
            read; indexes written before checksums existed are read
            unchecked.
        source_options: Storage options; ``chunk_bytes`` (default 4 MiB) is the size of one read request.
            A manifest's shards (a view's parents) must lie inside its folder or URL prefix (origin);
            ``allowed_prefixes`` names the places outside it the manifest may point to.
        fields: Read only these fields of each sample (e.g. ``["emb.npy"]``); of a view or extension,
            only the shards that hold them are read (column projection).
        read_ahead_bytes: Byte budget of each worker's read-ahead thread (a mixture shares it among its
            streams). Remote shards use at most 8 MiB of it per request the worker may have in flight.
        samples_per_epoch: Samples of each epoch of a mixture; default the
            sum of the streams' sizes (or of their ``samples``).
        tokens: A :class:`~shardkit.TokenBlocks`: yield 1-D ``torch.int64``
            (or its ``dtype``) blocks of ``block_size`` token ids cut from each epoch's token
            stream (documents in the epoch's order, ``eos`` after each)
            instead of samples (see :mod:`shardkit.read.blocks`). Blocks are
            then what every count says: modes, ``len()``, ``buffer_size``,
            checkpoints, and a mixture's shares (of tokens), ``samples`` and
            ``samples_per_epoch``. ``map`` gets each block tensor. Or a
            :class:`~shardkit.TokenBudget`: yield batches of whole samples
            bounded by tokens (see :mod:`shardkit.read.budget`), each sample
            decoded, selected and mapped, each batch then collated; the
            batches are then what every count says, as blocks are.
        options: The arguments from ``mode`` to ``batching`` as one
            :class:`~shardkit.ReaderOptions` (what decides the sample
            sequence, and so which checkpoints fit), instead of one by one.
        output: The arguments from ``decode`` to ``partial_batches`` as one
            :class:`~shardkit.OutputOptions`, instead of one by one.

    Raises:
        UsageError: Invalid options, or ``"balanced"`` mode without sample
            counts.
        ManifestError: The manifest is missing or invalid.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str] | Sequence[Stream] | Manifest,
        *,
        mode: Mode = "balanced",
        seed: int = 0,
        shuffle: bool = True,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        buffer_bytes: int | None = None,
        pad: bool = False,
        interleave: int = 1,
        batching: str = "stratified",
        rank: int | None = None,
        world_size: int | None = None,
        replication: int = 1,
        epoch: int = 0,
        decode: ImageMode | Decoder | None = None,
        select: Callable[[Sample], Any] | None = None,
        map: Callable[[Sample], Any] | None = None,  # noqa: A002 - the documented name
        batch_size: int | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        partial_batches: bool = True,
        on_error: OnError = "raise",
        verify_checksums: bool = False,
        source_options: SourceOptions | None = None,
        fields: Sequence[str] | None = None,
        read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
        samples_per_epoch: int | None = None,
        tokens: TokenBlocks | TokenBudget | None = None,
        options: ReaderOptions | None = None,
        output: OutputOptions | None = None,
    ):
        super().__init__()
        options = grouped(
            ReaderOptions,
            options,
            "options",
            mode=mode,
            seed=seed,
            shuffle=shuffle,
            buffer_size=buffer_size,
            buffer_bytes=buffer_bytes,
            pad=pad,
            interleave=interleave,
            batching=batching,
        )
        if on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        check_flag("verify_checksums", verify_checksums)
        check_count("epoch", epoch)
        check_count("read_ahead_bytes", read_ahead_bytes)
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, not {epoch}")
        if read_ahead_bytes <= 0:
            raise UsageError(f"read_ahead_bytes must be > 0, not {read_ahead_bytes}")
        output = grouped(
            OutputOptions,
            output,
            "output",
            decode=decode,
            select=select,
            map=map,
            batch_size=batch_size,
            collate=collate,
            partial_batches=partial_batches,
        )
        source_options = source_options or SourceOptions()
        self._options = options
        self._source_options = source_options
        self._world = detect_rank(rank=rank, world_size=world_size, replication=replication)
        self._split = SplitWatch(rank_given=rank is not None, endless=options.mode == "infinite", batched=output.batch_size is not None, replication=replication)  # fmt: skip
        mixture = resolve_sources(
            source, samples_per_epoch=samples_per_epoch, source_options=source_options, interleave=options.interleave,
            fields=None if fields is None else tuple(fields),
        )
        if tokens is not None:  # blocks or budget batches: the sources and the output they read as
            mixture, output = tokens.apply(mixture, output, seed=options.seed, shuffle=options.shuffle)
        if options.batching == "per_stream" and output.batch_size is None:
            raise UsageError("batching='per_stream' makes each batch of one stream in the DataLoader workers: "
                             "give the dataset batch_size= (and leave make_loader's batch_size None)")  # fmt: skip
        if options.mode == "balanced":
            mixture.check_balanced()
        self._mixture = mixture
        self._slots = SlotReader(
            catalogs=mixture.catalogs,
            source_options=mixture.source_options,
            seed_words=mixture.seed_words,
            names=mixture.names,
            schedule=mixture.schedule,
            options=options,
            on_error=on_error,
            verify_checksums=verify_checksums,
            read_ahead_bytes=read_ahead_bytes,
            output=output,
        )
        self._counters = SharedCounters(epoch)
        # Checkpoint bookkeeping: this process's progress, and a loaded state
        # that the next iteration of its epoch starts from.
        self._progress = _Progress()
        self._pending: ReaderState | None = None
        # A loaded state's mixture configuration, (epoch, record), which that epoch's states carry on.
        self._recorded: tuple[int, dict[str, Any]] | None = None

    # ------------------------------------------------------------ properties

    @property
    def options(self) -> ReaderOptions:
        """The options that decide what each slot reads (and which states fit)."""
        return self._options

    @property
    def source_options(self) -> SourceOptions:
        """The storage options (a mixture's streams may have their own)."""
        return self._source_options

    @property
    def catalog(self) -> ShardCatalog:
        """The shards read (with their sample counts, when known).

        Raises:
            UsageError: The dataset is a mixture (see :attr:`mixture`).
        """
        if self._mixture.streams:
            raise UsageError("a mixture has a catalog per stream: see dataset.mixture.catalogs")
        return self._mixture.catalogs[0]

    @property
    def plan(self) -> ReadPlan:
        """Which pieces each slot reads in each epoch (made from the catalog
        when asked: the dataset keeps nothing per shard).

        Raises:
            UsageError: The dataset is a mixture (each stream has a plan).
        """
        if self._mixture.streams:
            raise UsageError("a mixture has a plan per stream, made for each iteration")
        return self._slots.plans(self.epoch)[0]

    @property
    def mixture(self) -> Mixture | None:
        """The streams of a mixture (catalogs, schedule, names); None for one dataset."""
        return self._mixture if self._mixture.streams else None

    @property
    def world(self) -> World:
        """This process's rank and world size (as worker 0 of 1); with
        ``replication``, its group's number among the groups."""
        return self._world

    @property
    def batch_size(self) -> int | None:
        """Samples per batch made in the worker, or None for single samples."""
        return self._slots.output.batch_size

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._counters.epoch.value)

    @property
    def num_skipped(self) -> int:
        """Faults skipped under ``on_error="skip"``, summed over all workers."""
        return int(self._counters.skipped.value)

    @property
    def num_filtered(self) -> int:
        """Samples ``select`` filtered out, summed over all workers."""
        return int(self._counters.filtered.value)

    @property
    def num_samples(self) -> int | None:
        """Samples this rank reads in the current epoch, or None if unknown / endless."""
        return self._slots.samples_per_rank(self._world, epoch=self.epoch)

    def samples_per_worker(self, num_workers: int, *, world: World | None = None) -> list[int] | None:
        """Samples each of this rank's (or ``world``'s) ``num_workers`` DataLoader
        workers reads in the current epoch (worker 0 first), or None if unknown
        or endless. Each worker batches its own share, so a batch count is
        counted per worker (see ``len()`` of :func:`~shardkit.make_loader`'s loader)."""
        slots = [(world or self._world).with_worker(w, num_workers) for w in range(num_workers)]
        counts = [self._slots.samples_per_slot(slot, epoch=self.epoch) for slot in slots]
        return None if None in counts else counts  # type: ignore[return-value]

    def __len__(self) -> int:
        """Samples this rank reads per epoch (single samples, finite modes
        only); asked by accelerate's loader (as the ``Trainer`` does first),
        the whole stream's, as :meth:`set_epoch` says."""
        self._world = self._split.world(inspect.currentframe(), self._world, self.samples_per_worker)
        count = self.num_samples
        if count is None:
            raise TypeError(NO_LENGTH_MESSAGE)
        if self.batch_size is not None:
            raise TypeError(
                "len() counts samples, and this dataset batches in its DataLoader workers, each its own share: "
                "how many batches that makes depends on the worker count. len(make_loader(dataset, ...)) "
                "counts them; dataset.num_samples is the samples per epoch"
            )
        return count

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next iteration reads (call before each epoch).

        Reaches DataLoader workers, persistent ones included: the value lives
        in shared memory and is read when iteration starts. A loaded state of
        another epoch is dropped. An epoch that starts with the number the
        previous one started with logs a warning (once; not in ``"infinite"``
        mode or without shuffling).

        Called by accelerate's loader, which splits the stream across
        processes itself, a dataset that detected its rank becomes that
        whole stream (rank 0 of 1, its workers still dividing it), and each
        process logs once what that costs (:mod:`shardkit.read.frameworks`).

        Raises:
            UsageError: So called, and the dataset was given a rank among
                more than one (``rank=``, ``world_size=``).
        """
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, not {epoch}")
        self._world = self._split.world(inspect.currentframe(), self._world, self.samples_per_worker)
        pending = self._pending
        if pending is not None and pending.epoch != epoch:
            log.info("set_epoch(%d) drops the loaded state of epoch %d", epoch, pending.epoch)
            self._pending = None
        self._counters.epoch.value = epoch

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        world = detect_worker(self._world)
        epoch = self.epoch
        base: tuple[Level, ...] = ()
        count = 0
        pending = self._take_pending(epoch)
        if pending is not None:
            base, count = start_for(pending, world)
        return closed_at_exit(item for _, item in self._items(world, epoch=epoch, base=base, count=count))

    def iter_slot(self, world: World, *, epoch: int, state: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """Samples (or batches) of one slot for ``epoch``: what any rank and
        worker would read.

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
            parsed = self._parse_state(state)
            if parsed.epoch != epoch:
                raise StateError(f"reader state is of epoch {parsed.epoch}, not {epoch}")
            base, count = start_for(parsed, world)
        counters = self._counters
        items = self._slots.items(
            world, epoch=epoch, base=base, count=count, on_skip=counters.count_skip, on_filtered=counters.count_filtered
        )
        return (item for _, item in items)

    def _take_pending(self, epoch: int) -> ReaderState | None:
        """The loaded state if it is of ``epoch``, forgotten here: one
        iteration resumes it, later ones start afresh. (The loader takes it
        too, to hand it to its workers.)"""
        pending = self._pending
        if pending is None or pending.epoch != epoch:
            return None
        self._pending = None
        return pending

    def _items(self, world: World, *, epoch: int, base: tuple[Level, ...], count: int) -> Iterator[tuple[int, Any]]:
        """``world``'s items, each with the slot's delivered count after it,
        recorded as this process's progress. (The loader's workers read
        through this too.)"""
        progress = self._progress
        progress.epoch, progress.base, progress.world, progress.count = epoch, base, world, count
        counters = self._counters
        if world.worker == 0 and self._options.shuffle and self._options.mode != "infinite":
            # One slot per iteration notes its start: a fresh one of the epoch the last began repeats its order.
            if counters.start_epoch(epoch, resumed=bool(base or count)):
                log.warning(
                    "epoch %d starts again in the same order as the last: call dataset.set_epoch(epoch) before "
                    "each epoch (logged once)",
                    epoch,
                )
        items = self._slots.items(
            world, epoch=epoch, base=base, count=count, on_skip=counters.count_skip, on_filtered=counters.count_filtered
        )
        return _recorded(items, progress)

    # ------------------------------------------------------------ checkpoint

    def _identity(self, epoch: int) -> tuple[str, dict[str, Any] | None]:
        """What a state of ``epoch`` names the data by: a fingerprint, and a
        mixture's configuration (the one that epoch is read under)."""
        recorded = self._recorded
        record = recorded[1] if recorded is not None and recorded[0] == epoch else self._mixture.record()
        record = with_batch_record(record, self._slots.per_stream)
        return self._mixture.fingerprint(record, self._slots.known_at(epoch)), record

    def _parse_state(self, state: Mapping[str, Any]) -> ReaderState:
        parsed = ReaderState.from_dict(state)
        check_compatible(parsed, fingerprint=self._mixture.state_fingerprint(parsed), options=self._options,
                         earlier=self._mixture.earlier_fingerprints())  # fmt: skip
        return parsed

    def _rank_state(
        self, epoch: int, *, base: tuple[Level, ...], world: World, counts: list[int | None], next_worker: int = 0
    ) -> dict[str, Any]:
        """A state of ``epoch`` holding ``world``'s rank's counts (also what the loader saves)."""
        fingerprint, mixture = self._identity(epoch)
        return rank_state(
            fingerprint,
            self._options,
            epoch,
            base=base,
            world=world,
            counts=counts,
            next_worker=next_worker,
            mixture=mixture,
        )

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
        epoch = self.epoch
        pending = self._pending
        if pending is not None and pending.epoch == epoch:
            return pending.to_dict()
        progress = self._progress
        world = progress.world
        if world is not None and progress.epoch == epoch:
            counts: list[int | None] = [None] * world.num_workers
            counts[world.worker] = progress.count
            return self._rank_state(epoch, base=progress.base, world=world, counts=counts)
        fingerprint, mixture = self._identity(epoch)
        return ReaderState(fingerprint, self._options, epoch, (), mixture=mixture).to_dict()

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
            StateError: A malformed state, or one from another dataset, with
                other options or of another shuffle algorithm (the message
                names the mismatch).
            UsageError: The dataset has no sample counts and offset indexes.
        """
        parsed = self._parse_state(state)
        recorded = without_batch_record(parsed.mixture, self._slots.per_stream)
        active = self._mixture.with_recorded(recorded, parsed.epoch)
        self._recorded = None if active is self._mixture else (parsed.epoch, dict(recorded or {}))
        self._slots = dataclasses.replace(self._slots, schedule=active.schedule, known_shards=self._mixture.known_shards(parsed))
        if parsed.levels and parsed.levels[-1].world_size != self._world.world_size:
            # Only a complete state can move to another world size; say so now, not in a worker.
            start_for(parsed, self._world.with_worker(0, 1))
        self._pending = parsed
        self._progress.world = None
        self._counters.epoch.value = parsed.epoch

    def __repr__(self) -> str:
        return (f"ShardDataset({self._mixture.describe(self.epoch)}, mode={self._options.mode!r}, "
                f"seed={self._options.seed}, rank={self._world.rank}/{self._world.world_size})")

    def _repr_html_(self) -> str:  # a notebook shows a few samples and the counts (shardkit.preview)
        return notebook_view(STREAM, self)


def _recorded(items: Iterator[tuple[int, Any]], progress: _Progress) -> Iterator[tuple[int, Any]]:
    for count, item in items:
        progress.count = count
        yield count, item
