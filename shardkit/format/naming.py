"""Shard names that follow from the shard's position, and finding such a naming in a list of names.

A dataset whose shards are named by position (``shard-000000.tar``,
``00000.tar``...) records the pattern once, as a :class:`Naming`, instead of a
path per shard (see :mod:`shardkit.format.table`). :func:`numbered` finds it
in a column of names without a Python object per name; ``shardkit index``
uses it, and :func:`columns_naming` (a table's shard and index path columns)
for :func:`~shardkit.format.table.build_table`, and so ``shardkit upgrade``:
both store a pattern for the same names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

_NAMING_PART = re.compile(r"^[A-Za-z0-9_.-]*\{:0[1-9]d\}[A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Naming:
    """Shard and index names that follow from the shard's position.

    Attributes:
        shard: A ``str.format`` pattern, ``"shard-{:06d}.tar"``.
        index: The index's pattern, ``"shard-{:06d}.idx"``.

    A pattern is letters, digits, ``_.-`` and one ``{:0Nd}`` field (N from 1
    to 9): a name made from it has no ``/`` and cannot leave the dataset.
    """

    shard: str
    index: str

    def __post_init__(self) -> None:
        for pattern in (self.shard, self.index):
            if not isinstance(pattern, str) or not _NAMING_PART.match(pattern) or pattern.startswith("."):
                raise ValueError(f"not a shard naming pattern: {pattern!r}")

    def to_dict(self) -> dict[str, str]:
        return {"shard": self.shard, "index": self.index}


#: The names shardkit's writers give shards (see :mod:`shardkit.write.destination`).
WRITER_NAMING = Naming(shard="shard-{:06d}.tar", index="shard-{:06d}.idx")

_NUMBERED = re.compile(rb"^([A-Za-z0-9_.-]*?)(\d{1,9})\.tar$")


def numbered(names: np.ndarray | Iterable[np.ndarray]) -> Naming | None:
    """The :class:`Naming` of shards named by their positions (``00000.tar``,
    ``00001.tar``..., img2dataset's and shardkit's naming), or None.

    The index names that go with it are the shard names with ``.idx`` for
    ``.tar`` (``00000.idx``); a caller with index names of its own checks
    them against ``naming.index``.

    Args:
        names: The names (a numpy bytes array), or the pieces they come in, in order.
    """
    pieces = [names] if isinstance(names, np.ndarray) else names
    naming, position, prefix, width = None, 0, b"", 0
    for piece in pieces:
        if len(piece) == 0:
            continue
        if naming is None:
            match = _NUMBERED.match(bytes(piece[0]))
            if match is None or int(match.group(2)) != 0:
                return None
            prefix, width = match.group(1), len(match.group(2))
            try:
                naming = Naming(
                    shard=f"{prefix.decode()}{{:0{width}d}}.tar", index=f"{prefix.decode()}{{:0{width}d}}.idx"
                )
            except ValueError:  # a prefix a naming pattern cannot hold (a leading dot)
                return None
        if position + len(piece) > 10**width:
            return None
        digits = np.char.zfill(np.arange(position, position + len(piece)).astype(f"S{width}"), width)
        if not np.array_equal(np.char.add(np.char.add(prefix, digits), b".tar"), piece):
            return None
        position += len(piece)
    return naming


class NumberedNames:
    """The names one pattern of a :class:`Naming` gives rows ``0..n-1``,
    made only for the rows asked for (no array of all of them): a previous
    run's shard or index names when its table stores none.

    Args:
        pattern: ``naming.shard`` or ``naming.index`` (``HEAD{:0Nd}TAIL``).
        length: Rows.
    """

    def __init__(self, pattern: str, length: int):
        head, rest = pattern.split("{:0", 1)
        self._head, self._tail = head.encode(), rest.split("}", 1)[1].encode()
        self._width = int(rest.split("d}", 1)[0])
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        """The names of ``rows`` (positions, or a mask)."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        if len(rows) == 0:
            return np.zeros(0, dtype="S1")
        digits = np.char.zfill(rows.astype(f"S{max(self._width, len(str(max(self._length - 1, 0))))}"), self._width)
        return np.char.add(np.char.add(self._head, digits), self._tail)

    def rows_of(self, names: np.ndarray) -> np.ndarray:
        """Each name's row, or -1 (a name this pattern does not make for a row)."""
        n, digits_at = len(names), len(self._head)
        size = digits_at + self._width + len(self._tail)
        rows = np.full(n, -1, dtype=np.int64)
        if n == 0 or names.dtype.itemsize < size:
            return rows
        cells = np.ascontiguousarray(names).view(np.uint8).reshape(n, names.dtype.itemsize)
        digits = cells[:, digits_at : digits_at + self._width].astype(np.int64) - ord("0")
        fits = (np.char.str_len(names) == size) & ((digits >= 0) & (digits <= 9)).all(axis=1)
        fits &= np.char.startswith(names, self._head) & np.char.endswith(names, self._tail)
        numbers = digits @ (10 ** np.arange(self._width - 1, -1, -1, dtype=np.int64))
        fits &= numbers < self._length
        rows[fits] = numbers[fits]
        return rows


def _same_length_names(offsets: np.ndarray, blob: np.ndarray) -> np.ndarray | None:
    """A path column as a numpy bytes array when all its names are as long
    (as numbered names are) and hold no NUL; else None."""
    n = len(offsets) - 1
    width = int(offsets[1]) if n else 0
    if n == 0 or width == 0 or len(blob) != n * width or (blob == 0).any():
        return None
    if not (np.diff(offsets) == width).all():
        return None
    return np.ascontiguousarray(blob).view(f"S{width}")


def columns_naming(path_columns: tuple[np.ndarray, np.ndarray], index_columns: tuple[np.ndarray, np.ndarray]) -> Naming | None:
    """The naming pattern stored shard and index paths follow (as
    :func:`numbered` finds it for ``shardkit index``), or None.

    Args:
        path_columns: The shard paths: n + 1 offsets and their UTF-8 bytes.
        index_columns: The index paths, the same way; they must be the
            pattern's index names.
    """
    names = _same_length_names(*path_columns)
    index_names = _same_length_names(*index_columns)
    if names is None or index_names is None:
        return None
    naming = numbered(names)
    if naming is None:
        return None
    expected = NumberedNames(naming.index, len(names))[np.arange(len(names))]
    return naming if np.array_equal(expected, index_names) else None
