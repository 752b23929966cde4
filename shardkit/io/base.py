"""The storage floor's contracts: :class:`ByteSource`, :class:`Destination`, :class:`SourceOptions`.

Readers and writers talk to storage only through these: a source reads a
byte range of one stored object as a stream of large chunks, a small object
whole (with a size cap), or exactly one range at random; a destination publishes whole files into a dataset folder.
:func:`shardkit.io.registry.open_source` and
:func:`~shardkit.io.registry.open_destination` pick the backend from the URL:

=====================  ==========================================================
``/path``, ``file://``  :class:`LocalFile`
``http://``, ``https://``  ranged GETs with urllib3 (:mod:`shardkit.io.http`)
``s3://bucket/key``    boto3 ranged GETs (:mod:`shardkit.io.s3`); endpoint,
                       region and credentials come from the usual AWS config
                       (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.aws``...)
other ``scheme://``    any fsspec filesystem (:mod:`shardkit.io.fsspec`)
``pipe:CMD``           a command's stdout, only with ``allow_pipe=True``;
                       run without a shell (:mod:`shardkit.io.pipe`)
=====================  ==========================================================

Remote objects are read with several concurrent ranged requests, resume
after dropped connections and retry transient faults up to a deadline (see
:mod:`shardkit.io.ranged`). With ``cache_dir`` set, whole shards are kept
in a local cache shared by processes (:mod:`shardkit.io.cache`).
"""

from __future__ import annotations

import dataclasses

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

from shardkit.errors import CorruptShardError, TruncatedShardError, UsageError
from shardkit.format.location import normalise_prefix

#: Default size of one chunk handed to the parser: large sequential reads are
#: what make tar shards fast on disks and object stores.
DEFAULT_CHUNK_BYTES = 4 << 20

#: Bytes one process reads per turn on a disk that takes turns (see
#: :mod:`shardkit.io.device`).
DEFAULT_LEASE_BYTES = 64 << 20

