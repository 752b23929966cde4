"""What a random-access reader keeps open per process, and how much of it.

A random read should cost a seek and a parse, not an index load: a reader
keeps each shard's offset index mapped and its file open once it has used
them. A mapped index costs page cache, shared by every process, not private
memory; what bounds how many a process keeps is its file descriptors (a
mapping holds one, an open shard another). :func:`open_shard_limit` sizes
the tables from ``RLIMIT_NOFILE``, leaving half the descriptors to
everything else the process opens; :class:`RecentTable` keeps the most
recently used entries within that count (and, for indexes fetched into
memory from remote storage, within a byte budget).
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Any

#: Descriptors a kept shard may hold: its mapped index and its open file.
DESCRIPTORS_PER_SHARD = 2
#: Most shards kept open per process, whatever the descriptor limit: each
#: mapping is one of the kernel's ``vm.max_map_count`` (65,530 by default).
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


__all__ = ["MAX_FETCHED_INDEX_BYTES", "RecentTable", "open_shard_limit", "shards_for_descriptors"]
