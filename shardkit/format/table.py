"""The shard table: per-shard metadata as columns in one memory-mapped file.

A format-2 dataset keeps its per-shard metadata (sample counts, sizes,
checksums and, unless they follow the writer's naming, shard and index paths)
in one binary file beside ``manifest.json``, named by its content::

    shards-<first 16 hex digits of its SHA-256>.table

so a new table never overwrites the one an older ``manifest.json`` names
(``shardkit upgrade`` writes the new table, then replaces the manifest, then
removes the tables no manifest names).

The file is a sequence of standard ``.npy`` arrays, each starting at a
64-byte aligned offset, in this order:

=================  ===========  =============================================
column             dtype        shape
=================  ===========  =============================================
``starts``         int64        n + 1: cumulative sample counts, starts[0] = 0
``counts``         int64        n: samples per shard (= diff of ``starts``)
``num_bytes``      int64        n: size of each tar file
``sha256``         uint8        (n, 32): SHA-256 of each tar file
``path_offsets``   int64        n + 1  (only without a naming pattern)
``path_bytes``     uint8        UTF-8 shard paths, concatenated
``index_offsets``  int64        n + 1  (only without a naming pattern)
``index_bytes``    uint8        UTF-8 index paths, concatenated
``tokens``         int64        (n, k): tokens per shard of each of the
                                manifest's ``token_fields`` (only with them)
``removed``        uint64       r: samples removed by ``shardkit remove``,
                                ``shard << 32 | position`` (only with some)
=================  ===========  =============================================

``removed`` (manifest format 4, see :mod:`shardkit.format.removed`) comes
after ``tokens``, told from it by its dtype; with it, ``counts`` count the
samples kept.

The ``tokens`` column (manifest format 3, see :mod:`shardkit.format.tokens`)
comes last, and only when the dataset records token counts: a table without
it is byte for byte what shardkit wrote before it existed.

A process opens it with ``mmap`` and sees the columns as read-only numpy
arrays: nothing is parsed into per-shard Python objects, and every process on
a node shares the same pages. Opening checks the file's size, every header
(dtype, shape, order), that the shapes agree with the shard count, that
``starts`` rises from 0 to the manifest's ``num_samples``, that the byte sizes
add up to its ``num_bytes`` and that every string offset is in range: the
file is data from wherever it came from.

Shards written by shardkit are named ``shard-000000.tar`` (index
``shard-000000.idx``) by position; such a table stores no path strings, the
manifest records the :class:`Naming` instead. So does a table built from
paths that follow any such pattern (``train-0000000.tar``..., found by
:func:`~shardkit.format.naming.numbered` as ``shardkit index`` finds it),
whoever made them: ``shardkit upgrade`` of a format-1 listing, say.
"""

from __future__ import annotations

import ast
import hashlib
import io
import mmap
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import ManifestError
from shardkit.format.naming import WRITER_NAMING, Naming, columns_naming
from shardkit.format.path_column import strings_to_columns
from shardkit.format.removed import REMOVED_DTYPE, column_problem

TABLE_PREFIX = "shards-"
TABLE_SUFFIX = ".table"
#: Every array in the file starts at a multiple of this many bytes.
ALIGN = 64
#: Largest ``.npy`` header accepted (numpy writes ~128 bytes).
MAX_HEADER_BYTES = 4096
#: A table name: ``shards-`` + 16 hex digits + ``.table``.
TABLE_NAME = re.compile(r"^shards-[0-9a-f]{16}\.table$")
#: What to run when a table and its manifest disagree.
TABLE_ADVICE = "run `shardkit verify` on the dataset, then rewrite it (`shardkit write`) or rerun `shardkit upgrade`"

_NUMERIC = ("starts", "counts", "num_bytes", "sha256")
_STRINGS = ("path_offsets", "path_bytes", "index_offsets", "index_bytes")
_DTYPES = {
    "starts": np.dtype("<i8"),
    "counts": np.dtype("<i8"),
    "num_bytes": np.dtype("<i8"),
    "sha256": np.dtype("u1"),
    "path_offsets": np.dtype("<i8"),
    "path_bytes": np.dtype("u1"),
    "index_offsets": np.dtype("<i8"),
    "index_bytes": np.dtype("u1"),
    "tokens": np.dtype("<i8"),
    "removed": np.dtype("<u8"),
}
#: Optional columns after the others, in order, each told by its dtype.
_OPTIONAL = ("tokens", "removed")
_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ShardEntry:
    """One shard as recorded in the manifest.

    Attributes:
        path: Shard path relative to the manifest.
        num_samples: Samples in the shard.
        num_bytes: Size of the tar file in bytes.
        sha256: Hex SHA-256 of the tar file.
        index: Offset-index path relative to the manifest.
    """

    path: str
    num_samples: int
    num_bytes: int
    sha256: str
    index: str


