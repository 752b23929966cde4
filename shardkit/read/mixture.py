"""What a dataset reads, resolved: one dataset, or a mixture of streams.

:func:`resolve_sources` turns the ``source`` given to
:class:`~shardkit.ShardDataset` into a :class:`Mixture`: one dataset is a
mixture of one source that takes the whole epoch
(:class:`~shardkit.read.plan.WholeDataset`); a list of
:class:`~shardkit.read.schedule.Stream` s gives catalogs and a
:class:`~shardkit.read.schedule.MixSchedule`, refusing bad input with the
stream's name. A mixture of streams records its configuration in reader
states; one dataset read alone records none (``"mixture": null``), as states
always had it. :class:`Mixture` records the configuration in reader states
(``"mixture"``: each stream's name, dataset fingerprint, size, weight and
``samples``, and ``samples_per_epoch``) and, given a state saved under
another configuration, finishes the state's epoch under the recorded one
(:meth:`Mixture.with_recorded`).

**Changing a mixture at a checkpoint.** Loading a state whose recorded
mixture differs from the dataset's (other weights, counts or
``samples_per_epoch``, streams added) finishes the state's epoch exactly as
recorded, with its streams in their recorded order, and starts the new
mixture at the next epoch. A new stream joins then. A recorded stream that
the dataset lacks is refused, naming it. Walk positions after the change
follow from the shares each epoch had in this process (so a stream's walk
continues where the recorded epoch left it), which a later process that
starts after the change does not know; across a change, a few samples of a
stream may be taken again before its pass ends.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import StateError, UsageError
from shardkit.format.appended import Appended
from shardkit.io.base import SourceOptions
from shardkit.read.blocks import BlockCatalog, BlockSchedule, TokenBlocks
from shardkit.read.catalog import ShardCatalog, resolve_catalog
from shardkit.read.plan import WholeDataset
from shardkit.read.resume.state import ReaderState, dataset_fingerprint, saved_before_removal
from shardkit.read.schedule import MixSchedule, Stream, stream_tag, weight_from_record

log = logging.getLogger(__name__)

KEY_SAMPLES_PER_EPOCH = "samples_per_epoch"
KEY_STREAMS = "streams"
STREAM_KEYS = ("name", "fingerprint", "size", "weight", "samples")


def is_mixture(source: Any) -> bool:
    """Whether a dataset ``source`` is a list of streams (mixing stream and
    non-stream entries is refused)."""
    if not isinstance(source, (list, tuple)) or not any(isinstance(s, Stream) for s in source):
        return False
    if not all(isinstance(s, Stream) for s in source):
        raise UsageError(
            "a source list holds either shard paths or shardkit.Stream objects, not both: "
            "wrap every dataset of a mixture in shardkit.Stream(...)"
        )
    return True


@dataclass(frozen=True, eq=False)
class Mixture:
    """The sources a dataset reads, with their catalogs and schedule.

    Attributes:
        streams: The streams, in the order shares and ties go by; empty for
            one dataset read alone.
        catalogs: Each source's shards (with counts).
        source_options: Each source's storage options.
        fingerprints: Each stream's dataset fingerprint (empty for one
            dataset, whose fingerprint is taken when a state needs it: a
            dataset without counts has none).
        schedule: Shares per epoch.
        names: What ``__stream__`` holds for each stream; None for one dataset.
    """

    streams: tuple[Stream, ...]
    catalogs: tuple[ShardCatalog, ...]
    source_options: tuple[SourceOptions, ...]
    fingerprints: tuple[str, ...]
    schedule: MixSchedule | WholeDataset | BlockSchedule
    names: tuple[Any, ...] | None

    @classmethod
    def alone(cls, catalog: ShardCatalog, source_options: SourceOptions) -> Mixture:
        """One dataset read alone: one source taking every epoch whole."""
        return cls((), (catalog,), (source_options,), (), WholeDataset(), None)

    @property
    def seed_words(self) -> tuple[tuple[int, ...], ...]:
        """Each source's extra shuffle seed words: a stream's seed word
        (from its fingerprint, so it does not depend on the list order);
        none for one dataset."""
        if not self.streams:
            return ((),)
        return tuple((stream_tag(f),) for f in self.fingerprints)

    def record(self) -> dict[str, Any] | None:
        """The configuration as JSON data (what a state holds); None for one dataset."""
        schedule = self.schedule
        if not isinstance(schedule, MixSchedule):
            return None
        return {
            KEY_SAMPLES_PER_EPOCH: schedule.samples_per_epoch,
            KEY_STREAMS: [
                {
                    "name": s.name,
                    "fingerprint": f,
                    "size": size,
                    "weight": s.weight_record(),
                    "samples": s.samples,
                }
                for s, f, size in zip(self.streams, self.fingerprints, schedule.sizes)
            ],
        }

    def fingerprint(self, record: Mapping[str, Any] | None, known_shards: int | None = None) -> str:
        """What a state names the data by: the dataset's fingerprint (that of
        its revision of ``known_shards`` shards, before an append), or a
        mixture's configuration's (``record``, the one its epoch is read under).

        Raises:
            UsageError: One dataset without sample counts and offset indexes.
        """
        if record is not None:
            return mixture_fingerprint(record)
        for before in self._appended() if known_shards is not None else ():
            if before.num_shards == known_shards:
                return before.fingerprint
        return dataset_fingerprint(self.catalogs[0])

    def _appended(self) -> tuple[Appended, ...]:
        """One dataset's revisions before appends (fingerprint, shard count); none for a mixture or token blocks."""
        catalog = self.catalogs[0]
        if self.streams or isinstance(catalog, BlockCatalog) or catalog.manifest is None:
            return ()
        return catalog.manifest.appended

    def known_shards(self, state: ReaderState) -> tuple[int, int] | None:
        """``(epoch, n)`` when ``state`` was saved from this dataset as it was
        before shards were appended to it (its first ``n`` shards): the
        state's epoch is then read over those alone, the next ones over all."""
        found = [a.num_shards for a in self._appended() if a.fingerprint == state.fingerprint]
        return (state.epoch, found[-1]) if found else None

    def state_fingerprint(self, state: ReaderState) -> str:
        """The fingerprint ``state`` must carry to be of these sources (a
        mixture's streams are compared one by one on load).

        Raises:
            StateError: A mixture's state for one dataset, or the reverse.
        """
        if state.mixture is None and self.streams:
            raise StateError(
                "reader state is of one dataset, and this dataset is a mixture of streams: "
                "create the dataset with the source the state was saved from"
            )
        if state.mixture is not None and not self.streams:
            raise StateError(
                "reader state is of a mixture of streams, and this dataset reads one source: "
                "create the dataset with the same list of shardkit.Stream"
            )
        known = self.known_shards(state)
        return state.fingerprint if self.streams else self.fingerprint(None, known and known[1])

    def earlier_fingerprints(self, stream: int | None = None) -> tuple[str, ...]:
        """What one dataset (or a mixture's ``stream``) was before samples
        were removed from it (``shardkit remove``): a state of its then
        fingerprint is refused as one saved before a removal."""
        if self.streams and stream is None:
            return ()
        catalog = self.catalogs[0 if stream is None else stream]
        manifest = getattr(getattr(catalog, "catalog", catalog), "manifest", None)  # a token catalog wraps one
        return () if manifest is None else manifest.earlier_fingerprints

    def describe(self, epoch: int) -> str:
        """What ``repr`` of the dataset says of its data."""
        if not self.streams:
            catalog = self.catalogs[0]
            if isinstance(catalog, BlockCatalog):
                return catalog.describe()
            return f"{catalog.num_shards} shards, {catalog.num_samples} samples"
        return f"mixture of {len(self.streams)} streams, {self.samples_per_epoch(epoch)} samples per epoch"

    def samples_per_epoch(self, epoch: int) -> int:
        return sum(self.schedule.shares(epoch))

    def with_recorded(self, record: Mapping[str, Any] | None, epoch: int) -> Mixture:
        """This mixture, taking ``epoch``'s shares from a state's recorded
        configuration (see the module docstring); itself when they agree.

        Raises:
            StateError: A malformed record, or a recorded stream this
                mixture lacks (named).
        """
        if not self.streams or dict(record) == self.record():  # type: ignore[arg-type]
            return self
        assert record is not None  # a state of one dataset does not load into a mixture
        streams_data = record.get(KEY_STREAMS)
        if not isinstance(streams_data, list) or not streams_data:
            raise StateError("reader state: its 'mixture' has no 'streams' list")
        by_fingerprint = {f: i for i, f in enumerate(self.fingerprints)}
        recorded: list[Stream] = []
        index: list[int] = []
        for n, entry in enumerate(streams_data):
            if not isinstance(entry, Mapping) or set(entry) != set(STREAM_KEYS):
                raise StateError(f"reader state: mixture stream {n} must have keys {list(STREAM_KEYS)}")
            found = by_fingerprint.get(entry["fingerprint"])
            label = repr(entry["name"]) if entry["name"] is not None else f"number {n}"
            if found is None:
                for i, stream in enumerate(self.streams):
                    if entry["fingerprint"] in self.earlier_fingerprints(i):
                        raise saved_before_removal(epoch, f"stream {stream.label}")
                raise StateError(
                    f"reader state was saved with a mixture whose stream {label} (dataset fingerprint "
                    f"{str(entry['fingerprint'])[:16]}...) is not among this dataset's streams: add it back "
                    "to finish the epoch, or start the next epoch afresh without loading the state"
                )
            try:
                stream = Stream(
                    self.streams[found].source,
                    weight=weight_from_record(entry["weight"]),
                    samples=entry["samples"],
                    name=entry["name"],
                )
            except UsageError as exc:
                raise StateError(f"reader state: mixture stream {label}: {exc}") from exc
            recorded.append(stream)
            index.append(found)
        try:
            old = MixSchedule(
                tuple(recorded),
                tuple(self.schedule.sizes[i] for i in index),
                samples_per_epoch=record.get(KEY_SAMPLES_PER_EPOCH),
            )
        except UsageError as exc:
            raise StateError(f"reader state: its mixture is invalid: {exc}") from exc
        log.info(
            "the reader state's mixture differs from this dataset's: epoch %d finishes under the recorded "
            "mixture, the new one starts at epoch %d",
            epoch,
            epoch + 1,
        )
        assert isinstance(self.schedule, MixSchedule)
        schedule = MixSchedule(
            self.schedule.streams,
            self.schedule.sizes,
            samples_per_epoch=self.schedule.samples_per_epoch,
            override=(epoch, old, tuple(index)),
        )
        return Mixture(self.streams, self.catalogs, self.source_options, self.fingerprints, schedule, self.names)


    def check_balanced(self) -> None:
        """Refuse ``"balanced"`` mode without per-shard counts (a mixture's
        streams always have them).

        Raises:
            UsageError: One dataset of compressed shards, or without counts.
        """
        catalog = self.catalogs[0]
        if catalog.compressed:
            raise UsageError(
                "mode='balanced' needs per-shard sample counts, and compressed shards (.tar.gz, .tgz, "
                ".tar.zst) are read whole at shard granularity: use mode='exact' / 'infinite', or reshard "
                "them uncompressed with `shardkit write SRC DEST`"
            )
        if catalog.counts is None:
            raise UsageError(
                "mode='balanced' needs per-shard sample counts: index the shards in place once with "
                "`shardkit index SOURCE` and open SOURCE (its manifest), or use mode='exact' / 'infinite' at "
                "shard granularity"
            )

    def with_budget(self, budget: Any, *, seed: int) -> Mixture:
        """These sources read as token-budget batches or packed sequences
        (see :mod:`.budget`): each catalog's batches as the samples of a
        catalog of their own. A batch holds samples of one source; a
        mixture's ``weight`` s are then shares of batches, and its
        ``samples`` and ``samples_per_epoch`` count batches.

        Raises:
            UsageError: Declared ``lengths`` for a mixture (they name one
                dataset's samples), or what a catalog refuses.
        """
        from shardkit.read.budget import BatchCatalog

        if self.streams and getattr(budget, "lengths", None) is not None:
            raise UsageError("TokenBudget(lengths=...) gives one dataset's sample lengths: a mixture's sources "
                             "are planned from their token counts, so leave lengths out")  # fmt: skip
        catalogs = tuple(BatchCatalog(c, budget, seed=seed) for c in self.catalogs)
        if not self.streams:
            return Mixture.alone(catalogs[0], self.source_options[0])  # type: ignore[arg-type]
        assert isinstance(self.schedule, MixSchedule)
        schedule = MixSchedule(
            self.streams, tuple(c.num_samples for c in catalogs), samples_per_epoch=self.schedule.samples_per_epoch
        )
        fingerprints = tuple(c.fingerprint for c in catalogs)  # a state of samples does not load into batches
        return Mixture(self.streams, catalogs, self.source_options, fingerprints, schedule, self.names)

    def with_tokens(self, tokens: TokenBlocks, *, seed: int, shuffle: bool) -> Mixture:
        """These sources read as token blocks (see :mod:`.blocks`): each
        catalog's blocks as the samples of a catalog of their own. A mixture's
        ``weight`` s are then shares of blocks, so of tokens, and its
        ``samples`` and ``samples_per_epoch`` count blocks.

        Raises:
            UsageError: A source without token counts for ``tokens.field``.
        """
        catalogs = tuple(BlockCatalog(c, tokens, seed=seed, shuffle=shuffle) for c in self.catalogs)
        if not self.streams:
            return Mixture((), catalogs, self.source_options, (), BlockSchedule(catalogs[0]), None)
        assert isinstance(self.schedule, MixSchedule)
        schedule = MixSchedule(
            self.streams, tuple(c.num_blocks for c in catalogs), samples_per_epoch=self.schedule.samples_per_epoch
        )
        fingerprints = tuple(c.fingerprint for c in catalogs)  # a state of samples does not load into blocks
        return Mixture(self.streams, catalogs, self.source_options, fingerprints, schedule, self.names)


