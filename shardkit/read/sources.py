"""Opening shards, indexes and manifests by path or URL.

The reader talks to storage only through :class:`ByteSource`: read a byte
range of one object as a stream of large chunks, or read a small object whole.
This module has the local-file implementation; remote schemes plug in behind
:func:`open_source` without the reader changing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

#: Default size of one read request: large sequential reads are what make
#: tar shards fast on disks and object stores.
DEFAULT_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class SourceOptions:
    """How to read from storage.

    Attributes:
        chunk_bytes: Size of one read request, in bytes.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES


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


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path (``file://`` included)."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


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


def open_source(url: str, *, options: SourceOptions | None = None) -> ByteSource:
    """Open a path or URL for reading.

    Raises:
        UsageError: The URL scheme is not supported.
    """
    if is_local(url):
        return LocalFile(url)
    from shardkit.errors import UsageError

    raise UsageError(f"{url}: unsupported URL scheme; use a local path or file:// URL")
