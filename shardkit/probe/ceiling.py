"""The storage's own ceiling: shards read whole, in large requests, with
nothing parsed (``shardkit bench``'s first figure).

Local files are read cold where the process may drop them from the page
cache: ``posix_fadvise(POSIX_FADV_DONTNEED)`` on each file before it is read
(Linux drops the file's clean pages that no other process maps). Remote
shards are read through the same sources the reader opens (its retries,
timeouts and credentials), without the cache.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local

#: Bytes per read request.
CHUNK_BYTES = 8 << 20

#: Local files dropped from the page cache before a loader epoch, at most (see :mod:`.measure`).
MAX_DROPPED_FILES = 20_000


@dataclass(frozen=True)
class Shard:
    """A shard to read: where, its size if known, and its source's options."""

    url: str
    size: int | None
    options: SourceOptions


@dataclass
class Ceiling:
    """What the raw read achieved.

    Attributes:
        streams: Shards read at once (one thread each).
        nbytes: Bytes read.
        seconds: How long.
        shards: Shards begun.
        cold: Whether every local file was dropped from the page cache
            first (None: nothing local was read).
    """

    streams: int
    nbytes: int
    seconds: float
    shards: int
    cold: bool | None

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def drop_cached(path: str) -> bool:
    """Ask the kernel to drop ``path``'s pages from the page cache; whether it could be asked."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def drop_local(shards: Sequence[Shard]) -> bool | None:
    """Drop the local ones of ``shards`` from the page cache: whether all
    could be (None: none is local)."""
    local = [s.url for s in shards if is_local(s.url)]
    if not local:
        return None
    return all([drop_cached(u) for u in local])  # noqa: C419 (drop each)


def read_ceiling(shards: Sequence[Shard], *, streams: int, seconds: float) -> Ceiling:
    """Read ``shards`` in order, ``streams`` at a time, each whole in
    :data:`CHUNK_BYTES` requests, until ``seconds`` have passed (a read in
    flight then is counted and the rest dropped); a small dataset is read
    again from its first shard, dropped from the page cache again."""
    todo: queue.SimpleQueue[Shard] = queue.SimpleQueue()
    for shard in shards:
        todo.put(shard)
    if not shards:
        return Ceiling(streams, 0, 0.0, 0, None)
    lock = threading.Lock()
    totals = {"bytes": 0, "shards": 0}
    cold: list[bool] = []
    errors: list[BaseException] = []
    started = time.monotonic()
    deadline = started + seconds

    def run() -> None:
        while time.monotonic() < deadline:
            shard = todo.get()
            todo.put(shard)  # read again after the others, if time is left
            if is_local(shard.url):
                cold.append(drop_cached(shard.url))
            source = open_source(shard.url, options=shard.options, expected_size=shard.size)
            got = 0
            try:
                for chunk in source.iter_range(0, None, chunk_bytes=CHUNK_BYTES):
                    got += len(chunk)
                    if time.monotonic() >= deadline:
                        break
            except BaseException as exc:  # reported in the calling thread
                errors.append(exc)
                return
            finally:
                source.close()
                with lock:
                    totals["bytes"] += got
                    totals["shards"] += 1

    threads = [threading.Thread(target=run, name=f"shardkit-ceiling-{i}", daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return Ceiling(streams, totals["bytes"], time.monotonic() - started, totals["shards"], all(cold) if cold else None)
