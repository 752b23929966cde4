"""``shardkit verify``: re-read every shard and check it against the manifest.

Checks, per shard: the file exists with the recorded size and SHA-256; it
parses as tar to the end-of-archive marker; it holds the recorded number of
samples; its offset index is well formed and matches the sample boundaries
found by parsing; and, when the index stores per-sample checksums, every
sample matches its checksum (so bit rot is named by the sample it hit).
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
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardkit.errors import CorruptShardError, ManifestError, MemberTooLargeError, VerifyError
from shardkit.format.compression import (
    DEFAULT_MAX_MEMBER_BYTES,
    MAGIC_BYTES,
    ChunkDecompressor,
    detect_compression,
    iter_decompressed,
    member_compression,
)
from shardkit.format.index import OffsetIndex
from shardkit.format.manifest import Manifest, ShardEntry
from shardkit.format.tar import RawSample, SampleParser
from shardkit.io.base import SourceOptions
from shardkit.io.index import fetch_offset_index
from shardkit.io.local import HASH_CHUNK_BYTES
from shardkit.io.manifest import fetch_manifest
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, local_path

@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_dataset` checked.

    Attributes:
        manifest: The dataset's manifest.
        num_shards_checked: Shards checked (all of them).
        num_samples_checked: Samples checked.
        num_entries_skipped: Tar entries that belong to no sample
            (directories, links, files without a ``KEY.EXT`` name), summed
            over the shards; the readers skip them.
        num_stream_only: Compressed shards, checked without an offset index.
        warnings: One line per shard holding such entries, and per
            compressed shard.
    """

    manifest: Manifest
    num_shards_checked: int
    num_samples_checked: int
    num_entries_skipped: int = 0
    warnings: tuple[str, ...] = ()
    num_stream_only: int = 0


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


def _load_index(path: str, index_path: str, entry: ShardEntry, options: SourceOptions | None) -> OffsetIndex:
    try:
        index = fetch_offset_index(
            index_path, num_samples=entry.num_samples, shard_bytes=entry.num_bytes, options=options
        )
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
    entry: ShardEntry,
    *,
    options: SourceOptions | None = None,
    number: int | None = None,
    max_member_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES,
    skipped: list[SkippedEntries] | None = None,
    stream_only: list[StreamOnlyShard] | None = None,
) -> int:
    """Check one shard; return its sample count.

    Args:
        manifest: The dataset's manifest.
        entry: One of its shards.
        options: How to read remote shards, and the locations outside the
            dataset its entries may name (``allowed_prefixes``).
        number: The shard's position in the manifest, for messages.
        max_member_bytes: Most bytes a compressed member may decompress to
            (default 256 MiB, the readers' default; None: no limit).
        skipped: Where to add the shard's :class:`SkippedEntries` when it
            holds entries that belong to no sample.
        stream_only: Where to add a :class:`StreamOnlyShard` when the shard
            is compressed (checked without an offset index).

    Raises:
        VerifyError: naming the shard and what is wrong with it.
        ManifestError: The entry leaves the dataset (see :meth:`Manifest.resolve`).
    """
    options = options or SourceOptions()
    allowed = options.allowed_prefixes
    shard = "shard" if number is None else f"shard {number}"
    path = manifest.resolve(entry.path, allowed_prefixes=allowed, what=f"{shard} path", shard=True)
    if is_local(path) and not os.path.lexists(local_path(path)):
        raise VerifyError(f"{path}: shard listed in the manifest is missing", path=path)
    index_path = manifest.resolve(entry.index, allowed_prefixes=allowed, what=f"{shard} index")
    index: OffsetIndex | None = None
    decompressor: ChunkDecompressor | None = None
    digest = hashlib.sha256()
    parser = SampleParser(path=path)
    bounds = [0]
    size = 0
    check = manifest.member_compression is not None

    def take(samples: list[RawSample]) -> None:
        if index is not None:
            _check_sums(path, index, len(bounds) - 1, samples)
        bounds.extend(s.end for s in (_check_members(path, samples, max_member_bytes) if check else samples))

    try:
        # No expected size: the bytes are counted and compared below, with the checksum.
        chunks = open_source(path, options=options).iter_range(0, None, chunk_bytes=HASH_CHUNK_BYTES)
        first = next(chunks, b"")
        kind = detect_compression(first[:MAGIC_BYTES]) if len(first) >= MAGIC_BYTES else None
        if kind is None:
            index = _load_index(path, index_path, entry, options)
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
        raise VerifyError(f"{path}: does not parse as a tar shard: {exc}", path=path) from exc
    except (OSError, ManifestError) as exc:
        raise VerifyError(f"{path}: shard missing or unreadable ({exc})", path=path) from exc
    if digest.hexdigest() != entry.sha256:
        raise VerifyError(f"{path}: SHA-256 mismatch (content changed or corrupted); rewrite this shard", path=path)
    count = len(bounds) - 1
    if count != entry.num_samples:
        raise VerifyError(f"{path}: holds {count} samples, manifest says {entry.num_samples}", path=path)
    if index is None:
        if stream_only is not None:
            stream_only.append(StreamOnlyShard(path, decompressor.kind if decompressor is not None else "?"))
    elif len(index.bounds) != len(bounds) or not np.array_equal(np.asarray(index.bounds), np.asarray(bounds, dtype=index.bounds.dtype)):
        raise VerifyError(
            f"{index_path}: offset index does not match the sample boundaries of {entry.path}", path=index_path
        )
    if parser.num_skipped_entries and skipped is not None:
        skipped.append(SkippedEntries(path, parser.num_skipped_entries, parser.first_skipped))
    return count


def verify_dataset(
    path: str,
    *,
    options: SourceOptions | None = None,
    progress: Callable[[ShardEntry], None] | None = None,
    max_member_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES,
) -> VerifyReport:
    """Verify every shard of the dataset at ``path`` (directory, manifest, or URL).

    Args:
        path: The dataset.
        options: How to read it, and the locations outside the dataset its
            manifest may name (``allowed_prefixes``).
        progress: Called with each shard checked.
        max_member_bytes: As for :func:`verify_shard`.

    Raises:
        ManifestError: The manifest cannot be loaded, or names a location
            outside the dataset.
        VerifyError: The first bad shard, and why.
    """
    manifest = fetch_manifest(path, options=options)
    samples = 0
    skipped: list[SkippedEntries] = []
    stream_only: list[StreamOnlyShard] = []
    for number in range(manifest.num_shards):  # one entry at a time, from the shard table
        entry = manifest.table.entry(number)
        samples += verify_shard(
            manifest, entry, options=options, number=number, max_member_bytes=max_member_bytes, skipped=skipped,
            stream_only=stream_only,
        )
        if progress is not None:
            progress(entry)
    return VerifyReport(
        manifest=manifest,
        num_shards_checked=manifest.num_shards,
        num_samples_checked=samples,
        num_entries_skipped=sum(s.count for s in skipped),
        warnings=tuple(s.warning() for s in [*skipped, *stream_only]),
        num_stream_only=len(stream_only),
    )
