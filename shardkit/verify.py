"""``shardkit verify``: re-read every shard and check it against the manifest.

Checks, per shard: the file exists with the recorded size and SHA-256; it
parses as tar to the end-of-archive marker; it holds the recorded number of
samples; its offset index is well formed and matches the sample boundaries
found by parsing; and, when the index stores per-sample checksums, every
sample matches its checksum (so bit rot is named by the sample it hit).
In a dataset that records token counts (see :mod:`shardkit.format.tokens`),
the counts the index and the table record must be those of the samples read.
In a dataset written with ``compress_members`` (its manifest records
``member_compression``), every compressed member (``KEY.txt.gz``,
``KEY.txt.zst``) must also decompress, to at most ``max_member_bytes``
(the readers' limit, 256 MiB by default): it is inflated piece by piece
and the pieces dropped, so no member is ever held whole.

Entries that belong to no sample (directories, links, files without a
``KEY.EXT`` name such as ``README``; see :mod:`shardkit.format.tar`) are
skipped by every reader, as webdataset skips them: verify counts them per
shard and reports them as warnings, not failures.

A compressed shard (gzip or zstd, found by its first bytes, as the readers
find it: ``shardkit index`` counts such shards and writes them no offset
index) is stream-only: verify checks its size and SHA-256, inflates it piece
by piece and parses it to the end, and checks its sample count; it has no
offset index or per-sample checksums to compare, which verify reports as a
warning, not a failure.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from shardkit.errors import CorruptShardError, ManifestError, MemberTooLargeError, UsageError, VerifyError
from shardkit.format.compression import (
    DEFAULT_MAX_MEMBER_BYTES,
    MAGIC_BYTES,
    ChunkDecompressor,
    detect_compression,
    iter_decompressed,
    member_compression,
)
from shardkit.format.index import OffsetIndex
from shardkit.format.removed import Removed
from shardkit.format.manifest import Manifest, ShardEntry
from shardkit.format.tar import REWRITE_ADVICE, RawSample, SampleParser
from shardkit.format.tokens import TokenTally
from shardkit.io.base import SourceOptions
from shardkit.io.index import fetch_document_tokens, fetch_offset_index
from shardkit.io.local import HASH_CHUNK_BYTES
from shardkit.io.manifest import fetch_manifest
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, local_path
from shardkit.write.pool import group_size, in_groups, run_in_pool

#: Failed shards, and warnings, that a report lists (the lowest shard
#: numbers first); all of them are counted.
LISTED = 100


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_dataset` checked.

    Attributes:
        manifest: The dataset's manifest.
        num_shards_checked: Shards checked (all of them, unless ``fail_fast``
            stopped at a bad one).
        num_samples_checked: Samples checked, in the shards that passed
            (those removed by ``shardkit remove`` not counted).
        num_removed: Samples removed from the shards that passed: still in
            their tar files and indexes (checked with the rest), never read.
        num_entries_skipped: Tar entries that belong to no sample
            (directories, links, files without a ``KEY.EXT`` name), summed
            over the shards; the readers skip them.
        num_stream_only: Compressed shards, checked without an offset index.
        warnings: One line per shard holding such entries, and per
            compressed shard: the first :data:`LISTED` by shard number.
        failures: The failed shards' errors, the first :data:`LISTED` by
            shard number.
        num_failed: Shards that failed.
        num_warnings: Warnings in all (``warnings`` lists the first).
    """

    manifest: Manifest
    num_shards_checked: int
    num_samples_checked: int
    num_removed: int = 0
    num_entries_skipped: int = 0
    warnings: tuple[str, ...] = ()
    num_stream_only: int = 0
    failures: tuple[VerifyError, ...] = ()
    num_failed: int = 0
    num_warnings: int = 0

    def error(self) -> VerifyError:
        """One error for the failed shards: the first's message (and path),
        with how many others failed."""
        first = self.failures[0]
        more = self.num_failed - 1
        message = str(first) if not more else f"{first} (and {more} more failed shard{'s' if more > 1 else ''})"
        return VerifyError(message, path=first.path, failures=self.failures, num_failed=self.num_failed)


