"""Files on a local or mounted file system: a byte source and a destination."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from typing import BinaryIO

from shardkit.errors import CorruptShardError, MissingShardError, TruncatedShardError
from shardkit.format.location import open_regular_fd
from shardkit.io.atomic import atomic_copy_file, atomic_write_bytes
from shardkit.io.base import check_range, short_read, too_large
from shardkit.io.urls import local_path

#: Read size when hashing a whole file.
HASH_CHUNK_BYTES = 8 << 20


class LocalFile:
    """A regular file on a local or mounted file system.

    Every open checks that the path is a regular file (a FIFO, device,
    socket or directory is refused at once, never waited on) and, when the
    manifest's size is known, that the file has exactly that size.

    Range reads (:meth:`iter_range`) open the file for each range, marked
    for sequential reading. Random reads (:meth:`read_at`) share one file
    descriptor, opened at the first and held until :meth:`close`, marked
    ``POSIX_FADV_RANDOM`` so the kernel reads ahead no bytes nobody asked
    for; each is one ``pread``, and threads may read at once.

    Args:
        url: A path or ``file://`` URL.
        expected_size: The size the manifest records, or None.
    """

    def __init__(self, url: str, *, expected_size: int | None = None):
        self.url = url
        self.path = local_path(url)
        self.expected_size = expected_size
        self._init_held()

    def _init_held(self) -> None:
        self._held: BinaryIO | None = None  # the descriptor read_at shares
        self._readers = 0  # read_at calls using it now
        self._close_when_idle = False
        self._held_lock = threading.Lock()

    def _open(self, buffering: int) -> tuple[BinaryIO, int]:
        fd, size = open_local(self.path, expected_size=self.expected_size)
        try:
            return os.fdopen(fd, "rb", buffering=buffering), size
        except BaseException:
            os.close(fd)
            raise

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        f, _ = self._open(0)
        with f:
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

    def read_all(self, *, max_bytes: int | None = None) -> bytes:
        f, size = self._open(-1)
        with f:
            if max_bytes is None:
                return f.read()
            data = f.read(max_bytes + 1) if size <= max_bytes else b""
            if size > max_bytes or len(data) > max_bytes:  # the second: it grew since it was opened
                raise too_large(self.url, max_bytes)
            return data

    def read_at(self, offset: int, size: int) -> bytes:
        check_range(self.url, offset, size, self.expected_size)
        fd = self._hold()
        try:
            return pread_exactly(fd, self.url, offset, size)
        finally:
            self._let_go()

    def _hold(self) -> int:
        with self._held_lock:
            if self._held is None:
                f, _ = self._open(0)
                advise_random(f.fileno())
                self._held = f
            self._readers += 1
            return self._held.fileno()

    def _let_go(self) -> None:
        with self._held_lock:
            self._readers -= 1
            if self._close_when_idle and self._readers == 0:
                self._close_held()

    def _close_held(self) -> None:
        # Called with the lock held and no read in progress, so a descriptor
        # number is never closed (and reused by another file) under a pread.
        if self._held is not None:
            self._held.close()
            self._held = None
        self._close_when_idle = False

    def close(self) -> None:
        with self._held_lock:
            if self._readers:
                self._close_when_idle = True
            else:
                self._close_held()

    def __del__(self) -> None:
        held = getattr(self, "_held", None)
        if held is not None:
            held.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_held", "_readers", "_close_when_idle", "_held_lock"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_held()


def open_local(path: str, *, expected_size: int | None) -> tuple[int, int]:
    """Open a local file for reading (see :func:`~shardkit.format.location.open_regular_fd`):
    a shard when the manifest's size is known, which it must have, and whose
    absence is a :class:`MissingShardError`. Returns the descriptor, which
    the caller closes, and the size."""
    try:
        fd, size = open_regular_fd(path, what="shard" if expected_size is not None else "file")
    except FileNotFoundError:
        if expected_size is None:
            raise
        raise MissingShardError(  # a shard a manifest lists (its size is known)
            f"{path}: shard missing: the manifest lists it but the file is gone (moved or deleted since "
            "the dataset was written or indexed). Restore it, or rerun `shardkit index` (or `shardkit write`) "
            "to rebuild the manifest without it.",
            path=path,
        ) from None
    if expected_size is not None and size != expected_size:
        os.close(fd)
        raise size_mismatch(path, size, expected_size)
    return fd, size


def advise_random(fd: int) -> None:
    """Mark an open file for random reads: they are small and scattered, and
    read-ahead would fetch bytes nobody asked for."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def pread_exactly(fd: int, url: str, offset: int, size: int) -> bytes:
    """Bytes ``[offset, offset + size)`` of the open file ``url``, or a
    :class:`TruncatedShardError` naming where the file ends."""
    data = pread_up_to(fd, offset, size)
    if len(data) != size:
        raise short_read(url, offset, size, offset + len(data))
    return data


def pread_up_to(fd: int, offset: int, size: int) -> bytes:
    """Bytes ``[offset, offset + size)`` of an open regular file, fewer only
    where the file ends (one ``pread`` unless the range passes the ~2 GiB
    a single call returns)."""
    data = os.pread(fd, size, offset) if size else b""
    while 0 < len(data) < size:
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def size_mismatch(where: str, size: int, expected: int) -> CorruptShardError:
    """The error for an object whose size differs from the manifest's:
    :class:`TruncatedShardError` when it is shorter."""
    if size < expected:
        return TruncatedShardError(
            f"{where}: truncated: the shard has {size} bytes but the manifest says {expected}. "
            "Run `shardkit verify` on the dataset or rewrite this shard "
            "(rerun `shardkit index` if it was indexed in place).",
            path=where,
            offset=size,
        )
    return CorruptShardError(
        f"{where}: the shard has {size} bytes but the manifest says {expected}: it was rewritten or "
        "appended to after the manifest was written. Run `shardkit verify` on the dataset or rewrite this shard "
        "(rerun `shardkit index` if it was indexed in place).",
        path=where,
        offset=expected,
    )


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file, read in large chunks."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class LocalDestination:
    """A dataset folder on a local or mounted file system.

    Files are copied under a temporary name, fsynced and renamed (see
    :mod:`shardkit.io.atomic`); writers may also create files directly in
    :attr:`local_dir`.

    Args:
        url: A path or ``file://`` URL of the folder (created when needed by
            the writer, not here).
    """

    def __init__(self, url: str):
        self.local_dir = local_path(url)
        self.url = self.local_dir

    def object_url(self, name: str) -> str:
        return os.path.join(self.local_dir, name)

    def exists(self, name: str) -> bool:
        return os.path.exists(self.object_url(name))

    def put_file(self, local_path: str, name: str) -> None:
        target = self.object_url(name)
        if os.path.abspath(local_path) == os.path.abspath(target):
            return
        atomic_copy_file(local_path, target)

    def put_bytes(self, name: str, data: bytes) -> None:
        atomic_write_bytes(self.object_url(name), data)
