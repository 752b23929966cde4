"""A table's path column checked at once: which entries need the full per-entry resolver.

A shard table without a naming pattern stores a path per shard (see
:mod:`shardkit.format.table`): offsets into one UTF-8 byte string. Resolving
each of them with :func:`~shardkit.format.location.resolve_inside` when a
dataset is opened costs tens of microseconds a shard: 17 s at 5x10^5 shards.
Most entries are *plain*, and for a plain entry that resolver can only add
the base in front (and, on a local disk, follow symlinks)::

    non-empty; no NUL, '\\', '%', '?', '#' or ':' byte (so no scheme, no
    percent-encoding, no query); no '/' at the start or the end, no '//',
    no '.' or '..' segment

:func:`irregular_entries` finds the entries that are not plain, in numpy
over the column's bytes, a block of entries at a time (memory bounded
whatever the shard count). The reader resolves just those when it opens a
dataset, so a hostile entry anywhere in the column is refused there, by
the resolver's own message; every entry, plain or not, is still resolved by
``resolve_inside`` when its shard is read (that is where a symlink leading
out of the dataset is refused, as for names made from a naming pattern).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Entries checked per block (bounds the temporaries: a few bytes per byte of the block).
BLOCK_ENTRIES = 1 << 16

_SLASH, _DOT = ord("/"), ord(".")
#: Bytes an entry must not hold to be plain.
_SPECIAL = np.zeros(256, dtype=bool)
_SPECIAL[list(b"\0\\%?#:")] = True
#: Each byte in lower case (ASCII letters; other bytes as they are).
_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[ord("A") : ord("Z") + 1] += 32


def irregular_entries(offsets: np.ndarray, blob: np.ndarray) -> np.ndarray:
    """The rows whose entry is not a plain relative path (see the module's docstring), in order.

    Args:
        offsets: n + 1 rising offsets into ``blob``, from 0 (checked by the table).
        blob: The entries' UTF-8 bytes, concatenated.

    Returns:
        An int64 array of rows; empty when every entry is plain.
    """
    n = len(offsets) - 1
    found = [_block(offsets[first : min(n, first + BLOCK_ENTRIES) + 1], blob) + first for first in range(0, n, BLOCK_ENTRIES)]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _block(offsets: np.ndarray, blob: np.ndarray) -> np.ndarray:
    """:func:`irregular_entries` of the entries ``offsets`` bounds (rows from 0)."""
    lo, hi = int(offsets[0]), int(offsets[-1])
    local = np.asarray(offsets, dtype=np.int64) - lo
    data = np.asarray(blob[lo:hi])
    m = len(local) - 1
    bad = local[1:] == local[:-1]  # empty entries
    special = np.flatnonzero(_SPECIAL[data])
    bad[np.searchsorted(local, special, side="right") - 1] = True
    # The entries joined with '/' before, between and after them: each
    # segment of each entry then lies between two slashes, and '//', '/./'
    # and '/../' find empty, '.' and '..' segments, a leading or trailing '/'.
    separators = local + np.arange(m + 1)
    joined = np.full(len(data) + m + 1, _SLASH, dtype=np.uint8)
    is_data = np.ones(len(joined), dtype=bool)
    is_data[separators] = False
    joined[is_data] = data
    slash, dot = joined == _SLASH, joined == _DOT
    hits = [
        slash[:-1] & slash[1:],
        slash[:-2] & dot[1:-1] & slash[2:],
        slash[:-3] & dot[1:-2] & dot[2:-1] & slash[3:],
    ]
    for hit in hits:
        at = np.flatnonzero(hit)
        bad[np.searchsorted(separators, at, side="right") - 1] = True
    return np.flatnonzero(bad).astype(np.int64)


def any_entry_ends_with(offsets: np.ndarray, blob: np.ndarray, suffixes: Iterable[str], *, cut: str | None = None) -> bool:
    """Whether some entry ends with one of ``suffixes`` (ASCII, any case), in
    numpy over the entries' last bytes.

    Args:
        offsets: n + 1 rising offsets into ``blob``, from 0.
        blob: The entries' UTF-8 bytes, concatenated.
        suffixes: Lower-case ASCII suffixes (``".tar.gz"``).
        cut: An ASCII character that ends an entry where it first appears
            (``"?"``: a name before its query), or None.
    """
    starts = np.asarray(offsets[:-1], dtype=np.int64)
    ends = np.array(offsets[1:], dtype=np.int64)
    if cut is not None:
        at = np.flatnonzero(np.asarray(blob) == ord(cut))
        rows, first = np.unique(np.searchsorted(offsets, at, side="right") - 1, return_index=True)
        ends[rows] = at[first]
    for suffix in suffixes:
        wanted = suffix.encode("ascii")
        long_enough = ends[ends - starts >= len(wanted)]
        match = np.ones(len(long_enough), dtype=bool)
        for back, byte in enumerate(reversed(wanted), start=1):
            match &= _LOWER[blob[long_enough - back]] == byte
        if match.any():
            return True
    return False


def is_plain(entry: str) -> bool:
    """Whether one entry is plain, by the rule :func:`irregular_entries` applies to a column."""
    if not entry or any(c in entry for c in "\0\\%?#:"):
        return False
    return all(part not in ("", ".", "..") for part in entry.split("/"))


def strings_to_columns(strings: Iterable[str] | np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and concatenated UTF-8 bytes of ``n`` paths (strings, or a
    numpy ``S`` array: see :func:`bytes_array_columns`).

    Raises:
        ValueError: ``strings`` does not hold ``n`` paths.
    """
    if isinstance(strings, np.ndarray) and strings.dtype.kind == "S":
        return bytes_array_columns(strings, n)
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    if len(encoded) != n:
        raise ValueError(f"{len(encoded)} paths for {n} shards")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter((len(b) for b in encoded), dtype=np.int64, count=n), out=offsets[1:])
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return offsets, blob


def bytes_array_columns(names: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and concatenated bytes of a fixed-width bytes array (numpy
    ``S`` dtype, UTF-8 names padded with NULs), without a Python object per name.

    Raises:
        ValueError: ``names`` does not hold ``n`` names.
    """
    if names.shape != (n,):
        raise ValueError(f"{names.shape} paths for {n} shards")
    width = names.dtype.itemsize
    offsets = np.zeros(n + 1, dtype=np.int64)
    if n == 0 or width == 0:
        return offsets, np.zeros(0, dtype=np.uint8)
    cells = np.ascontiguousarray(names).view(np.uint8).reshape(n, width)
    lengths = np.char.str_len(names).astype(np.int64)  # np.char: numpy 1.24 and later
    np.cumsum(lengths, out=offsets[1:])
    blob = cells[np.arange(width)[None, :] < lengths[:, None]]
    return offsets, blob