@dataclass(frozen=True)
class ShardCheck:
    """One shard's verification (:func:`verify_shard`).

    Attributes:
        number: The shard's position in the manifest.
        num_bytes: Its size in the manifest (for progress).
        num_samples: Samples it holds, less those removed (0 when it failed).
        num_removed: Samples removed from it (``shardkit remove``).
        error: Why it failed; None when it passed.
        skipped: Its entries that belong to no sample, if any.
        stream_only: Set when it is compressed (checked without an offset index).
    """

    number: int
    num_bytes: int
    num_samples: int = 0
    num_removed: int = 0
    error: VerifyError | None = None
    skipped: SkippedEntries | None = None
    stream_only: StreamOnlyShard | None = None


@dataclass(frozen=True)
class StreamOnlyShard:
    """A compressed shard: checked whole, without an offset index."""

    path: str
    kind: str

    def warning(self) -> str:
        """The line verify reports for the shard."""
        return (
            f"{self.path}: {self.kind}-compressed, stream-only: size, SHA-256, tar structure and sample count "
            "checked; no offset index or per-sample checksums to check (readers read it whole, shard by shard)"
        )


@dataclass(frozen=True)
class SkippedEntries:
    """A shard's tar entries that belong to no sample (skipped by the readers)."""

    path: str
    count: int
    first: str | None

    def warning(self) -> str:
        """The line verify reports for the shard."""
        return (
            f"{self.path}: {self.count} tar {'entry' if self.count == 1 else 'entries'} that belong to no sample "
            f"(directories, links, files without a KEY.EXT name; the first {self.first!r}) skipped, as every "
            "reader skips them"
        )


def _check_members(path: str, samples: list[RawSample], max_member_bytes: int | None) -> list[RawSample]:
    """Decompress each compressed member of ``samples`` (streaming, up to
    ``max_member_bytes``); return them."""
    for sample in samples:
        for ext, data in sample.fields.items():
            kind = member_compression(ext)[1]
            if kind is None:
                continue
            try:
                for _ in iter_decompressed(data, kind, max_bytes=max_member_bytes):
                    pass
            except MemberTooLargeError as exc:
                raise VerifyError(
                    f"{path}: member '{sample.key}.{ext}' of the sample at byte {sample.start} decompresses to "
                    f"more than {exc.limit:,} bytes (max_member_bytes={exc.limit}), which the readers refuse: "
                    "a decompression bomb, or a member too large; rewrite this shard, or raise the limit "
                    "(`shardkit verify --max-member-bytes`, Decoder(max_member_bytes=...)) if it is expected",
                    path=path,
                ) from None
            except ValueError as exc:
                raise VerifyError(
                    f"{path}: member '{sample.key}.{ext}' of the sample at byte {sample.start} does not "
                    f"decompress ({exc}); rewrite this shard",
                    path=path,
                ) from None
    return samples


def _load_index(path: str, index_path: str, entry: ShardEntry, stored: int, options: SourceOptions | None) -> OffsetIndex:
    try:
        index = fetch_offset_index(index_path, num_samples=stored, shard_bytes=entry.num_bytes, options=options)
    except (ManifestError, CorruptShardError, OSError) as exc:
        raise VerifyError(f"{path}: offset index unusable: {exc}", path=path) from exc
    return index


def _check_sums(path: str, index: OffsetIndex, first: int, samples: list[RawSample]) -> None:
    """Compare samples ``first, first + 1, ...`` with the index's checksums."""
    if index.checksums is None:
        return
    for k, sample in enumerate(samples, first):
        if k >= len(index.checksums):
            return  # more samples than the index lists: the count check names it
        stored = int(index.checksums[k])
        actual = sample.checksum()
        if actual != stored:
            raise VerifyError(
                f"{path}: sample {sample.key!r} at byte {sample.start} fails its checksum (stored {stored:08x}, "
                f"read {actual:08x}): its bytes changed after it was written; rewrite this shard",
                path=path,
            )


