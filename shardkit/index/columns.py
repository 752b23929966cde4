"""Per-shard results of ``shardkit index`` kept in a file, and the shard table written from it piece by piece.

The driver of ``shardkit index`` holds no per-shard column beyond the
listing's names, sizes and versions. What each shard's indexing found (its
state, sample count, size, version and SHA-256) goes into
:class:`ShardResults`, one fixed-size record per shard in a file in the
index's temporary folder, written where the shard's row is as results come
back. The shard table and the versions sidecar are then written from that
file :data:`CHUNK_ROWS` rows at a time (:class:`~shardkit.format.table_writer.ColumnWriter`):
the driver's memory does not grow with the number of shards.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from shardkit.format.compression import SHARD_SUFFIXES
from shardkit.format.index import INDEX_SUFFIX, MAX_TOKEN_FIELDS
from shardkit.format.naming import Naming
from shardkit.format.path_column import bytes_array_columns
from shardkit.format.table_writer import ColumnWriter

#: A shard's row in the results file.
RECORD = np.dtype(
    [("count", "<i8"), ("size", "<i8"), ("version", "<i8"), ("sha256", "u1", (32,)), ("state", "i1"),
     ("compressed", "?"), ("token_set", "<i2"), ("tokens", "<i8", (MAX_TOKEN_FIELDS,))]
)
#: Row states: not read yet, kept from the previous run, indexed now, left out.
TO_READ, KEPT, INDEXED, SKIPPED = 0, 1, 2, 3
#: Rows read or written at a time (about 0.5 MB of records).
CHUNK_ROWS = (512 << 10) // RECORD.itemsize


class ShardResults:
    """One :data:`RECORD` per shard in a file, all ``TO_READ`` at first.

    Args:
        path: The file (created; the caller removes it).
        num_shards: Rows.
        keep: Open the rows already in ``path`` (of an earlier run; see
            :mod:`~shardkit.index.journal`) instead of starting afresh.
    """

    def __init__(self, path: str, num_shards: int, *, keep: bool = False):
        self.path = path
        self.num_shards = num_shards
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | (0 if keep else os.O_TRUNC), 0o600)
        os.ftruncate(self._fd, num_shards * RECORD.itemsize)  # zero bytes: state TO_READ

    def put(self, row: int, records: np.ndarray) -> None:
        """Write ``records`` (a :data:`RECORD` array) from row ``row`` on."""
        assert 0 <= row and row + len(records) <= self.num_shards
        os.pwrite(self._fd, np.ascontiguousarray(records, dtype=RECORD).tobytes(), row * RECORD.itemsize)

    def get(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` (read-only)."""
        size = (stop - start) * RECORD.itemsize
        data = os.pread(self._fd, size, start * RECORD.itemsize)
        assert len(data) == size, (len(data), size)
        return np.frombuffer(data, dtype=RECORD)

    def chunks(self, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, records)`` pieces of at most ``rows`` rows (default
        :data:`CHUNK_ROWS`), in order."""
        rows = rows or CHUNK_ROWS
        for start in range(0, self.num_shards, rows):
            yield start, self.get(start, min(self.num_shards, start + rows))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ShardResults:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def published(records: np.ndarray) -> np.ndarray:
    """Which rows go into the table: kept or indexed."""
    state = records["state"]
    return (state == KEPT) | (state == INDEXED)


def index_name_for(names: np.ndarray) -> np.ndarray:
    """Offset-index names for shard names (``a/b.tar`` -> ``a/b.idx``;
    other suffixes keep theirs: ``b.tar.gz`` -> ``b.tar.gz.idx``), as arrays."""
    if len(names) == 0:
        return names
    # np.char throughout: shardkit supports numpy 1.24 and later.
    parts = np.char.rpartition(names, b".tar")
    plain = (parts[:, 1] == b".tar") & (parts[:, 2] == b"")
    stems = np.where(plain, parts[:, 0], names)
    return np.char.add(stems, INDEX_SUFFIX.encode())


def count_compressed(names: np.ndarray, compressed: np.ndarray) -> int:
    """Compressed shards: found so this run, or named so (kept from a previous run)."""
    if len(names) == 0:
        return 0
    lower = np.char.lower(names)
    named = np.zeros(len(names), dtype=bool)
    for suffix in SHARD_SUFFIXES:
        named |= np.char.endswith(lower, suffix.encode())
    return int((compressed | named).sum())


def _published_pieces(results: ShardResults, names: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(records, names)`` of the published rows, a chunk at a time."""
    for start, records in results.chunks():
        ok = published(records)
        yield records[ok], names[start : start + len(records)][ok]


