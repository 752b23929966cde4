"""Writing shard table files: whole (:func:`write_shard_table`), or a
column piece at a time (for tables too large to build in memory).

:func:`~shardkit.format.table.encode_columns` lays out a table file from
whole arrays; :class:`ColumnWriter` writes the same bytes from pieces of
each column, hashing as it goes, so that ``shardkit index`` writes the
table of any number of shards in constant memory.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardkit.format.naming import WRITER_NAMING, Naming
from shardkit.format.table import ALIGN, ShardTable, build_table, open_table, table_name


class ColumnWriter:
    """Writes a table file's columns one piece at a time, as
    :func:`encode_columns` lays them out (the same bytes), hashing as it goes:
    a table of any size written in constant memory.

    Call :meth:`begin` with each column's dtype and shape, then :meth:`add`
    its values (in order, any number of pieces), then :meth:`finish`.
    """

    def __init__(self, f: Any):
        self._f = f
        self._digest = hashlib.sha256()
        self.size = 0
        self._left = 0

    def _write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._digest.update(data)
        self.size += len(data)

    def begin(self, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        """Start a column (after the previous one got all its values)."""
        self._pad()
        header = io.BytesIO()
        fields = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(header, fields)
        self._write(header.getvalue())
        self._dtype = np.dtype(dtype)
        self._left = int(np.prod(shape, dtype=np.int64)) * self._dtype.itemsize

    def add(self, values: np.ndarray) -> None:
        """The column's next values (C order)."""
        data = memoryview(np.ascontiguousarray(values, dtype=self._dtype)).cast("B")
        if len(data) > self._left:
            raise ValueError(f"{len(data)} bytes more for a column that takes {self._left} more")
        self._left -= len(data)
        self._write(data)

    def _pad(self) -> None:
        if self._left:
            raise ValueError(f"the column still takes {self._left} bytes")
        if self.size % ALIGN:
            self._write(b"\0" * (-(-self.size // ALIGN) * ALIGN - self.size))

    def finish(self) -> str:
        """Pad the last column; returns the file's hex SHA-256."""
        self._pad()
        return self._digest.hexdigest()


def write_shard_table(
    directory: str,
    counts: Sequence[int] | np.ndarray,
    num_bytes: Sequence[int] | np.ndarray,
    sha256: np.ndarray | Sequence[str],
    *,
    paths: Sequence[str] | None = None,
    index_paths: Sequence[str] | None = None,
    naming: Naming | None = WRITER_NAMING,
    tokens: np.ndarray | None = None,
) -> ShardTable:
    """Write a table file into the local folder ``directory`` and open it.

    The columns are as for :func:`build_table`. The file is written under a
    temporary name, fsynced and renamed to ``shards-<sha>.table``; nothing
    else is written (pair it with a manifest:
    ``Manifest.from_table(table, ...)`` and
    :func:`shardkit.write.publish.publish_manifest`, or ``to_json()``).

    Returns:
        The table, memory-mapped from its file.
    """
    table = build_table(counts, num_bytes, sha256, paths=paths, index_paths=index_paths, naming=naming, tokens=tokens)
    data = table.encode()
    digest = table.file_sha256()
    final = os.path.join(directory, table_name(digest))
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return open_table(final, naming=table.naming, expected_size=len(data), expected_sha256=digest)
