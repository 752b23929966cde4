"""Per-shard sample offset index.

Each shard ``NAME.tar`` has a sidecar ``NAME.idx``: a NumPy ``.npy`` file
holding one little-endian ``uint64`` array of ``num_samples + 1`` sample
boundaries. Sample ``i`` occupies bytes ``[bounds[i], bounds[i + 1])`` of the
shard, headers and padding included; ``bounds[0]`` is 0 and
``bounds[num_samples]`` is where the end-of-archive marker starts. A reader
can thus start at any sample with one seek and read exactly its bytes.

Since format 1.1 a second ``.npy`` array follows the first in the same
file: one little-endian ``uint32`` CRC-32 per sample
(:func:`shardkit.format.tar.sample_checksum`: over the key, each member's
extension, length and bytes), so a reader that asks for it catches bit rot at
the sample it hit. ``np.load`` and older shardkit readers read the first
array and ignore what follows; an index without checksums is still valid.

Since format 1.2 (manifest format 3) a third array may follow the
checksums: per-sample token counts, ``(num_samples, k)`` little-endian
``uint32`` (``int64`` when a count does not fit), column ``j`` counting the
elements of the manifest's ``token_fields[j]`` in each sample (0 where the
sample lacks it). It is read only when asked for
(:func:`read_document_tokens`); the first two arrays are where they were,
so ``np.load`` and older readers read as before. (An older shardkit's
:func:`max_index_bytes` may find such a file too long: it refuses the
manifest of format 3 first.)

A local index is memory-mapped (one mapping, one descriptor) so DataLoader workers share the
page cache instead of each holding a copy; a random reader instead keeps the
file open and reads the two entries of each sample it reads
(:func:`read_index_file`). An index is checked once, when it
is loaded, in vectorised code (:func:`check_bounds`): boundaries start at 0,
rise by whole 512-byte blocks, and stay inside the shard.

Readers load indexes through one function, :func:`shardkit.io.index.fetch_offset_index`
(local or remote, a size cap from the sample count, these checks), and every
fault of an index is one error, :class:`~shardkit.errors.CorruptShardError`
naming the ``.idx`` file (:func:`corrupt_index`).
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardkit.errors import CorruptShardError
from shardkit.format.location import open_regular
from shardkit.format.npy import MAX_HEADER_BYTES as _MAX_HEADER_BYTES
from shardkit.format.npy import parse_npy_header

INDEX_SUFFIX = ".idx"
INDEX_DTYPE = np.dtype("<u8")
CHECKSUM_DTYPE = np.dtype("<u4")
#: Dtypes of the per-sample token counts (the third array): uint32 when
#: every count fits, else int64.
TOKEN_DTYPES = (np.dtype("<u4"), np.dtype("<i8"))
#: Most token fields an index counts (columns of the third array).
MAX_TOKEN_FIELDS = 4
_BLOCK = 512
_END_MARKER_BYTES = 2 * _BLOCK


@dataclass(frozen=True, slots=True)
class OffsetIndex:
    """A shard's offset index: sample boundaries and, when the index has
    them, per-sample checksums (``checksums[i]`` is sample ``i``'s)."""

    bounds: np.ndarray
    checksums: np.ndarray | None = None


#: What to do about a damaged offset index, at the end of every message about one.
INDEX_ADVICE = "Run `shardkit verify` on the dataset and rewrite the shards it names with `shardkit write`."


def corrupt_index(path: str, why: str, *, at: int | None = None) -> CorruptShardError:
    """The one error for a damaged offset index: names the file, what is
    wrong (and the first bad entry, ``at``) and what to do."""
    where = f" (entry {at})" if at is not None else ""
    return CorruptShardError(f"{path}: offset index is corrupt: {why}{where}. {INDEX_ADVICE}", path=path)


def max_index_bytes(num_samples: int, num_token_fields: int = MAX_TOKEN_FIELDS) -> int:
    """Most bytes a well-formed index of ``num_samples`` samples takes: three
    ``.npy`` headers, ``num_samples + 1`` boundaries, ``num_samples``
    checksums and ``num_samples`` rows of ``num_token_fields`` token counts
    (int64; by default as many fields as an index may count). A reader
    refuses a longer one before reading it whole."""
    return (
        3 * _MAX_HEADER_BYTES
        + INDEX_DTYPE.itemsize * (num_samples + 1)
        + CHECKSUM_DTYPE.itemsize * num_samples
        + TOKEN_DTYPES[-1].itemsize * num_samples * num_token_fields
    )


def index_path_for(shard_path: str) -> str:
    """The sidecar index path of a shard: ``a/b.tar`` -> ``a/b.idx``."""
    root, ext = os.path.splitext(shard_path)
    return (root if ext == ".tar" else shard_path) + INDEX_SUFFIX


def encode_index(
    bounds: "np.ndarray | list[int]",
    checksums: "np.ndarray | list[int] | None" = None,
    tokens: np.ndarray | None = None,
) -> bytes:
    """Serialize sample boundaries (and per-sample checksums, and after them
    per-sample token counts) as ``.npy`` bytes.

    Args:
        bounds: ``num_samples + 1`` sample boundaries.
        checksums: ``num_samples`` CRC-32s, or None.
        tokens: A ``(num_samples, k)`` array of token counts (k from 1 to
            :data:`MAX_TOKEN_FIELDS`), stored as uint32 when every count
            fits, else int64; None (or k = 0) stores none. Needs ``checksums``.

    Raises:
        ValueError: Arrays whose lengths disagree, or token counts without checksums.
    """
    out = io.BytesIO()
    np.save(out, np.asarray(bounds, dtype=INDEX_DTYPE), allow_pickle=False)
    if checksums is not None:
        if len(checksums) != len(bounds) - 1:
            raise ValueError(f"{len(checksums)} checksums for {len(bounds) - 1} samples")
        np.save(out, np.asarray(checksums, dtype=CHECKSUM_DTYPE), allow_pickle=False)
    if tokens is not None and tokens.shape[1:] != (0,):
        if checksums is None:
            raise ValueError("token counts are stored after checksums; give both")
        if tokens.ndim != 2 or len(tokens) != len(bounds) - 1 or not 1 <= tokens.shape[1] <= MAX_TOKEN_FIELDS:
            raise ValueError(f"token counts of shape {tokens.shape} for {len(bounds) - 1} samples")
        if (tokens < 0).any():
            raise ValueError("a negative token count")
        small = not tokens.size or int(tokens.max()) <= np.iinfo(TOKEN_DTYPES[0]).max
        np.save(out, np.ascontiguousarray(tokens, dtype=TOKEN_DTYPES[0 if small else -1]), allow_pickle=False)
    return out.getvalue()


def decode_index(data: bytes, *, path: str = "<index>") -> np.ndarray:
    """Parse ``.npy`` index bytes (e.g. fetched over HTTP) into boundaries."""
    return decode_offset_index(data, path=path).bounds


def load_index(path: str) -> np.ndarray:
    """Memory-map a local index file's boundaries.

    Raises:
        CorruptShardError: The file is missing or not a valid index.
        ManifestError: The path is not a regular file (a FIFO, a device...).
    """
    return load_offset_index(path).bounds


def decode_offset_index(data: bytes, *, path: str = "<index>") -> OffsetIndex:
    """Parse index bytes into boundaries and, when present, checksums.

    Only the file's form is checked here; :func:`check_offset_index` checks
    the boundaries against the shard.

    Raises:
        CorruptShardError: ``data`` is not a valid index (naming ``path``).
    """
    count, offset, end = _bounds_place(data, len(data), path, "data")
    bounds = _checked(np.frombuffer(data, dtype=INDEX_DTYPE, count=count, offset=offset), path)
    checksums = None
    if len(data) > end:
        n, at = _checksums_place(data[end : end + _MAX_HEADER_BYTES], len(data), end, count, path)
        checksums = np.frombuffer(data, dtype=CHECKSUM_DTYPE, count=n, offset=at)
    return OffsetIndex(bounds, checksums)


def load_offset_index(path: str, *, max_bytes: int | None = None) -> OffsetIndex:
    """Memory-map a local index file: boundaries and, when present, checksums.

    Args:
        path: The ``.idx`` file.
        max_bytes: Refuse a file longer than this (see :func:`max_index_bytes`).

    Raises:
        CorruptShardError: The file is missing, too long, or not a valid index.
        ManifestError: The path is not a regular file (a FIFO, a device...).
    """
    try:
        f, size = open_regular(path, what="offset index")
    except FileNotFoundError:
        raise corrupt_index(path, "the file is missing") from None
    with f:  # mapped through the file checked above, not by opening the path again
        if max_bytes is not None and size > max_bytes:
            raise too_long(path, max_bytes)
        count, offset, end = _bounds_place(f.read(_MAX_HEADER_BYTES), size, path, "file")
        # One mapping of the whole file (one descriptor, which the mapping
        # keeps), both arrays plain read-only views of it.
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        bounds = _checked(np.frombuffer(mapped, dtype=INDEX_DTYPE, count=count, offset=offset), path)
        checksums = None
        if size > end:
            n, at = _checksums_place(mapped[end : end + _MAX_HEADER_BYTES], size, end, count, path)
            checksums = np.frombuffer(mapped, dtype=CHECKSUM_DTYPE, count=n, offset=at) if n else None
    return OffsetIndex(bounds, checksums)


@dataclass(frozen=True, slots=True)
class IndexLayout:
    """Where an open index file keeps its arrays, for reading single entries
    with ``pread``: the boundaries start at byte ``bounds_at``, the
    checksums (None: the file has none) at ``checksums_at``."""

    bounds_at: int
    checksums_at: int | None


def read_index_file(fd: int, size: int, *, path: str, max_bytes: int | None = None) -> tuple[np.ndarray, IndexLayout]:
    """Read an open local index file's boundaries (a private copy, to check
    with :func:`check_bounds` and let go) and where its arrays lie; the same
    checks of the file's form as :func:`load_offset_index`.

    Args:
        fd: The index file, open for reading.
        size: Its size in bytes.
        path: The file, for messages.
        max_bytes: Refuse a file longer than this (see :func:`max_index_bytes`).

    Raises:
        CorruptShardError: The file is too long, or not a valid index.
    """
    if max_bytes is not None and size > max_bytes:
        raise too_long(path, max_bytes)
    _, offset, end = _bounds_place(os.pread(fd, _MAX_HEADER_BYTES, 0), size, path, "file")
    data = os.pread(fd, end - offset, offset)
    if len(data) != end - offset:  # the file shrank since it was opened
        raise corrupt_index(path, "file shorter than its header says (truncated?)")
    bounds = _checked(np.frombuffer(data, dtype=INDEX_DTYPE), path)
    checksums_at = None
    if size > end:
        n, at = _checksums_place(os.pread(fd, _MAX_HEADER_BYTES, end), size, end, len(bounds), path)
        checksums_at = at if n else None
    return bounds, IndexLayout(offset, checksums_at)


def _bounds_place(head: bytes, size: int, path: str, what: str) -> tuple[int, int, int]:
    """``(count, offset, end)`` of the boundary array of an index of
    ``size`` bytes beginning with ``head``; ``what`` (``"file"``,
    ``"data"``) names it when it is shorter than its header says."""
    count, offset = _read_npy_header(head, path, INDEX_DTYPE)
    end = offset + count * INDEX_DTYPE.itemsize
    if size < end:
        raise corrupt_index(path, f"{what} shorter than its header says (truncated?)")
    return count, offset, end


def _checksums_place(head: bytes, size: int, end: int, count: int, path: str) -> tuple[int, int]:
    """``(count, offset)`` of the checksum array whose header ``head``
    starts at ``end``, one checksum for each of the ``count - 1`` samples."""
    n, at = _read_npy_header(head, path, CHECKSUM_DTYPE)
    if n != count - 1 or size < end + at + n * CHECKSUM_DTYPE.itemsize:
        raise _bad_checksums(path, n, count - 1)
    return n, end + at


def read_document_tokens(
    read: Callable[[int, int], bytes],
    size: int,
    *,
    path: str,
    num_samples: int,
    totals: np.ndarray,
    removed: np.ndarray | None = None,
    check_totals: bool = True,
) -> np.ndarray:
    """The per-sample token counts an index file stores after its checksums,
    checked as data from anywhere: a ``(num_samples, k)`` array of uint32
    or int64 (``k = len(totals)``), ending the file, whose columns add up to
    ``totals`` (the shard table's).

    Args:
        read: Reads ``(offset, size)`` bytes of the file (fewer past its end).
        size: The file's size in bytes.
        path: The file, for messages.
        num_samples: The shard's sample count (the table's).
        totals: The shard's token count per field (the table's), in column order.
        removed: Positions of samples removed from the shard (see
            :mod:`shardkit.format.removed`): their rows are left out, and
            ``totals`` count the rows kept.
        check_totals: Whether the rows must add up to ``totals`` (False:
            only their number of columns is taken from it).

    Returns:
        An int64 array of shape ``(num_samples - len(removed), k)``, a private copy.

    Raises:
        CorruptShardError: The file holds no counts, or counts of another
            shape or dtype, negative ones, or ones that do not add up to
            ``totals``; naming the file.
    """
    k = len(totals)
    if size > max_index_bytes(num_samples, k):
        raise too_long(path, max_index_bytes(num_samples, k))
    count, _, end = _bounds_place(read(0, _MAX_HEADER_BYTES), size, path, "file")
    if count - 1 != num_samples:
        raise corrupt_index(path, f"it lists {count - 1} samples but the manifest says {num_samples}")
    n, at = _checksums_place(read(end, _MAX_HEADER_BYTES), size, end, count, path) if size > end else (0, end)
    start = at + n * CHECKSUM_DTYPE.itemsize
    if size <= start:
        raise corrupt_index(path, "it holds no token counts, though the manifest records them (an older index?)")
    try:
        header = parse_npy_header(read(start, _MAX_HEADER_BYTES))
    except ValueError as exc:
        raise corrupt_index(path, f"its token counts are not a .npy array ({exc})") from None
    dtype = header.dtype()
    if dtype not in TOKEN_DTYPES or header.fortran_order or header.shape != (num_samples, k):
        raise corrupt_index(
            path, f"its token counts are {header.descr.decode('ascii', 'replace')!r} of shape {header.shape}, "
            f"want '<u4' or '<i8' of shape {(num_samples, k)} in C order"
        )
    at, nbytes = start + header.offset, num_samples * k * dtype.itemsize
    if at + nbytes != size:
        raise corrupt_index(path, f"its token counts need bytes up to {at + nbytes}, the file has {size}")
    data = read(at, nbytes)
    if len(data) != nbytes:  # the file shrank since its size was taken
        raise corrupt_index(path, "file shorter than its header says (truncated?)")
    counts = np.frombuffer(data, dtype=dtype).reshape(num_samples, k).astype(np.int64)
    if (counts < 0).any():
        raise corrupt_index(path, "a negative token count", at=int(np.argmax((counts < 0).any(axis=1))))
    if removed is not None and len(removed):
        counts = np.delete(counts, removed, axis=0)
    # Counts of up to 2**63 - 1 each could add up past int64 and wrap to
    # the table's total; the first running sum to pass it turns negative.
    ends = np.cumsum(counts, axis=0)
    if (ends < 0).any():
        raise corrupt_index(path, "its token counts add up past 2**63", at=int(np.argmax((ends < 0).any(axis=1))))
    sums = ends[-1] if len(ends) else np.zeros(k, dtype=np.int64)
    wrong = np.flatnonzero(sums != np.asarray(totals, dtype=np.int64)) if check_totals else ()
    if len(wrong):
        j = int(wrong[0])
        raise corrupt_index(
            path, f"its token counts of column {j} add up to {int(sums[j])}, the shard table says {int(totals[j])}"
        )
    return counts


def too_long(path: str, max_bytes: int) -> CorruptShardError:
    """The error for an index file longer than any index of its shard's sample count."""
    return corrupt_index(path, f"it holds more than {max_bytes} bytes, more than an index of its shard's samples takes")


def check_bounds(
    bounds: np.ndarray, *, path: str, num_samples: int | None = None, shard_bytes: int | None = None
) -> np.ndarray:
    """Check an index's boundaries once, before any read trusts them.

    They must start at 0, rise strictly by whole tar blocks, and (with
    ``shard_bytes``) leave room for the end-of-archive marker inside the
    shard; with ``num_samples`` they must list that many samples. Returns
    ``bounds``.

    Raises:
        CorruptShardError: Naming the index file and the first bad entry.
    """
    if num_samples is not None and len(bounds) - 1 != num_samples:
        raise corrupt_index(path, f"it lists {len(bounds) - 1} samples but the manifest says {num_samples}")
    if len(bounds) > 1:
        # Compared as stored (uint64): no converted copy, no differences array.
        rising = bounds[1:] > bounds[:-1]
        if bounds[-1] >= 1 << 62 or not rising.all():
            raise corrupt_index(path, "boundaries do not rise", at=int(np.argmin(rising)) + 1)
        if int(np.bitwise_or.reduce(bounds)) & (_BLOCK - 1):  # no temporary array; the entry found on failure
            off_block = bounds & np.uint64(_BLOCK - 1)
            raise corrupt_index(path, "a boundary is not on a 512-byte tar block", at=int(np.argmax(off_block != 0)))
    if shard_bytes is not None and int(bounds[-1]) + _END_MARKER_BYTES > shard_bytes:
        raise corrupt_index(
            path, f"its last boundary, byte {int(bounds[-1])}, leaves no end marker in a shard of {shard_bytes} bytes"
        )
    return bounds


def _bad_checksums(path: str, found: int, want: int) -> CorruptShardError:
    return corrupt_index(path, f"its checksum array holds {found} entries for {want} samples")


def _read_npy_header(data: bytes, path: str, want: np.dtype) -> tuple[int, int]:
    """``(element count, data offset)`` of a 1-D ``.npy`` array of dtype
    ``want`` (read by :func:`~shardkit.format.npy.parse_npy_header`, which
    evaluates nothing)."""

    def bad(why: str) -> CorruptShardError:
        return corrupt_index(path, f"not a shardkit offset index ({why})")

    try:
        header = parse_npy_header(data)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if len(header.shape) != 1:
        raise bad("want a 1-D array")
    dtype = want if header.descr == want.str.encode() else header.dtype()  # as shardkit writes it: no dtype parsed
    if dtype != want:
        raise bad(f"dtype {header.descr.decode('ascii', 'replace')!r}, want {want.str!r}")
    if want == INDEX_DTYPE and header.count < 1:
        raise bad("empty; an index holds at least the start of the end marker")
    return header.count, header.offset


def _checked(array: np.ndarray, path: str) -> np.ndarray:
    if array.dtype != INDEX_DTYPE or array.ndim != 1 or len(array) < 1 or array[0] != 0:
        raise corrupt_index(path, "not a shardkit offset index (want a 1-D uint64 array starting at 0)")
    return array