def mixture_fingerprint(record: Mapping[str, Any]) -> str:
    """What identifies a mixture's configuration (its record) in a state."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _stream_names(streams: Sequence[Stream]) -> tuple[Any, ...]:
    named = [s.name is not None for s in streams]
    if any(named) and not all(named):
        missing = next(i for i, s in enumerate(streams) if s.name is None)
        raise UsageError(
            f"stream number {missing} ({streams[missing].label}) has no name while others have: name every "
            "stream or none (then sample['__stream__'] is the stream's index)"
        )
    if not any(named):
        return tuple(range(len(streams)))
    names = [s.name for s in streams]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise UsageError(f"two streams are named {name!r}: give each stream its own name")
    return tuple(names)


def resolve_mixture(
    streams: Sequence[Stream],
    *,
    samples_per_epoch: int | None,
    source_options: SourceOptions,
) -> Mixture:
    """Resolve and check the streams of a mixture.

    Raises:
        UsageError: A stream without sample counts (no manifest), with
            compressed shards or no samples; the same dataset twice; names
            given to some streams only, or twice; bad weights or counts
            (see :class:`~shardkit.read.schedule.MixSchedule`).
        ManifestError: A stream's manifest is missing or invalid.
    """
    if not streams:
        raise UsageError("a mixture needs at least one shardkit.Stream")
    names = _stream_names(streams)
    catalogs = []
    options = []
    fingerprints: list[str] = []
    for stream in streams:
        opts = stream.source_options or source_options
        catalog = resolve_catalog(stream.source, options=opts)
        if catalog.compressed or catalog.counts is None or not catalog.has_indexes:
            what = "compressed shards are read whole" if catalog.compressed else "it has no manifest"
            raise UsageError(
                f"{stream.label}: mixing needs per-shard sample counts and offset indexes, and {what}: "
                "give the stream a dataset written by `shardkit write` (a directory or URL with manifest.json)"
            )
        if int(catalog.counts.sum()) == 0:
            raise UsageError(f"{stream.label} has no samples: leave it out of the mixture")
        fingerprint = dataset_fingerprint(catalog)
        if fingerprint in fingerprints:
            other = streams[fingerprints.index(fingerprint)]
            raise UsageError(
                f"{stream.label} reads the same dataset as {other.label}: give each dataset once "
                "(a larger weight reads it more often)"
            )
        catalogs.append(catalog)
        options.append(opts)
        fingerprints.append(fingerprint)
    sizes = tuple(int(c.counts.sum()) for c in catalogs)  # type: ignore[union-attr]
    schedule = MixSchedule(tuple(streams), sizes, samples_per_epoch=samples_per_epoch)
    return Mixture(tuple(streams), tuple(catalogs), tuple(options), tuple(fingerprints), schedule, names)


def resolve_sources(
    source: Any,
    *,
    samples_per_epoch: int | None,
    source_options: SourceOptions,
    interleave: int,
    fields: Sequence[str] | None = None,
) -> Mixture:
    """What ``ShardDataset(source, ...)`` reads: one dataset (a path, URL,
    pattern, list of shards or Manifest) or a list of streams to mix.

    Raises:
        UsageError: ``samples_per_epoch`` for one dataset, ``interleave`` for
            a mixture, or what :func:`resolve_mixture` refuses.
        ManifestError: A manifest is missing or invalid.
    """
    if not is_mixture(source):
        if samples_per_epoch is not None:
            raise UsageError("samples_per_epoch applies to a mixture: give a list of shardkit.Stream")
        return Mixture.alone(resolve_catalog(source, options=source_options, fields=fields), source_options)
    if interleave != 1:
        raise UsageError("interleave applies to one dataset: a mixture already reads each stream side by side")
    if fields is not None:
        raise UsageError("fields= applies to one dataset: read a mixture whole")
    return resolve_mixture(source, samples_per_epoch=samples_per_epoch, source_options=source_options)


#: What a mixture's state records of per-stream batches: their size.
PER_STREAM_KEY = "per_stream_batch_size"


def with_batch_record(record: dict[str, Any] | None, per_stream: int | None) -> dict[str, Any] | None:
    """A mixture's record as a state holds it: with the batch size of
    per-stream batches, which make another sequence of samples."""
    return record if record is None or per_stream is None else {**record, PER_STREAM_KEY: per_stream}


def without_batch_record(record: Mapping[str, Any] | None, per_stream: int | None) -> dict[str, Any] | None:
    """A state's mixture record less the batch size it was read in, which
    must be this reader's (``per_stream``: its per-stream batch size, or None).

    Raises:
        StateError: The state was read in other batches.
    """
    if record is None:
        return None
    out = dict(record)
    saved = out.pop(PER_STREAM_KEY, None)
    if saved != per_stream:

        def what(batch: object) -> str:
            return f"per-stream batches of {batch}" if batch is not None else "stratified batches"

        raise StateError(
            f"reader state was saved reading {what(saved)}, this dataset reads {what(per_stream)}: the batches are "
            "another sequence. Resume with the batching and batch_size it was saved with"
        )
    return out