def verify_shard(
    manifest: Manifest,
    number: int,
    *,
    options: SourceOptions | None = None,
    max_member_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES,
) -> ShardCheck:
    """Check shard ``number`` of ``manifest``.

    Args:
        manifest: The dataset's manifest.
        number: The shard's position in it.
        options: How to read remote shards, and the locations outside the
            dataset its entries may name (``allowed_prefixes``).
        max_member_bytes: Most bytes a compressed member may decompress to
            (default 256 MiB, the readers' default; None: no limit).

    Returns:
        What was found; a bad shard is a check whose ``error`` names it and
        what is wrong with it (nothing is raised for it).

    Raises:
        ManifestError: The entry leaves the dataset (see :meth:`Manifest.resolve`):
            the manifest, not the shard, is at fault.
    """
    entry = manifest.table.entry(number)
    try:
        return _verify(manifest, number, entry, options or SourceOptions(), max_member_bytes)
    except VerifyError as exc:
        return ShardCheck(number, entry.num_bytes, error=exc)


def _verify(
    manifest: Manifest, number: int, entry: ShardEntry, options: SourceOptions, max_member_bytes: int | None
) -> ShardCheck:
    allowed = options.allowed_prefixes
    path = manifest.resolve(entry.path, allowed_prefixes=allowed, what=f"shard {number} path", shard=True)
    if is_local(path) and not os.path.lexists(local_path(path)):
        raise VerifyError(f"{path}: shard listed in the manifest is missing", path=path)
    index_path = manifest.resolve(entry.index, allowed_prefixes=allowed, what=f"shard {number} index")
    index: OffsetIndex | None = None
    decompressor: ChunkDecompressor | None = None
    digest = hashlib.sha256()
    parser = SampleParser(path=path)
    bounds = [0]
    size = 0
    check = manifest.member_compression is not None
    tokens = TokenTally() if manifest.token_fields else None
    gone = Removed(manifest.table.removed).in_shard(number)
    stored = entry.num_samples + len(gone)  # the table counts the kept samples; the shard holds all

    def take(samples: list[RawSample]) -> None:
        if index is not None:
            _check_sums(path, index, len(bounds) - 1, samples)
        if tokens is not None:
            for sample in samples:
                tokens.add(sample.fields.items())
        bounds.extend(s.end for s in (_check_members(path, samples, max_member_bytes) if check else samples))

    try:
        # No expected size: the bytes are counted and compared below, with the checksum.
        chunks = open_source(path, options=options).iter_range(0, None, chunk_bytes=HASH_CHUNK_BYTES)
        first = next(chunks, b"")
        kind = detect_compression(first[:MAGIC_BYTES]) if len(first) >= MAGIC_BYTES else None
        if kind is None:
            index = _load_index(path, index_path, entry, stored, options)
        else:
            decompressor = ChunkDecompressor(kind, path=path)
            parser = SampleParser(path=path, offset_name="uncompressed byte")
        for chunk in itertools.chain([first], chunks):
            size += len(chunk)
            digest.update(chunk)
            for piece in [chunk] if decompressor is None else decompressor.pieces(chunk):
                take(parser.feed(piece))
        if size != entry.num_bytes:
            raise VerifyError(
                f"{path}: size is {size} bytes, manifest says {entry.num_bytes} (truncated or replaced?)", path=path
            )
        if decompressor is not None:
            decompressor.finish()
        take(parser.finish())
    except CorruptShardError as exc:
        # The parser's message without the shard's name (said first) and its advice to run verify.
        reason = str(exc).removeprefix(f"{exc.path}: ").removesuffix(f" {REWRITE_ADVICE}")
        raise VerifyError(f"{path}: does not parse as a tar shard: {reason}", path=path) from exc
    except (OSError, ManifestError) as exc:
        raise VerifyError(f"{path}: shard missing or unreadable ({exc})", path=path) from exc
    if digest.hexdigest() != entry.sha256:
        raise VerifyError(f"{path}: SHA-256 mismatch (content changed or corrupted); rewrite this shard", path=path)
    count = len(bounds) - 1
    if count != stored:
        said = f"{entry.num_samples}" if not len(gone) else f"{stored} ({entry.num_samples} kept, {len(gone)} removed)"
        raise VerifyError(f"{path}: holds {count} samples, manifest says {said}", path=path)
    if index is not None and (
        len(index.bounds) != len(bounds)
        or not np.array_equal(np.asarray(index.bounds), np.asarray(bounds, dtype=index.bounds.dtype))
    ):
        raise VerifyError(
            f"{index_path}: offset index does not match the sample boundaries of {entry.path}", path=index_path
        )
    if tokens is not None and index is not None:
        _check_tokens(manifest, number, index_path, tokens, options, gone)
    return ShardCheck(
        number,
        entry.num_bytes,
        num_samples=count - len(gone),
        num_removed=len(gone),
        skipped=SkippedEntries(path, parser.num_skipped_entries, parser.first_skipped)
        if parser.num_skipped_entries
        else None,
        stream_only=None if index is not None else StreamOnlyShard(path, decompressor.kind if decompressor else "?"),
    )


