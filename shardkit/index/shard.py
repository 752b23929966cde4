"""Index one published shard: read it once, find its samples, write its offset index.

The work of one ``shardkit index`` task, run in a worker process (or a Ray
task): the shard is read from byte 0 in large chunks, hashed (SHA-256) and
fed to the shared tar parser (:class:`~shardkit.format.tar.SampleParser`),
which gives each sample's end offset; each sample's CRC-32
(:func:`~shardkit.format.tar.sample_checksum`) is taken as it passes. The
offset index is then written exactly as the writer writes it
(:func:`~shardkit.format.index.encode_index`) into the index folder, token
counts included when the shard has token fields (see
:mod:`shardkit.format.tokens`: each sample's ``.npy`` headers are read as
it passes).

A compressed shard (gzip, zstd) is inflated piece by piece to count its
samples; it gets no offset index (it cannot be entered in the middle) and is
read whole by the readers.

A shard that cannot be indexed (truncated, not a tar, vanished, unreadable)
comes back as a result with ``reason`` set, never as an exception: the
driver records it and indexes the others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from shardkit.errors import ShardkitError
from shardkit.format.index import encode_index
from shardkit.format.scan import ShardScan, ShardSummary, local_chunks, summarize
from shardkit.format.tar import sample_checksum
from shardkit.format.tokens import TokenTally
from shardkit.index.source import etag_version
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_destination, open_remote
from shardkit.io.urls import is_local, local_path, redact_url


@dataclass(frozen=True)
class IndexTask:
    """One shard to index.

    Attributes:
        number: Its position in the listing.
        url: The shard's path or URL.
        index_name: Where its offset index goes, relative to ``index_dest``.
        index_dest: The folder (path or URL) that receives offset indexes.
        known_size: The size of the previous run's entry, or -1: a remote
            shard of that size is taken as unchanged without being read
            (its listing gave no version to compare), if its version agrees.
        known_version: The previous run's version of a remote shard (a hash
            of its ETag or Last-Modified), or -1: then the size alone decides.
    """

    number: int
    url: str
    index_name: str
    index_dest: str
    known_size: int = -1
    known_version: int = -1


@dataclass(frozen=True)
class IndexResult:
    """What indexing one shard found.

    Attributes:
        number: The task's ``number``.
        num_samples: Samples in the shard.
        num_bytes: Its size in bytes.
        sha256: Its SHA-256 (32 bytes; empty when unchanged or skipped).
        version: Its ``mtime_ns`` when local (taken on the descriptor that
            was read); a hash of an http(s) object's ETag, or else of its
            Last-Modified, when the server gave one; else -1.
        compressed: It is gzip or zstd compressed (no offset index written).
        extensions: Field extensions seen.
        token_fields: Its token fields (see :mod:`shardkit.format.tokens`).
        token_totals: Their token counts, in the same order.
        unchanged: Same size as ``known_size``; not read.
        reason: Why it could not be indexed (None when it was).
        num_to_read: How many shards the run reads in all, for a progress
            bar's total (set by the driver before it reports the result).
    """

    number: int
    num_samples: int = 0
    num_bytes: int = 0
    sha256: bytes = b""
    version: int = -1
    compressed: bool = False
    extensions: tuple[str, ...] = ()
    token_fields: tuple[str, ...] = ()
    token_totals: tuple[int, ...] = ()
    unchanged: bool = False
    reason: str | None = None
    num_to_read: int = 0


_destinations: dict[str, object] = {}
_folders: set[str] = set()  # index folders this process made sure of


def _put_index(dest: str, name: str, data: bytes) -> None:
    """Write one offset index: a local one under a temporary name then
    renamed (no fsync here; the driver syncs once before publishing), a
    remote one through its destination."""
    if is_local(dest):
        path = os.path.join(local_path(dest), name)
        folder = os.path.dirname(path)
        if folder not in _folders:
            os.makedirs(folder, exist_ok=True)
            _folders.add(folder)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return
    destination = _destinations.get(dest)
    if destination is None:
        destination = _destinations[dest] = open_destination(dest)
    destination.put_bytes(name, data)  # type: ignore[attr-defined]


def index_shard(task: IndexTask, options: SourceOptions | None = None) -> IndexResult:
    """Index one shard (see the module docstring); never raises for a bad shard.

    Args:
        task: The shard and where its index goes.
        options: How to read a remote shard.

    Returns:
        The shard's counts and checksum, or ``reason`` when it was skipped.
    """
    options = options or SourceOptions()
    name = redact_url(task.url)
    facts = {"size": -1, "version": -1}
    try:
        if is_local(task.url):
            chunks = local_chunks(local_path(task.url), facts)
        else:
            source = open_remote(task.url, options=options)  # read once: never through the cache
            size = source.size()
            facts["version"] = etag_version(_validator(source))
            same_version = task.known_version < 0 or facts["version"] < 0 or facts["version"] == task.known_version
            if task.known_size >= 0 and size == task.known_size and same_version:
                return IndexResult(task.number, num_bytes=task.known_size, version=facts["version"], unchanged=True)
            chunks = source.iter_range(0, None, chunk_bytes=options.chunk_bytes)
        return _index_chunks(task, name, chunks, facts)
    except FileNotFoundError:
        return IndexResult(task.number, reason="the shard vanished before it was read")
    except (ShardkitError, OSError) as exc:
        return IndexResult(task.number, reason=" ".join(str(exc).split()))


def _validator(source: object) -> str | None:
    """The ETag or Last-Modified an http(s) source's size request saw (None
    for other sources, and for servers that send neither)."""
    return getattr(getattr(source, "fetcher", None), "validator", None)


def index_shards(tasks: list[IndexTask], options: SourceOptions | None = None) -> list[IndexResult]:
    """:func:`index_shard` for each of ``tasks`` (one pool task for many small shards)."""
    return [index_shard(task, options) for task in tasks]


def _index_chunks(task: IndexTask, name: str, chunks: Iterator[bytes], facts: dict[str, int]) -> IndexResult:
    reading = ShardScan(name)
    ends = [0]
    crcs: list[int] = []
    extensions: set[str] = set()
    tokens = TokenTally()
    for sample in reading.samples(chunks):
        ends.append(sample.end)
        crcs.append(sample_checksum(sample.key, sample.fields.items()))
        extensions.update(sample.fields)
        tokens.add(sample.fields.items())
    read = reading.read
    if facts["size"] >= 0 and read != facts["size"]:
        return IndexResult(task.number, reason=f"the shard changed while it was read ({facts['size']} bytes, {read} read)")
    counts = tokens.counts()
    if reading.decompressor is None:
        _put_index(task.index_dest, task.index_name, encode_index(ends, crcs, counts))
    return IndexResult(
        task.number,
        num_samples=len(ends) - 1,
        num_bytes=read,
        sha256=reading.digest.digest(),
        version=facts["version"],
        compressed=reading.decompressor is not None,
        extensions=tuple(sorted(extensions)),
        token_fields=tokens.fields if reading.decompressor is None else (),
        token_totals=tuple(counts.sum(axis=0).tolist()) if reading.decompressor is None else (),
    )


def summarize_shard(url: str, options: SourceOptions | None = None) -> ShardSummary:
    """Read one shard (a path or URL) through and summarize it
    (:func:`~shardkit.format.scan.summarize`, which says what it raises)."""
    options = options or SourceOptions()
    if is_local(url):
        return summarize(url, local_chunks(local_path(url), {}))
    chunks = open_remote(url, options=options).iter_range(0, None, chunk_bytes=options.chunk_bytes)
    return summarize(redact_url(url), chunks)
