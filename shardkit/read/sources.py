"""Opening shards, indexes and manifests by path or URL.

The reader talks to storage only through :class:`ByteSource`: read a byte
range of one object as a stream of large chunks, or read a small object whole.
:func:`open_source` picks the implementation from the URL:

=====================  ==========================================================
``/path``, ``file://``  :class:`LocalFile`
``http://``, ``https://``  ranged GETs with urllib3 (:mod:`shardkit.read.http`)
``s3://bucket/key``    boto3 ranged GETs (:mod:`shardkit.read.s3`); endpoint,
                       region and credentials come from the usual AWS config
                       (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.aws``...)
other ``scheme://``    any fsspec filesystem (:mod:`shardkit.read.remote_fs`)
``pipe:CMD``           a command's stdout, only with ``allow_pipe=True``;
                       run without a shell (:mod:`shardkit.read.pipe`)
=====================  ==========================================================

Remote objects are read with several concurrent ranged requests, resume
after dropped connections and retry transient faults up to a deadline (see
:mod:`shardkit.read.ranged`). With ``cache_dir`` set, whole shards are kept
in a local cache shared by processes (:mod:`shardkit.read.cache`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from shardkit.errors import UsageError
from shardkit.read.device import DEFAULT_LEASE_BYTES, DeviceLockMode
from shardkit.read.urls import is_local, local_path, url_scheme

#: Default size of one chunk handed to the parser: large sequential reads are
#: what make tar shards fast on disks and object stores.
DEFAULT_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class SourceOptions:
    """How to read from storage. All sizes in bytes, all times in seconds.

    Attributes:
        chunk_bytes: Largest chunk a source yields (4 MiB).
        connect_timeout_s: Time to open a connection before the attempt counts
            as failed (10 s).
        read_timeout_s: Longest silence on an open connection before it counts
            as stalled and is resumed on a new one (30 s).
        retry_deadline_s: How long to keep retrying transient faults (timeouts,
            dropped connections, 5xx) before raising
            :class:`~shardkit.errors.RemoteError`; the clock restarts whenever
            bytes arrive (120 s).
        backoff_initial_s: First wait between attempts; doubles each attempt,
            with jitter (0.2 s).
        backoff_max_s: Longest wait between attempts (10 s).
        max_concurrent_requests: Ranged requests in flight at once per open
            range (8). More requests get past per-connection bandwidth caps
            (one S3 connection gives tens of MB/s).
        part_bytes: Size of one ranged request (4 MiB).
        read_ahead_bytes: Memory budget per open range for bytes fetched ahead
            of the consumer (64 MiB).
        cache_dir: Directory of a local shard cache shared by processes, or
            None for no cache. Whole remote shards are stored there on first
            read and served from there afterwards (objects opened with an
            ``expected_sha256``, and ``.tar`` objects).
        cache_max_bytes: Size limit of the cache; least recently used shards
            are evicted beyond it. None means no limit.
        allow_pipe: Accept ``pipe:CMD`` URLs (runs CMD, without a shell).
        s3_endpoint_url: S3 endpoint for ``s3://`` URLs, overriding the AWS
            configuration (for S3-compatible stores), or None.
        s3_region: S3 region, overriding the AWS configuration, or None.
        device_lock: Take turns reading local shards on one disk across all
            processes (DataLoader workers, ranks on the node), one lease of
            ``device_lease_bytes`` at a time, so their streams do not make
            the head seek between them (see :mod:`shardkit.read.device`).
            ``"auto"`` (default) does so on disks sysfs reports as
            rotational; True for a disk shardkit cannot detect (FUSE, NFS
            over a disk); False never.
        device_lease_bytes: Bytes one process reads per turn (64 MiB); a
            turn that would leave at most one more lease of its shard reads
            that tail too, so a turn is at most two leases. With the lock
            on, a reader's read-ahead queue holds up to a lease and a chunk
            more than its ``read_ahead_bytes``.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    retry_deadline_s: float = 120.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    max_concurrent_requests: int = 8
    part_bytes: int = 4 << 20
    read_ahead_bytes: int = 64 << 20
    cache_dir: str | None = None
    cache_max_bytes: int | None = None
    allow_pipe: bool = False
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    device_lock: DeviceLockMode = "auto"
    device_lease_bytes: int = DEFAULT_LEASE_BYTES

    def __post_init__(self) -> None:
        if self.device_lock not in ("auto", True, False):
            raise UsageError(f"SourceOptions.device_lock must be 'auto', True or False, got {self.device_lock!r}")
        for name in ("chunk_bytes", "max_concurrent_requests", "part_bytes", "read_ahead_bytes", "device_lease_bytes"):
            if getattr(self, name) < 1:
                raise UsageError(f"SourceOptions.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("connect_timeout_s", "read_timeout_s", "backoff_initial_s", "backoff_max_s"):
            if getattr(self, name) <= 0:
                raise UsageError(f"SourceOptions.{name} must be positive, got {getattr(self, name)}")
        if self.retry_deadline_s < 0:
            raise UsageError(f"SourceOptions.retry_deadline_s must be >= 0, got {self.retry_deadline_s}")
        if self.cache_max_bytes is not None and self.cache_max_bytes < 0:
            raise UsageError(f"SourceOptions.cache_max_bytes must be >= 0 or None, got {self.cache_max_bytes}")


class ByteSource(Protocol):
    """Read access to one stored object (a shard, an index, a manifest)."""

    url: str

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        """Yield the bytes ``[start, end)`` in order, in chunks of at most
        ``chunk_bytes``; ``end=None`` reads to the end of the object."""
        ...

    def read_all(self) -> bytes:
        """Return the whole object (for small objects: manifests, indexes)."""
        ...


class LocalFile:
    """A file on a local or mounted file system."""

    def __init__(self, url: str):
        self.url = url
        self.path = local_path(url)

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        with open(self.path, "rb", buffering=0) as f:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fileno(), start, 0 if end is None else end - start, os.POSIX_FADV_SEQUENTIAL)
            f.seek(start)
            remaining = None if end is None else end - start
            while remaining is None or remaining > 0:
                want = chunk_bytes if remaining is None else min(chunk_bytes, remaining)
                chunk = f.read(want)
                if not chunk:
                    return
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk

    def read_all(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()


def open_remote(url: str, *, options: SourceOptions, expected_size: int | None = None) -> ByteSource:
    """Open a non-local URL without the cache (see :func:`open_source`).

    Raises:
        UsageError: No backend for the URL scheme, or ``pipe:`` without
            ``allow_pipe``.
    """
    scheme = url_scheme(url)
    if scheme == "pipe":
        if not options.allow_pipe:
            raise UsageError(
                "pipe: URLs run a command and are off by default; pass SourceOptions(allow_pipe=True) to allow them"
            )
        from shardkit.read.pipe import PipeSource

        return PipeSource(url)
    from shardkit.read.ranged import RangedObject

    if scheme in ("http", "https"):
        from shardkit.read.http import HttpFetcher

        return RangedObject(HttpFetcher(url, options=options), options=options, expected_size=expected_size)
    if scheme == "s3":
        from shardkit.read.s3 import S3Fetcher

        return RangedObject(S3Fetcher(url, options=options), options=options, expected_size=expected_size)
    from shardkit.read.remote_fs import FsspecFetcher

    return RangedObject(FsspecFetcher(url, options=options), options=options, expected_size=expected_size)


def _cacheable(url: str, expected_sha256: str | None) -> bool:
    # Objects with a known checksum are cached under a key that includes it,
    # so they can never be served stale. Without one, only shards (``.tar``)
    # are cached, trusted by URL; manifests and indexes are small and are
    # what tells a reader that a dataset was rewritten, so they always come
    # from the store.
    if url_scheme(url) == "pipe":
        return False
    return expected_sha256 is not None or url.split("?", 1)[0].endswith(".tar")


def open_source(
    url: str,
    *,
    options: SourceOptions | None = None,
    expected_size: int | None = None,
    expected_sha256: str | None = None,
) -> ByteSource:
    """Open a path or URL for reading.

    Args:
        url: Local path, ``file://``, ``http(s)://``, ``s3://``, any fsspec
            URL, or ``pipe:CMD`` (with ``options.allow_pipe``).
        options: Timeouts, retries, concurrency, cache; defaults if None.
        expected_size: Object size in bytes if known (the manifest's
            ``num_bytes``): saves a request and is checked before caching.
        expected_sha256: Hex SHA-256 if known (the manifest's ``sha256``):
            a cached copy is kept only if it matches, and the checksum is
            part of the cache key, so a shard rewritten under the same URL is
            never served stale. Without it only ``.tar`` objects are cached,
            trusted by URL.

    Raises:
        UsageError: The URL scheme is not supported or not allowed.
    """
    options = options or SourceOptions()
    if is_local(url):
        return LocalFile(url)
    source = open_remote(url, options=options, expected_size=expected_size)
    if options.cache_dir is not None and _cacheable(url, expected_sha256):
        from shardkit.read.cache import CachedSource, ShardCache

        cache = ShardCache(options.cache_dir, max_bytes=options.cache_max_bytes)
        return CachedSource(
            url, source, cache=cache, expected_size=expected_size, expected_sha256=expected_sha256, options=options
        )
    return source


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ByteSource",
    "LocalFile",
    "SourceOptions",
    "is_local",
    "local_path",
    "open_remote",
    "open_source",
]