def table_name(sha256_hex: str) -> str:
    """The file name of a table whose bytes hash to ``sha256_hex``."""
    return f"{TABLE_PREFIX}{sha256_hex[:16]}{TABLE_SUFFIX}"


class ShardTable:
    """Per-shard columns of a dataset, held as (usually memory-mapped) arrays.

    Build one with :func:`build_table` (from arrays), :meth:`from_entries`,
    :func:`decode_table` (from bytes) or :func:`open_table` (a file). All
    arrays are read-only.

    Attributes:
        starts: Cumulative sample counts (n + 1): shard ``i`` holds samples
            ``[starts[i], starts[i + 1])``.
        counts: Samples per shard (n).
        num_bytes: Tar file size per shard (n).
        sha256: SHA-256 digests, an (n, 32) uint8 array.
        tokens: Token counts per shard, an (n, k) int64 array whose column
            ``j`` is the manifest's ``token_fields[j]``; None without them.
        removed: The samples removed from the shards (see
            :mod:`shardkit.format.removed`), or None when none were.
        naming: How shard names follow from positions, or None when the
            table stores path strings.
        file: The file the table was opened from, or None.
    """

    def __init__(self, columns: dict[str, np.ndarray], naming: Naming | None, *, file: str | None = None,
                 keep: Any = None):
        self.starts = columns["starts"]
        self.counts = columns["counts"]
        self.num_bytes = columns["num_bytes"]
        self.sha256 = columns["sha256"]
        self.tokens: np.ndarray | None = columns.get("tokens")
        self.removed: np.ndarray | None = columns.get("removed")
        self.naming = naming
        self.file = file
        self._columns = columns
        self._keep = keep  # the mmap or bytes the arrays view
        # A table decoded from bytes, or mapped from its file, encodes as
        # those bytes (no copy of a mapped file: hashing or writing it reads
        # the file's pages).
        self._encoded: bytes | mmap.mmap | None = keep if isinstance(keep, (bytes, mmap.mmap)) else None
        self._sha256: str | None = None
        self._size = len(keep) if keep is not None else None
        #: How a receiver gets this table again when it is pickled, if not
        #: by mapping ``file`` (a table fetched from a remote dataset: fetch
        #: it into the receiver's own cache). A picklable callable.
        self.reopen: Callable[[], ShardTable] | None = None

    @property
    def num_shards(self) -> int:
        return len(self.counts)

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    @property
    def total_bytes(self) -> int:
        return int(self.num_bytes.sum())

    def path(self, shard: int) -> str:
        """Shard ``shard``'s path relative to the dataset."""
        shard = self._check(shard)
        if self.naming is not None:
            return self.naming.shard.format(shard)
        return _string(self._columns["path_offsets"], self._columns["path_bytes"], shard)

    def index_path(self, shard: int) -> str:
        """Shard ``shard``'s offset-index path relative to the dataset."""
        shard = self._check(shard)
        if self.naming is not None:
            return self.naming.index.format(shard)
        return _string(self._columns["index_offsets"], self._columns["index_bytes"], shard)

    def path_columns(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None:
        """The stored shard and index paths, each as (n + 1 offsets,
        concatenated UTF-8 bytes), read-only views of the table; None when
        the names follow :attr:`naming`."""
        if self.naming is not None:
            return None
        c = self._columns
        return (c["path_offsets"], c["path_bytes"]), (c["index_offsets"], c["index_bytes"])

    def drop_pages(self) -> None:
        """Unmap the pages of the table file this process has touched (a
        check that read every column once), where the system allows: they
        stay in the page cache, shared, and map again on the next access; the
        process's own memory then holds the columns it goes on to use, not
        the whole file."""
        if isinstance(self._keep, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            self._keep.madvise(mmap.MADV_DONTNEED)

    def sha256_hex(self, shard: int) -> str:
        return bytes(self.sha256[self._check(shard)]).hex()

    def entry(self, shard: int) -> ShardEntry:
        """Shard ``shard`` as a :class:`ShardEntry` (built on each call)."""
        shard = self._check(shard)
        return ShardEntry(
            path=self.path(shard),
            num_samples=int(self.counts[shard]),
            num_bytes=int(self.num_bytes[shard]),
            sha256=self.sha256_hex(shard),
            index=self.index_path(shard),
        )

    def _check(self, shard: int) -> int:
        n = self.num_shards
        shard = int(shard)
        if shard < 0:
            shard += n
        if not 0 <= shard < n:
            raise IndexError(f"shard {shard} out of range (the dataset has {n} shards)")
        return shard

    def fingerprint(self) -> str:
        """The dataset fingerprint of format 1: a hash of each shard's path,
        SHA-256 and sample count, in order (loops over the shards)."""
        digest = hashlib.sha256()
        for i in range(self.num_shards):
            digest.update(f"{self.path(i)}\0{self.sha256_hex(i)}\0{int(self.counts[i])}\n".encode())
        if self.removed is not None:  # which samples are gone, not only how many
            digest.update(b"removed\0" + np.ascontiguousarray(self.removed, dtype="<u8").tobytes())
        return digest.hexdigest()

    def encode(self) -> bytes | mmap.mmap:
        """The table file's bytes (the same for the same columns; a mapped
        table's file as it is, a read-only buffer)."""
        if self._encoded is None:
            names = _column_names(self.naming) + tuple(name for name in _OPTIONAL if name in self._columns)
            self._encoded = encode_columns([self._columns[name] for name in names])
        return self._encoded

    def file_sha256(self) -> str:
        """Hex SHA-256 of :meth:`encode`."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.encode()).hexdigest()
        return self._sha256

    def revised(self, counts: np.ndarray, *, tokens: np.ndarray | None, removed: np.ndarray) -> ShardTable:
        """This table with new ``counts`` (and ``starts``), ``tokens`` and
        ``removed`` columns, in memory: what ``shardkit remove`` publishes
        (:mod:`shardkit.format.removed`). ValueError: columns that do not fit."""
        n = self.num_shards
        counts = np.array(counts, dtype=np.int64)
        if counts.shape != (n,) or (counts < 0).any():
            raise ValueError(f"{counts.shape} counts for {n} shards, or a negative one")
        if (tokens is None) != (self.tokens is None) or (tokens is not None and tokens.shape != self.tokens.shape):  # type: ignore[union-attr]
            raise ValueError("token counts of another shape than the table's")
        columns = {name: array for name, array in self._columns.items() if name != "removed"}  # read-only: shared
        columns["counts"] = counts
        columns["starts"] = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        if tokens is not None:
            columns["tokens"] = np.array(tokens, dtype=np.int64)
        columns["removed"] = np.array(removed, dtype=REMOVED_DTYPE)
        problem = column_problem(columns["removed"], counts)
        if problem:
            raise ValueError(problem)
        for array in columns.values():
            array.flags.writeable = False
        return ShardTable(columns, self.naming)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.reopen is not None:
            return (self.reopen, ())
        if self.file is not None:  # small: where the file is; the receiver maps it again
            return (_reopen, (self.file, self._size, self.naming))
        return (decode_table, (self.encode(), self.naming))

    def __repr__(self) -> str:
        return f"ShardTable({self.num_shards} shards, {self.num_samples} samples, file={self.file!r})"


def _column_names(naming: Naming | None) -> tuple[str, ...]:
    """The columns every table with (or without) a naming pattern has, in order."""
    return _NUMERIC if naming is not None else _NUMERIC + _STRINGS


def _reopen(file: str, size: int, naming: Naming | None) -> ShardTable:
    # A worker reopening a table its parent opened checks the size and the
    # structure only, not the SHA-256 (the parent did; hashing 24 MB in each
    # of 64 workers would cost more than the rest of opening).
    return open_table(file, naming=naming, expected_size=size)


def _string(offsets: np.ndarray, blob: np.ndarray, i: int) -> str:
    return bytes(blob[int(offsets[i]) : int(offsets[i + 1])]).decode("utf-8", "surrogateescape")


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def encode_columns(arrays: Sequence[np.ndarray]) -> bytes:
    """``.npy`` arrays back to back, each at a 64-byte aligned offset."""
    out = io.BytesIO()
    for array in arrays:
        np.lib.format.write_array(out, np.ascontiguousarray(array), allow_pickle=False)
        out.write(b"\0" * (_align(out.tell()) - out.tell()))
    return out.getvalue()


def sha256_column(hexes: Iterable[str], n: int) -> np.ndarray:
    """An (n, 32) uint8 array of hex SHA-256 strings (ValueError on a bad one)."""
    joined = "".join(hexes)
    if len(joined) != 64 * n:
        raise ValueError("a sha256 is not 64 hex digits")
    return np.frombuffer(bytes.fromhex(joined), dtype=np.uint8).reshape(n, 32)


def build_table(
    counts: Sequence[int] | np.ndarray,
    num_bytes: Sequence[int] | np.ndarray,
    sha256: np.ndarray | Sequence[str],
    *,
    paths: Sequence[str] | None = None,
    index_paths: Sequence[str] | None = None,
    naming: Naming | None = WRITER_NAMING,
    tokens: np.ndarray | None = None,
    removed: np.ndarray | None = None,
) -> ShardTable:
    """A table in memory from per-shard columns.

    Args:
        counts: Samples per shard.
        num_bytes: Tar size per shard.
        sha256: An (n, 32) uint8 array, or n hex strings.
        paths: Shard paths (strings, or a numpy ``S`` array of UTF-8
            names); None when they follow ``naming``.
        index_paths: Index paths, the same way; None when they follow ``naming``.
        naming: The naming of shards given no paths. Given paths that
            follow a naming pattern (:func:`~shardkit.format.naming.numbered`:
            ``NAME-0000000.tar``..., indexes ``NAME-0000000.idx``...), the
            pattern is stored instead of them whatever this says, unless it
            is None: None always stores paths.
        tokens: Token counts per shard, ``(n, k)`` with k >= 1 (the
            manifest names the k fields), or None: no ``tokens`` column.
        removed: The ``removed`` column (:func:`~shardkit.format.removed.pack`;
            ``counts`` then count the samples kept), or None: no such column.

    Raises:
        ValueError: Columns of different lengths, negative counts, sizes
            or token counts, a SHA-256 that is not 32 bytes, a bad
            ``removed`` column, or no paths and no naming.
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    n = len(counts)
    sizes = np.asarray(num_bytes, dtype=np.int64).reshape(-1)
    if not isinstance(sha256, np.ndarray) or sha256.dtype != np.uint8:
        sha256 = sha256_column(sha256, n)
    if len(sizes) != n or sha256.shape != (n, 32):
        raise ValueError(f"columns disagree: {n} counts, {len(sizes)} sizes, sha256 of shape {sha256.shape}")
    if (counts < 0).any() or (sizes < 0).any():
        raise ValueError("negative sample count or size")
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    columns = {"starts": starts, "counts": counts, "num_bytes": sizes, "sha256": sha256}
    if tokens is not None:
        columns["tokens"] = tokens = np.array(tokens, dtype=np.int64)
        if tokens.ndim != 2 or len(tokens) != n or tokens.shape[1] < 1 or (tokens < 0).any():
            raise ValueError(f"token counts of shape {tokens.shape} for {n} shards, or a negative one")
    if removed is not None:
        columns["removed"] = removed = np.array(removed, dtype=REMOVED_DTYPE)
        problem = column_problem(removed, counts)
        if problem:
            raise ValueError(problem)
    if paths is not None or index_paths is not None:
        if paths is None or index_paths is None:
            raise ValueError("give both paths and index_paths, or neither")
        path_columns = strings_to_columns(paths, n)
        index_columns = strings_to_columns(index_paths, n)
        naming = None if naming is None else columns_naming(path_columns, index_columns)
        if naming is None:
            columns["path_offsets"], columns["path_bytes"] = path_columns
            columns["index_offsets"], columns["index_bytes"] = index_columns
    elif naming is None:
        raise ValueError("no paths and no naming")
    for array in columns.values():
        array.flags.writeable = False
    return ShardTable(columns, naming)


def table_from_entries(entries: Iterable[ShardEntry], *, tokens: np.ndarray | None = None) -> ShardTable:
    """A table in memory from shard entries (paths stored unless they follow
    the writer's naming) and, if given, their token counts (see :func:`build_table`)."""
    entries = list(entries)
    return build_table(
        [e.num_samples for e in entries],
        [e.num_bytes for e in entries],
        [e.sha256 for e in entries],
        paths=[e.path for e in entries],
        index_paths=[e.index for e in entries],
        tokens=tokens,
    )


# ---------------------------------------------------------------- reading


class _Bad(Exception):
    """A structural fault in a table file (turned into a ManifestError)."""


def _read_header(buf: Any, pos: int, size: int) -> tuple[np.dtype, tuple[int, ...], int]:
    """Parse the ``.npy`` header at ``pos``; returns dtype, shape and the data offset."""
    if pos + 10 > size:
        raise _Bad(f"ends at byte {size}, before the array header at byte {pos}")
    head = bytes(buf[pos : pos + 10])
    if head[:6] != b"\x93NUMPY":
        raise _Bad(f"no .npy array header at byte {pos}")
    major = head[6]
    if major == 1:
        hlen, start = int.from_bytes(head[8:10], "little"), pos + 10
    elif major in (2, 3):
        if pos + 12 > size:
            raise _Bad(f"truncated array header at byte {pos}")
        hlen, start = int.from_bytes(bytes(buf[pos + 8 : pos + 12]), "little"), pos + 12
    else:
        raise _Bad(f"unknown .npy version {major} at byte {pos}")
    if hlen > MAX_HEADER_BYTES or start + hlen > size:
        raise _Bad(f"array header at byte {pos} is {hlen} bytes, past the end or too long")
    text = bytes(buf[start : start + hlen]).decode("latin1")
    try:
        header = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise _Bad(f"unreadable array header at byte {pos}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise _Bad(f"unexpected array header at byte {pos}")
    shape = header["shape"]
    if header["fortran_order"] is not False or not isinstance(shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48 for d in shape
    ):
        raise _Bad(f"bad array shape or order at byte {pos}")
    try:
        dtype = np.dtype(header["descr"]) if isinstance(header["descr"], str) else None
    except TypeError:
        dtype = None
    if dtype is None:
        raise _Bad(f"bad array dtype at byte {pos}")
    return dtype, shape, start + hlen


def _parse(buf: Any, size: int, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The columns ``names`` from the start of ``buf``, then those of
    :data:`_OPTIONAL` that follow them (each told by its dtype)."""
    columns = {}
    pos = 0
    names = list(names)
    optional = list(_OPTIONAL)
    while names or (optional and pos < size and bytes(buf[pos : pos + 6]) == b"\x93NUMPY"):
        dtype, shape, data = _read_header(buf, pos, size)
        if names:
            name = names.pop(0)
        else:  # the next optional column of this dtype, skipping those absent
            first = optional[0]
            while optional and _DTYPES[optional[0]] != dtype:
                optional.pop(0)
            if not optional:
                raise _Bad(f"column {first} has dtype {dtype}, not {_DTYPES[first]}")
            name = optional.pop(0)
        if dtype != _DTYPES[name]:
            raise _Bad(f"column {name} has dtype {dtype}, not {_DTYPES[name]}")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        end = data + count * dtype.itemsize
        if end > size:
            raise _Bad(f"column {name} needs bytes up to {end}, the file has {size} (truncated)")
        columns[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=data).reshape(shape)
        pos = _align(end)
    if pos != size:
        raise _Bad(f"{size - pos} bytes after the last column (the file is not what the manifest names)")
    return columns


def _check_columns(columns: dict[str, np.ndarray], naming: Naming | None) -> None:
    starts, counts = columns["starts"], columns["counts"]
    if starts.ndim != 1 or len(starts) < 1:
        raise _Bad("column starts is not a 1-d array of n + 1 values")
    n = len(starts) - 1
    for name, shape in (("counts", (n,)), ("num_bytes", (n,)), ("sha256", (n, 32))):
        if columns[name].shape != shape:
            raise _Bad(f"column {name} has shape {columns[name].shape}, the table has {n} shards")
    tokens = columns.get("tokens")
    if tokens is not None and (tokens.ndim != 2 or len(tokens) != n or not tokens.shape[1]):
        raise _Bad(f"column tokens has shape {tokens.shape}, the table has {n} shards")
    if tokens is not None and n and (tokens < 0).any():
        raise _Bad(f"a negative token count (shard {int(np.argmax((tokens < 0).any(axis=1)))})")
    if starts[0] != 0 or (n and ((counts < 0).any() or not np.array_equal(np.diff(starts), counts))):
        raise _Bad("starts do not rise from 0 by the per-shard counts")
    if n and (columns["num_bytes"] < 0).any():
        raise _Bad("a negative shard size")
    removed = columns.get("removed")
    if removed is not None:
        problem = column_problem(removed, counts)
        if problem:
            raise _Bad(problem)
    if naming is None:
        for off, blob in (("path_offsets", "path_bytes"), ("index_offsets", "index_bytes")):
            offsets, data = columns[off], columns[blob]
            if offsets.shape != (n + 1,) or data.ndim != 1:
                raise _Bad(f"column {off} has shape {offsets.shape}, the table has {n} shards")
            if offsets[0] != 0 or offsets[-1] != len(data) or (n and (np.diff(offsets) < 0).any()):
                raise _Bad(f"column {off} is not a rising list of offsets into {blob}")


def decode_table(data: bytes, naming: Naming | None, *, file: str | None = None) -> ShardTable:
    """A table from its bytes, checked (see :func:`open_table`)."""
    names = _column_names(naming)
    try:
        columns = _parse(data, len(data), names)
        _check_columns(columns, naming)
    except _Bad as exc:
        raise ManifestError(f"{file or '<table>'}: damaged shard table: {exc}; {TABLE_ADVICE}", path=file) from None
    return ShardTable(columns, naming, file=file, keep=data)


def open_table(
    file: str,
    *,
    naming: Naming | None,
    expected_size: int | None = None,
    expected_sha256: str | None = None,
) -> ShardTable:
    """Memory-map a table file and check it.

    Args:
        file: The ``.table`` file.
        naming: The manifest's naming pattern, or None when the table stores paths.
        expected_size: The size the manifest states.
        expected_sha256: The SHA-256 the manifest states (None skips the hash:
            a process reopening a table its parent checked).

    Raises:
        ManifestError: Missing file, wrong size or checksum, or damaged
            columns; the message names the file and what to run.
    """
    try:
        fd = os.open(file, os.O_RDONLY)
    except FileNotFoundError:
        raise ManifestError(
            f"{file}: shard table missing (the manifest beside it names it); copy the whole dataset folder, "
            "or rewrite the dataset (`shardkit write`)",
            path=file,
        ) from None
    try:
        size = os.fstat(fd).st_size
        if expected_size is not None and size != expected_size:
            raise ManifestError(
                f"{file}: shard table is {size} bytes, the manifest says {expected_size} (truncated or replaced); "
                f"{TABLE_ADVICE}",
                path=file,
            )
        if size == 0:
            raise ManifestError(f"{file}: empty shard table; {TABLE_ADVICE}", path=file)
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    if expected_sha256 is not None:
        actual = hashlib.sha256(mapped).hexdigest()
        if actual != expected_sha256:
            raise ManifestError(
                f"{file}: shard table SHA-256 is {actual[:16]}..., the manifest says {expected_sha256[:16]}... "
                f"(damaged or replaced); {TABLE_ADVICE}",
                path=file,
            )
    names = _column_names(naming)
    try:
        columns = _parse(mapped, size, names)
        _check_columns(columns, naming)
    except _Bad as exc:
        raise ManifestError(f"{file}: damaged shard table: {exc}; {TABLE_ADVICE}", path=file) from None
    table = ShardTable(columns, naming, file=file, keep=mapped)
    table._sha256 = expected_sha256  # checked above (None: hashed when asked)
    table.drop_pages()  # hashed and checked: not kept in this process's memory
    return table


def check_totals(table: ShardTable, *, num_shards: int, num_samples: int, num_bytes: int, where: str) -> None:
    """Refuse a table whose totals disagree with the manifest's.

    Raises:
        ManifestError: Naming the table file, the disagreement and what to run.
    """
    for what, stated, actual in (
        ("num_shards", num_shards, table.num_shards),
        ("num_samples", num_samples, table.num_samples),
        ("num_bytes", num_bytes, table.total_bytes),
    ):
        if stated != actual:
            raise ManifestError(
                f"{table.file or where}: the shard table adds up to {what}={actual} but {where} says {stated}; "
                f"{TABLE_ADVICE}",
                path=table.file or where,
            )


class ShardView(Sequence[ShardEntry]):
    """``manifest.shards``: a read-only sequence of :class:`ShardEntry` over a
    table, each entry built when it is accessed."""

    __slots__ = ("table",)

    def __init__(self, table: ShardTable):
        self.table = table

    def __len__(self) -> int:
        return self.table.num_shards

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self.table.entry(j) for j in range(*i.indices(len(self))))
        return self.table.entry(i)

    def __iter__(self) -> Iterator[ShardEntry]:
        return (self.table.entry(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} shards>"
