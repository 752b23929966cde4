"""Files on a local or mounted file system: a byte source and a destination."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import BinaryIO

from shardkit.errors import CorruptShardError, TruncatedShardError
from shardkit.format.location import open_regular
from shardkit.io.atomic import atomic_copy_file, atomic_write_bytes
from shardkit.io.urls import local_path

#: Read size when hashing a whole file.
HASH_CHUNK_BYTES = 8 << 20


class LocalFile:
    """A regular file on a local or mounted file system.

    Every open checks that the path is a regular file (a FIFO, device,
    socket or directory is refused at once, never waited on) and, when the
    manifest's size is known, that the file has exactly that size.

    Args:
        url: A path or ``file://`` URL.
        expected_size: The size the manifest records, or None.
    """

    def __init__(self, url: str, *, expected_size: int | None = None):
        self.url = url
        self.path = local_path(url)
        self.expected_size = expected_size

    def _open(self, buffering: int) -> BinaryIO:
        f, size = open_regular(self.path, what="shard" if self.expected_size is not None else "file", buffering=buffering)
        if self.expected_size is not None and size != self.expected_size:
            f.close()
            raise size_mismatch(self.path, size, self.expected_size)
        return f

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        with self._open(0) as f:
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
        with self._open(-1) as f:
            return f.read()


def size_mismatch(where: str, size: int, expected: int) -> CorruptShardError:
    """The error for an object whose size differs from the manifest's:
    :class:`TruncatedShardError` when it is shorter."""
    if size < expected:
        return TruncatedShardError(
            f"{where}: truncated: the shard has {size} bytes but the manifest says {expected}. "
            "Run `shardkit verify` on the dataset or rewrite this shard.",
            path=where,
            offset=size,
        )
    return CorruptShardError(
        f"{where}: the shard has {size} bytes but the manifest says {expected}: it was rewritten or "
        "appended to after the manifest was written. Run `shardkit verify` on the dataset or rewrite this shard.",
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