def _check_tokens(
    manifest: Manifest, number: int, index_path: str, found: TokenTally, options: SourceOptions, gone: np.ndarray
) -> None:
    """Compare the token counts the index and table record with those of the
    samples read (of the kept ones, where some were removed: the table's
    totals count those)."""
    table = manifest.table
    assert table.tokens is not None
    try:
        stored = fetch_document_tokens(
            index_path, num_samples=int(table.counts[number]) + len(gone), totals=table.tokens[number],
            options=options, removed=gone,
        )
    except (CorruptShardError, ManifestError, OSError) as exc:
        raise VerifyError(f"{index_path}: token counts unusable: {exc}", path=index_path) from exc
    counts = np.delete(found.counts(), gone, axis=0)
    for j, field in enumerate(manifest.token_fields):
        column = counts[:, found.fields.index(field)] if field in found.fields else np.zeros(len(counts), np.int64)
        wrong = np.flatnonzero(column != stored[:, j])
        if len(wrong):
            i = int(wrong[0])
            raise VerifyError(
                f"{index_path}: token counts of {field!r} do not match the samples of shard {number} (sample {i}: "
                f"{int(stored[i, j])} recorded, {int(column[i])} found); rewrite the shard or run `shardkit index`",
                path=index_path,
            )


def verify_dataset(
    dataset: str | Manifest,
    *,
    options: SourceOptions | None = None,
    progress: Callable[[ShardCheck], None] | None = None,
    max_member_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES,
    workers: int = 1,
    fail_fast: bool = False,
    raise_on_failure: bool = True,
) -> VerifyReport:
    """Verify every shard of ``dataset``: a directory, a manifest, their URL,
    or a :class:`Manifest` already loaded.

    Every shard is checked, also after one fails, so one run names all the
    bad shards of a dataset (the first :data:`LISTED` by number, and how
    many in all); memory stays flat in the number of shards.

    Args:
        dataset: The dataset.
        options: How to read it, and the locations outside the dataset its
            manifest may name (``allowed_prefixes``).
        progress: Called with each shard's check as it finishes (in the
            order shards finish, with ``workers`` > 1).
        max_member_bytes: As for :func:`verify_shard`.
        workers: Processes checking shards (1: in this one).
        fail_fast: Stop at the first bad shard found.
        raise_on_failure: Raise when a shard failed (else the report's
            ``failures`` say so).

    Raises:
        ManifestError: The manifest cannot be loaded, or names a location
            outside the dataset.
        VerifyError: A shard failed (``raise_on_failure``): its message is
            the first failed shard's, with how many others failed; its
            ``failures`` are the listed shards' own errors.
        UsageError: ``workers`` is not a whole number of at least 1.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a whole number of at least 1, not {workers!r}")
    manifest = dataset if isinstance(dataset, Manifest) else fetch_manifest(dataset, options=options)
    tally = _Tally()
    for check in _checks(manifest, options, max_member_bytes, workers):
        tally.add(check)
        if progress is not None:
            progress(check)
        if fail_fast and check.error is not None:
            break
    report = tally.report(manifest)
    if report.failures and raise_on_failure:
        # Chained as the first failure is (a bad index: its loader's error), where
        # it was checked in this process (an error pickled from a worker has no cause).
        raise report.error() from report.failures[0].__cause__
    return report


def _checks(
    manifest: Manifest, options: SourceOptions | None, max_member_bytes: int | None, workers: int
) -> Iterator[ShardCheck]:
    """Each shard's check, from ``workers`` processes (their results as they finish)."""
    numbers = range(manifest.num_shards)
    if workers == 1 or manifest.num_shards < 2:
        for number in numbers:
            yield verify_shard(manifest, number, options=options, max_member_bytes=max_member_bytes)
        return
    # The manifest reaches the workers when they start (inherited where they
    # fork), not once per task: a task is a few shard numbers.
    size = group_size(manifest.num_shards, workers, most=_MAX_GROUP, per_worker=_GROUPS_PER_WORKER)
    yield from run_in_pool(
        _verify_in_worker,
        in_groups(numbers, size),
        min(workers, manifest.num_shards),
        initializer=_start_worker,
        initargs=(manifest, options, max_member_bytes),
    )