#: ``"auto"``: take turns on disks sysfs reports as rotational.
DeviceLockMode = Literal["auto"] | bool


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """How to read from storage. All sizes in bytes, all times in seconds.

    The fields come in groups, each with its own prefix or suffix where two
    could be confused: reading in general (``chunk_bytes``), the network
    (timeouts, retries, ranged requests: used by ``http(s)://``, ``s3://``
    and fsspec URLs), the shard ``cache_*``, ``s3_*`` endpoint settings,
    ``pipe:`` URLs, and the local ``device_*`` lock for spinning disks.

    Reading:
        chunk_bytes: Largest chunk a source yields (4 MiB). A remote range's
            first chunk is 64 KiB and each next one twice as large, so its
            first sample arrives after one round trip.

    Network:
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
            (one S3 connection gives tens of MB/s). ``ShardDataset`` counts
            them per rank: its DataLoader workers and the ranges each has
            open share them, at least one each (see :meth:`shared_by`).
        part_bytes: Size of one ranged request (4 MiB).
        remote_read_ahead_bytes: Memory budget per open remote range for
            bytes fetched ahead of the consumer (64 MiB). Not the reader's
            per-worker ``ShardDataset(read_ahead_bytes=...)``.
        allow_cross_origin_redirects: Follow an ``http(s)://`` redirect to
            another origin (scheme, host or port) (False). Off, such a
            redirect is a :class:`~shardkit.errors.RemoteError` naming both
            URLs; on, it is followed, but credentials from the URL
            (``user:password@``, sent as Basic auth) still go to the URL's
            own origin only.

    Cache:
        cache_dir: Directory of a local shard cache shared by processes, or
            None for no cache. Whole remote shards are stored there on first
            read and served from there afterwards (objects opened with an
            ``expected_sha256``, and ``.tar`` objects).
        cache_max_bytes: Size limit of the cache; least recently used shards
            are evicted beyond it. None means no limit.

    S3:
        s3_endpoint_url: S3 endpoint for ``s3://`` URLs, overriding the AWS
            configuration (for S3-compatible stores), or None.
        s3_region: S3 region, overriding the AWS configuration, or None.
        s3_anonymous: Send ``s3://`` requests unsigned, as for a public bucket
            (the AWS CLI's ``--no-sign-request``, s3fs's ``anon=True``):
            no credentials are looked up or sent.

    Pipes:
        allow_pipe: Accept ``pipe:CMD`` URLs given to a reader directly (runs
            CMD, split with :func:`shlex.split`, never through a shell). Never
            a ``pipe:`` entry of a manifest.

    Confinement:
        allowed_prefixes: Locations beyond the dataset that a manifest may
            send the reader to (empty by default). A manifest's shard and
            index entries must be relative paths inside its folder or URL
            prefix (no ``..``, no absolute path, no ``file://``, ``http://``
            or other scheme of their own, no symlink leading out); an entry
            outside it is read only if it lies under one of these prefixes:
            absolute folders (``"/mnt/shards/"``, compared by real path) or
            URL prefixes (``"https://host/shards/"``, compared after
            normalising, so ``https://host/shards/../x`` and
            ``https://host/shardsx`` stay out). A ``pipe:`` entry is refused
            whatever this says. See :mod:`shardkit.format.location`.

    Disk:
        device_lock: Take turns reading local shards on one disk across all
            processes (DataLoader workers, ranks on the node), one lease of
            ``device_lease_bytes`` at a time, so their streams do not make
            the head seek between them (see :mod:`shardkit.io.device`).
            ``"auto"`` (default) does so on disks sysfs reports as
            rotational; True for a disk shardkit cannot detect (FUSE, NFS
            over a disk); False never.
        device_lease_bytes: Bytes one process reads per turn (64 MiB); a
            turn that would leave at most one more lease of its shard reads
            that tail too (when its read-ahead queue has room for it) rather
            than seeking back for it later, so a turn is at most two leases.
            With the lock on, a reader's read-ahead queue holds up to a lease
            and a chunk more than its ``read_ahead_bytes`` (the reader's
            per-worker budget).
    """

    # reading
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # network
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    retry_deadline_s: float = 120.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    max_concurrent_requests: int = 8
    part_bytes: int = 4 << 20
    remote_read_ahead_bytes: int = 64 << 20
    allow_cross_origin_redirects: bool = False
    # cache
    cache_dir: str | None = None
    cache_max_bytes: int | None = None
    # s3
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_anonymous: bool = False
    # pipes
    allow_pipe: bool = False
    # confinement
    allowed_prefixes: tuple[str, ...] = ()
    # disk
    device_lock: DeviceLockMode = "auto"
    device_lease_bytes: int = DEFAULT_LEASE_BYTES

    def __post_init__(self) -> None:
        for name in ("allow_cross_origin_redirects", "s3_anonymous"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"SourceOptions.{name} must be True or False, got {getattr(self, name)!r}")
        if self.device_lock not in ("auto", True, False):
            raise UsageError(f"SourceOptions.device_lock must be 'auto', True or False, got {self.device_lock!r}")
        sizes = ("chunk_bytes", "max_concurrent_requests", "part_bytes", "remote_read_ahead_bytes", "device_lease_bytes")
        for name in sizes:
            if getattr(self, name) < 1:
                raise UsageError(f"SourceOptions.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("connect_timeout_s", "read_timeout_s", "backoff_initial_s", "backoff_max_s"):
            if getattr(self, name) <= 0:
                raise UsageError(f"SourceOptions.{name} must be positive, got {getattr(self, name)}")
        if self.retry_deadline_s < 0:
            raise UsageError(f"SourceOptions.retry_deadline_s must be >= 0, got {self.retry_deadline_s}")
        if self.cache_max_bytes is not None and self.cache_max_bytes < 0:
            raise UsageError(f"SourceOptions.cache_max_bytes must be >= 0 or None, got {self.cache_max_bytes}")
        if isinstance(self.allowed_prefixes, str):
            raise UsageError(
                f"SourceOptions.allowed_prefixes must be a tuple of prefixes, got the string "
                f"{self.allowed_prefixes!r}; write allowed_prefixes=({self.allowed_prefixes!r},)"
            )
        object.__setattr__(self, "allowed_prefixes", tuple(normalise_prefix(p) for p in self.allowed_prefixes))

    def shared_by(self, ranges: int) -> SourceOptions:
        """These options for one of ``ranges`` ranges read at once, which share
        ``max_concurrent_requests`` (each keeps at least one request).

        A rank's reader gives each DataLoader worker, and each range a worker
        has open, its share: 8 workers open 8 connections, as one worker
        does, not 64 (a link that 8 saturate gains nothing from more, and
        every connection costs a handshake and a slow start).
        """
        if ranges <= 1:
            return self
        return dataclasses.replace(self, max_concurrent_requests=max(1, -(-self.max_concurrent_requests // ranges)))


class ByteSource(Protocol):
    """Read access to one stored object (a shard, an index, a manifest).

    Three ways to read: a range as a stream of large chunks
    (:meth:`iter_range`, for streaming whole shards), a small object whole
    (:meth:`read_all`, with a size cap for objects whose greatest size is
    known), and exactly one range (:meth:`read_at`, for random access: one
    ``pread`` of a local file, one ranged request of a remote object when the
    range is at most ``part_bytes``). A remote source retries and resumes as
    :mod:`shardkit.io.ranged` does for all three, and checks every answer
    against the manifest's size when it was given one. A source may hold a
    file open between reads: :meth:`close` lets go of it.
    """

    url: str

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        """Yield the bytes ``[start, end)`` in order, in chunks of at most
        ``chunk_bytes``; ``end=None`` reads to the end of the object."""
        ...

    def read_all(self, *, max_bytes: int | None = None) -> bytes:
        """Return the whole object (for small objects: manifests, indexes).

        Args:
            max_bytes: The most bytes the object may hold, or None. A longer
                object is refused as soon as that is known: from the size
                the file or the store states, before any byte is read, else
                after ``max_bytes`` and at most a chunk more have arrived
                (it is never read whole).

        Raises:
            CorruptShardError: The object holds more than ``max_bytes``
                (see :func:`too_large`).
        """
        ...

    def read_at(self, offset: int, size: int) -> bytes:
        """Return exactly the bytes ``[offset, offset + size)``, never fewer.

        Raises:
            UsageError: A negative offset or size, or a range ending past
                the object's known size (the manifest's).
            TruncatedShardError: The object ends before the range does
                (naming the URL, the range and where the object ends).
        """
        ...

    def close(self) -> None:
        """Let go of what the source holds open between reads (a file
        descriptor); once reads in progress end. A later read opens it again."""
        ...


def check_range(url: str, offset: int, size: int, known_size: int | None) -> None:
    """Refuse a :meth:`ByteSource.read_at` range that cannot be read.

    Raises:
        UsageError: ``offset`` or ``size`` is negative, or the range ends
            past ``known_size``.
    """
    if offset < 0 or size < 0:
        raise UsageError(f"{url}: cannot read {size} bytes at offset {offset}: both must be >= 0")
    if known_size is not None and offset + size > known_size:
        raise UsageError(
            f"{url}: bytes [{offset}, {offset + size}) lie outside the object, which has {known_size} bytes"
        )


def short_read(url: str, offset: int, size: int, ends_at: int | None) -> TruncatedShardError:
    """The error for a range the object ends inside of: names the URL, the
    range and where the object ends (``ends_at``, when known)."""
    if ends_at is None:
        where = f"before byte {offset}"
    else:
        where = f"at byte {ends_at}" if ends_at != offset else f"at or before byte {offset}"
    return TruncatedShardError(
        f"{url}: bytes [{offset}, {offset + size}) asked for, but the object ends {where}: it was cut short or "
        "replaced, or its index is wrong. Run `shardkit verify` on the dataset or rewrite this shard.",
        path=url,
        offset=offset if ends_at is None else ends_at,
    )


def too_large(url: str, max_bytes: int) -> CorruptShardError:
    """The error for an object longer than the ``max_bytes`` it may hold
    (see :meth:`ByteSource.read_all`)."""
    return CorruptShardError(
        f"{url}: the object holds more than {max_bytes} bytes, the most it may; refused without reading it whole",
        path=url,
        offset=max_bytes,
    )


def close_iterator(chunks: object) -> None:
    """Close an iterator left half-way when it can be closed (a generator):
    what it holds (a file, a device lease, fetch threads) is released now,
    not whenever it is garbage-collected."""
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def read_capped(url: str, chunks: Iterator[bytes], max_bytes: int | None) -> bytes:
    """Join ``chunks``, refusing (and closing the stream) once more than
    ``max_bytes`` have arrived.

    Raises:
        CorruptShardError: More than ``max_bytes`` (see :func:`too_large`).
    """
    out: list[bytes] = []
    held = 0
    try:
        for chunk in chunks:
            out.append(chunk)
            held += len(chunk)
            if max_bytes is not None and held > max_bytes:
                raise too_large(url, max_bytes)
    finally:
        close_iterator(chunks)
    return out[0] if len(out) == 1 else b"".join(out)


class Destination(Protocol):
    """Write access to one dataset folder (local directory, S3 prefix, fsspec URL).

    Files are published whole or not at all: a local file is written under a
    temporary name, fsynced and renamed; S3 shows an object only once its
    ``PutObject`` or multipart upload completes; other filesystems get a
    temporary name and a move. :func:`shardkit.io.registry.open_destination`
    picks the backend from the URL.

    Attributes:
        url: The folder's URL for messages and manifests (no credentials, no
            query string).
        local_dir: The folder's path when it is on a local or mounted file
            system, so a writer may create files there directly; None when
            files must be handed over with :meth:`put_file`.
    """

    url: str
    local_dir: str | None

    def object_url(self, name: str) -> str:
        """The redacted URL of file ``name`` in the folder."""
        ...

    def exists(self, name: str) -> bool:
        """Whether file ``name`` exists in the folder."""
        ...

    def put_file(self, local_path: str, name: str) -> None:
        """Publish the finished local file ``local_path`` as ``name``, whole or not at all."""
        ...

    def put_bytes(self, name: str, data: bytes) -> None:
        """Publish ``data`` as file ``name``, whole or not at all."""
        ...


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_LEASE_BYTES",
    "ByteSource",
    "Destination",
    "DeviceLockMode",
    "SourceOptions",
    "check_range",
    "read_capped",
    "short_read",
    "too_large",
]
