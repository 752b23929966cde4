"""What a random-access reader keeps open per process, and how much of it.

A random read should cost a seek and a parse, not an index load: a reader
keeps each shard it has used open (a :class:`HeldShard`), its offset index
checked once when opened.

* A local shard (:class:`LocalShard`) is two descriptors, the shard and its
  index file, and a few integers: each read is one ``pread`` of the
  sample's two boundaries in the index and one of its bytes. Nothing of the
  index is copied or mapped, nor its paths kept, so a held shard costs the
  process about 300 bytes (its table entry included), whatever its sample
  count; the pages read sit in the page cache, shared by every process.
* A remote shard (:class:`RemoteShard`) is its fetched index in memory and
  its open connection (see :mod:`shardkit.io`).

What bounds how many shards a process keeps is its file descriptors:
:func:`open_shard_limit` sizes the table from ``RLIMIT_NOFILE``, leaving
half the descriptors to everything else the process opens;
:class:`RecentTable` keeps the most recently used entries within that
count (and the fetched indexes within a byte budget).
"""

from __future__ import annotations

import os
import resource
import struct
from collections import OrderedDict
from typing import Any, Callable

from shardkit.format.index import CHECKSUM_DTYPE, OffsetIndex, corrupt_index
from shardkit.io.base import ByteSource, short_read
from shardkit.io.index import open_local_index
from shardkit.io.local import advise_random, open_local, pread_up_to

#: Descriptors a kept shard may hold: its index and its file.
DESCRIPTORS_PER_SHARD = 2
#: Most shards kept open per process, whatever the descriptor limit (a
#: bound on the process's tables, a few MB at most).
MAX_OPEN_SHARDS = 16_384
#: Fewest shards kept open per process, however low the descriptor limit.
MIN_OPEN_SHARDS = 8
#: Bytes of remote offset indexes (fetched into memory, not mapped) kept per process.
MAX_FETCHED_INDEX_BYTES = 64 << 20


