"""Writing a shard table file a column piece at a time (for tables too large to build in memory).

:func:`~shardkit.format.table.encode_columns` lays out a table file from
whole arrays; :class:`ColumnWriter` writes the same bytes from pieces of
each column, hashing as it goes, so that ``shardkit index`` writes the
table of any number of shards in constant memory.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import numpy as np

from shardkit.format.table import ALIGN


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