def _offsets(writer: ColumnWriter, pieces: Iterable[np.ndarray], n: int) -> None:
    """A column of ``n + 1`` running totals of ``pieces``' values, from 0."""
    writer.begin(np.dtype("<i8"), (n + 1,))
    writer.add(np.zeros(1, dtype=np.int64))
    total = 0
    for values in pieces:
        if len(values):
            sums = total + np.cumsum(values, dtype=np.int64)
            writer.add(sums)
            total = int(sums[-1])


def write_table(
    f: Any, results: ShardResults, names: np.ndarray, naming: Naming | None, num_token_fields: int = 0
) -> tuple[str, int]:
    """Write the table file of the published rows of ``results`` (in row
    order; ``names`` are the listing's) into the open binary file ``f``.

    Args:
        naming: The shards' naming (the table stores no paths), or None.
        num_token_fields: The token fields the table counts (its ``tokens``
            column: the first ones of each record's ``tokens``), or 0.

    Returns:
        The file's hex SHA-256 and its size in bytes.
    """
    n, path_bytes, index_bytes = 0, 0, 0
    for records, chosen in _published_pieces(results, names):
        n += len(records)
        if naming is None and len(chosen):
            path_bytes += int(np.char.str_len(chosen).sum())
            index_bytes += int(np.char.str_len(index_name_for(chosen)).sum())
    writer = ColumnWriter(f)
    _offsets(writer, (records["count"] for records, _ in _published_pieces(results, names)), n)  # starts
    for field, shape, dtype in (("count", (n,), "<i8"), ("size", (n,), "<i8"), ("sha256", (n, 32), "u1")):
        writer.begin(np.dtype(dtype), shape)
        for records, _ in _published_pieces(results, names):
            writer.add(records[field])
    if naming is None:
        for total, convert in ((path_bytes, lambda a: a), (index_bytes, index_name_for)):
            pieces = (convert(chosen) for _, chosen in _published_pieces(results, names))
            _offsets(writer, (np.char.str_len(p).astype(np.int64) for p in pieces if len(p)), n)
            writer.begin(np.dtype("u1"), (total,))
            for _, chosen in _published_pieces(results, names):
                if len(chosen):
                    writer.add(bytes_array_columns(convert(chosen), len(chosen))[1])
    if num_token_fields:
        writer.begin(np.dtype("<i8"), (n, num_token_fields))
        for records, _ in _published_pieces(results, names):
            writer.add(np.ascontiguousarray(records["tokens"][:, :num_token_fields]))
    return writer.finish(), writer.size


def token_set_of(results: ShardResults, names: np.ndarray) -> tuple[int, str | None]:
    """The one ``token_set`` every published shard holding samples has (0
    when there are none), or -1 and the name of the first shard whose set
    differs from the one before it."""
    found = -1
    for records, chosen in _published_pieces(results, names):
        sets = records["token_set"][records["count"] > 0]
        if len(sets) == 0:
            continue
        if found < 0:
            found = int(sets[0])
        differs = np.flatnonzero(sets != found)
        if len(differs):
            named = chosen[records["count"] > 0][differs[0]]
            return -1, bytes(named).decode("utf-8", "surrogateescape")
    return max(found, 0), None


def write_versions(f: Any, results: ShardResults) -> None:
    """Write the published rows' versions as one ``.npy`` int64 array into the open binary file ``f``."""
    n = sum(int(published(records).sum()) for _, records in results.chunks())
    writer = ColumnWriter(f)
    writer.begin(np.dtype("<i8"), (n,))
    for _, records in results.chunks():
        writer.add(records["version"][published(records)])
    writer.finish()