def open_shard_limit() -> int:
    """Shards whose index and file this process keeps open by default (see
    :func:`shards_for_descriptors`), from its soft ``RLIMIT_NOFILE``, read
    when a dataset is made or unpickled and in each worker, so ``ulimit -n``
    raised before then keeps more."""
    return shards_for_descriptors(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def shards_for_descriptors(max_descriptors: int) -> int:
    """Half of ``max_descriptors`` (the rest left to whatever else the
    process opens), two a shard, within ``[MIN_OPEN_SHARDS, MAX_OPEN_SHARDS]``;
    ``RLIM_INFINITY`` gives the most."""
    if max_descriptors == resource.RLIM_INFINITY:
        return MAX_OPEN_SHARDS
    return max(MIN_OPEN_SHARDS, min(MAX_OPEN_SHARDS, max_descriptors // 2 // DESCRIPTORS_PER_SHARD))


class RecentTable(OrderedDict):
    """A dict that keeps its ``limit`` most recently used entries, whose
    weights (bytes held in memory; 0 for a mapping) sum to at most
    ``max_weight``; the caller closes the entries it drops (a source closes
    once the reads in progress on it end, see
    :meth:`~shardkit.io.base.ByteSource.close`)."""

    def __init__(self, limit: int, *, max_weight: int | None = None):
        super().__init__()
        self.limit = limit
        self.max_weight = max_weight
        self.weight = 0
        self._weights: dict[Any, int] = {}

    def get_recent(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any, *, weight: int = 0) -> tuple[Any, list[Any]]:
        """Add ``value`` unless ``key`` is there already; returns the entry
        kept, and the entries dropped (to close outside the caller's lock)."""
        if key in self:
            self.move_to_end(key)  # another thread opened it first
            return self[key], [value]
        self[key] = value
        if weight:
            self._weights[key] = weight
            self.weight += weight
        dropped = []
        while len(self) > self.limit or (
            self.max_weight is not None and self.weight > self.max_weight and len(self) > 1
        ):
            old, value_dropped = self.popitem(last=False)
            self.weight -= self._weights.pop(old, 0)
            dropped.append(value_dropped)
        return value, dropped

    def drop_all(self) -> list[Any]:
        """Empty the table; returns what it held."""
        values = list(self.values())
        self.clear()
        self._weights.clear()
        self.weight = 0
        return values


class HeldShard:
    """A shard held open for random reads of its samples (:meth:`read`).

    ``readers`` counts the reads using it now and ``dropped`` says its table
    let it go; the reader changes both under its table's lock and closes a
    dropped shard once no read uses it, so a descriptor number is never
    closed (and reused by another file) under a ``pread``.
    """

    __slots__ = ("readers", "dropped")

    #: Bytes of memory the shard holds, for the table's byte budget.
    weight = 0

    def __init__(self) -> None:
        self.readers = 0
        self.dropped = False

    @property
    def url(self) -> str:
        """The shard's path or URL."""
        raise NotImplementedError

    def span(self, position: int) -> tuple[int, int]:
        """Where sample ``position`` starts and ends in the shard (from the offset index; nothing read)."""
        raise NotImplementedError

    def read(self, position: int) -> tuple[int, bytes, int | None]:
        """Sample ``position``: where it starts in the shard, its bytes, and
        its stored checksum (None when the index has none)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


#: Where a reader's shard number ``n`` and its offset index lie on disk: ``paths(n) -> (shard, index)``.
ShardPaths = Callable[[int], tuple[str, str]]

_TWO_BOUNDS = struct.Struct("<QQ")
_ONE_CHECKSUM = struct.Struct("<I")


class LocalShard(HeldShard):
    """Local shard number ``shard``: its file ``url`` and its index file
    open (see the module docstring).

    It keeps no path: ``paths`` (shared by every shard of a reader) names
    the two files again for a message. With ``checksums=False`` it has none to
    give (:meth:`checksum` is None), as a reader that checks none needs.
    A read past the file's end (a file cut short) is a
    :class:`~shardkit.errors.TruncatedShardError` naming where it ends.
    """

    __slots__ = ("_paths", "_shard", "_fd", "_index_fd", "_bounds_at", "_checksums_at")

    def __init__(
        self,
        url: str,
        index_path: str,
        *,
        paths: ShardPaths,
        shard: int,
        num_samples: int,
        shard_bytes: int | None,
        checksums: bool = True,
    ):
        super().__init__()
        self._paths, self._shard = paths, shard
        self._index_fd = self._fd = -1
        self._index_fd, layout = open_local_index(index_path, num_samples=num_samples, shard_bytes=shard_bytes)
        try:
            self._fd, _ = open_local(url, expected_size=shard_bytes)
            advise_random(self._fd)
        except BaseException:
            self.close()
            raise
        self._bounds_at = layout.bounds_at
        self._checksums_at = layout.checksums_at if checksums else None

    @property
    def url(self) -> str:
        return self._paths(self._shard)[0]

    @property
    def index_path(self) -> str:
        """The shard's offset index file."""
        return self._paths(self._shard)[1]

    def span(self, position: int) -> tuple[int, int]:
        raw = os.pread(self._index_fd, _TWO_BOUNDS.size, self._bounds_at + 8 * position)
        start, end = _TWO_BOUNDS.unpack(raw) if len(raw) == _TWO_BOUNDS.size else (0, 0)
        if not start < end:  # checked whole when opened: the file changed since
            raise corrupt_index(self.index_path, "it changed after it was checked", at=position)
        return start, end

    def read(self, position: int) -> tuple[int, bytes, int | None]:
        start, end = self.span(position)
        size = end - start
        data = pread_up_to(self._fd, start, size)
        if len(data) != size:  # pread_exactly's check, the path named only for the error
            raise short_read(self.url, start, size, start + len(data))
        return start, data, None if self._checksums_at is None else self._checksum(position)

    def _checksum(self, position: int) -> int:
        raw = os.pread(self._index_fd, CHECKSUM_DTYPE.itemsize, self._checksums_at + 4 * position)
        if len(raw) != CHECKSUM_DTYPE.itemsize:
            raise corrupt_index(self.index_path, "it changed after it was checked", at=position)
        return _ONE_CHECKSUM.unpack(raw)[0]

    def close(self, _close: Any = os.close) -> None:  # bound early: __del__ may run as the interpreter exits
        for name in ("_fd", "_index_fd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                _close(fd)

    def __del__(self) -> None:
        self.close()


class RemoteShard(HeldShard):
    """A remote shard: its index, fetched and checked, and its open source."""

    __slots__ = ("_url", "index", "source")

    def __init__(self, url: str, index: OffsetIndex, source: ByteSource):
        super().__init__()
        self._url = url
        self.index = index
        self.source = source

    @property
    def url(self) -> str:
        return self._url

    @property
    def weight(self) -> int:  # type: ignore[override]
        checksums = self.index.checksums
        return self.index.bounds.nbytes + (0 if checksums is None else checksums.nbytes)

    def span(self, position: int) -> tuple[int, int]:
        start, end = self.index.bounds[position : position + 2].tolist()
        return start, end

    def read(self, position: int) -> tuple[int, bytes, int | None]:
        start, end = self.span(position)
        checksums = self.index.checksums
        return start, self.source.read_at(start, end - start), None if checksums is None else int(checksums[position])

    def close(self) -> None:
        self.source.close()


__all__ = [
    "MAX_FETCHED_INDEX_BYTES",
    "HeldShard",
    "LocalShard",
    "RecentTable",
    "RemoteShard",
    "ShardPaths",
    "open_shard_limit",
    "shards_for_descriptors",
]