#: Most shards in one task of the pool (small shards go in groups), and
#: how many groups each worker gets at least (see :func:`group_size`).
_MAX_GROUP = 16
_GROUPS_PER_WORKER = 8

#: What :func:`_start_worker` gave this worker process: (manifest, options, max_member_bytes).
_job: tuple[Manifest, SourceOptions | None, int | None] | None = None


def _start_worker(manifest: Manifest, options: SourceOptions | None, max_member_bytes: int | None) -> None:
    global _job
    _job = (manifest, options, max_member_bytes)


def _verify_in_worker(numbers: list[int]) -> list[ShardCheck]:
    assert _job is not None
    manifest, options, limit = _job
    return [verify_shard(manifest, number, options=options, max_member_bytes=limit) for number in numbers]


class _Tally:
    """Checks folded as they come, keeping the :data:`LISTED` lowest-numbered
    failures and warnings (heaps), so memory does not grow with the shards."""

    def __init__(self) -> None:
        self.num_checked = self.num_samples = self.num_entries_skipped = self.num_stream_only = self.num_removed = 0
        self.num_failed = self.num_warnings = 0
        self._failures: list[tuple[int, VerifyError]] = []
        self._warnings: list[tuple[int, int, str]] = []

    def add(self, check: ShardCheck) -> None:
        self.num_checked += 1
        if check.error is not None:
            self.num_failed += 1
            _keep(self._failures, (-check.number, check.error))
            return
        self.num_samples += check.num_samples
        self.num_removed += check.num_removed
        for rank, warning in enumerate((check.skipped, check.stream_only)):
            if warning is None:
                continue
            self.num_warnings += 1
            _keep(self._warnings, (-check.number, -rank, warning.warning()))
        if check.skipped is not None:
            self.num_entries_skipped += check.skipped.count
        self.num_stream_only += check.stream_only is not None

    def report(self, manifest: Manifest) -> VerifyReport:
        return VerifyReport(
            manifest=manifest,
            num_shards_checked=self.num_checked,
            num_samples_checked=self.num_samples,
            num_removed=self.num_removed,
            num_entries_skipped=self.num_entries_skipped,
            warnings=tuple(text for _, _, text in sorted(self._warnings, reverse=True)),
            num_stream_only=self.num_stream_only,
            failures=tuple(error for _, error in sorted(self._failures, key=lambda item: item[0], reverse=True)),
            num_failed=self.num_failed,
            num_warnings=self.num_warnings,
        )


def _keep(heap: list, item: tuple) -> None:
    """Add ``item`` to ``heap`` (numbers negated: the largest number is on
    top), keeping the :data:`LISTED` lowest shard numbers."""
    if len(heap) < LISTED:
        heapq.heappush(heap, item)
    elif item[0] > heap[0][0]:
        heapq.heapreplace(heap, item)
