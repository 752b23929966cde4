"""A partition's scanned samples on disk: fixed-size records plus a string blob.

Scanning a partition writes, in its spill folder:

``p-NNNNNN.rec.npy``
    One record per sample (:data:`RECORD`), sorted by the seeded hash of the
    key: the shuffle's order inside the partition, and what makes a bucket
    (a range of hashes) a contiguous slice of every partition.
``p-NNNNNN.src.npy``
    For each sample in source order, its position among the records (the
    ``--no-shuffle`` order).
``p-NNNNNN.str``
    Keys and names (UTF-8), which records point into, in the records' order
    (so the records of a bucket and their strings are each one contiguous
    range). A JSONL row whose values are all inline has them as its name
    (see :func:`~shardkit.write.sources.jsonl.pack_inline`): the shard writer takes
    them from here instead of parsing the line again.
``p-NNNNNN.json``
    The partition's summary, written last: its presence marks the spill
    complete (``--resume`` reuses it while the input is unchanged). It holds
    each file's size and CRC-32 (``files``): a reused spill is checked against
    them (:func:`spill_intact`), so a spill whose files did not all reach the
    disk before a power loss is scanned again, and the files need no fsync.

Nothing holds a Python object per sample: columns are ``array`` buffers while
scanning and memory-mapped numpy arrays when read.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import json
import mmap
import os
import zlib
from array import array
from itertools import accumulate
from typing import BinaryIO

import numpy as np

from shardkit.errors import DestinationError
from shardkit.io.atomic import atomic_write_bytes

#: A sample's record. ``hash``: seeded hash of the key (the shuffle order);
#: ``key_off``/``key_len`` and then ``name_len`` bytes: the key and the name
#: (relative file paths, ``\\0``-separated) in the blob; ``offset``/``length``:
#: the sample's bytes in the partition's file (a JSONL line, a tar sample);
#: ``size``: its tar size in a shard; ``digest``: a hash of what it holds, for
#: the shard fingerprints of ``--resume``.
RECORD = np.dtype(
    [
        ("hash", "<u8"),
        ("key_off", "<u8"),
        ("key_len", "<u4"),
        ("name_len", "<u4"),
        ("offset", "<u8"),
        ("length", "<u8"),
        ("size", "<u8"),
        ("digest", "<u8"),
    ]
)


def spill_error(exc: OSError, folder: str, input_path: str) -> DestinationError:
    """The one-line error for a spill that could not be written while scanning ``input_path``."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT) or "written" in str(exc)  # numpy's short write has no errno
    return DestinationError(
        f"{folder}: cannot write the scan's spill while scanning {input_path} "
        f"({'no space left' if full else exc.strerror or exc}); the spill takes about 64 bytes per sample plus "
        "its key (and a JSONL row's inline values): free space where DEST is (or choose another DEST), then rerun",
        path=folder,
    )


def spill_prefix(folder: str, index: int) -> str:
    """Path prefix of partition ``index``'s spill files in ``folder``."""
    return os.path.join(folder, f"p-{index:06d}")


def key_hash_seed(seed: int) -> bytes:
    """The blake2b key that seeds the hashes of sample keys."""
    return b"shardkit-shuffle:" + str(seed).encode("ascii")


def short_digest(data: bytes) -> bytes:
    """8 bytes identifying ``data`` (for fingerprints, not security)."""
    return hashlib.blake2b(data, digest_size=8).digest()


class SpillWriter:
    """Collect one partition's records, then write them sorted by key hash."""

    def __init__(self, prefix: str, seed: int):
        self.prefix = prefix
        # Keyed once, copied per key (keying costs as much as hashing a short key).
        self._key_hasher = hashlib.blake2b(digest_size=8, key=key_hash_seed(seed))
        self._hashes = bytearray()
        self._digests = bytearray()
        self._blob = bytearray()
        self._key_off = array("Q")
        self._key_len = array("I")
        self._name_len = array("I")
        self._offset = array("Q")
        self._length = array("Q")
        self._size = array("Q")

    def __len__(self) -> int:
        return len(self._size)

    def _drop_columns(self) -> None:
        self._hashes, self._digests = bytearray(), bytearray()
        for name in ("key_off", "key_len", "name_len", "offset", "length", "size"):
            setattr(self, "_" + name, array(getattr(self, "_" + name).typecode))

    def add(self, key: bytes, name: bytes, offset: int, length: int, size: int, digest: bytes) -> None:
        """Append one sample (in source order)."""
        hasher = self._key_hasher.copy()
        hasher.update(key)
        self._hashes += hasher.digest()
        self._digests += digest
        self._key_off.append(len(self._blob))
        self._key_len.append(len(key))
        self._name_len.append(len(name))
        self._blob += key
        self._blob += name
        self._offset.append(offset)
        self._length.append(length)
        self._size.append(size)

    def finish(self, summary: dict) -> None:
        """Write the spill files, the summary last (each atomically).

        Raises:
            OSError: The folder is full or not writable (the caller names it).
        """
        hashes = np.frombuffer(self._hashes, dtype="<u8")
        order = np.argsort(hashes, kind="stable")
        records = np.empty(len(self), dtype=RECORD)  # filled column by column, already in hash order
        records["hash"] = hashes[order]
        records["digest"] = np.frombuffer(self._digests, dtype="<u8")[order]
        for name in ("key_off", "key_len", "name_len", "offset", "length", "size"):
            records[name] = np.frombuffer(getattr(self, "_" + name), dtype=RECORD[name].newbyteorder("="))[order]
        # The strings in hash order too: records[i]'s follow records[i - 1]'s.
        starts = records["key_off"].copy()
        ends = starts + records["key_len"] + records["name_len"]
        records["key_off"][0:1] = 0
        np.cumsum((ends - starts)[:-1], out=records["key_off"][1:])
        by_source = np.empty_like(order)
        by_source[order] = np.arange(len(order))
        del hashes, order
        self._drop_columns()  # the records hold them now: free them before the strings are sorted
        files = {
            ".rec.npy": _save(self.prefix + ".rec.npy", records),
            ".src.npy": _save(self.prefix + ".src.npy", by_source.astype("<i8")),
        }
        del records, by_source
        files[".str"] = _save_strings(self.prefix + ".str", self._blob, starts, ends)
        self._blob = bytearray()
        summary = {**summary, "files": files}
        # Not fsynced: a summary torn by a power cut does not parse (the
        # partition is scanned again), and a whole one vouches for the other
        # files by their CRCs (see spill_intact).
        data = json.dumps(summary, sort_keys=True).encode()
        atomic_write_bytes(self.prefix + ".json", data, sync_dir=False, sync=False)


class _Summed:
    """A file being written that keeps its size and CRC-32 (``[size, crc]``)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.sum = [0, 0]

    def write(self, data: bytes) -> int:
        self.sum[0] += len(data)
        self.sum[1] = zlib.crc32(data, self.sum[1])
        return self._f.write(data)


def _save_strings(path: str, blob: bytearray, starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Write ``blob[starts[i]:ends[i]]`` for each ``i`` in turn, atomically; its ``[size, crc]``."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        out = _Summed(f)
        for lo in range(0, len(starts), _STRINGS_PER_WRITE):
            pieces = zip(starts[lo : lo + _STRINGS_PER_WRITE].tolist(), ends[lo : lo + _STRINGS_PER_WRITE].tolist())
            out.write(b"".join([blob[a:b] for a, b in pieces]))
    os.replace(tmp, path)
    return out.sum


_STRINGS_PER_WRITE = 1 << 13


def _save(path: str, array_: np.ndarray) -> list[int]:
    """``np.save`` of ``array_`` at ``path``, atomically; the file's ``[size, crc]``."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        out = _Summed(f)
        np.save(out, array_, allow_pickle=False)  # type: ignore[arg-type]
    os.replace(tmp, path)
    return out.sum


#: A record as a tuple with named fields (what :meth:`SpillReader.fetch` gives).
Record = collections.namedtuple("Record", RECORD.names)


class SpillReader:
    """One partition's spill, memory-mapped."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.records = _load(prefix + ".rec.npy")
        self._by_source: np.ndarray | None = None
        self._blob: mmap.mmap | bytes | None = None

    @property
    def by_source(self) -> np.ndarray:
        if self._by_source is None:
            self._by_source = _load(self.prefix + ".src.npy")
        return self._by_source

    @property
    def blob(self) -> mmap.mmap | bytes:
        """Keys and names; slicing gives ``bytes``."""
        if self._blob is None:
            with open(self.prefix + ".str", "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        return self._blob

    def read_rows(self, lo: int, hi: int) -> np.ndarray:
        """Records ``[lo, hi)`` read into memory of their own: the driver reads
        slices this way, so the spill's pages do not stay in its resident set."""
        with open(self.prefix + ".rec.npy", "rb") as f:
            f.seek(_records_start(f) + lo * RECORD.itemsize)
            return np.fromfile(f, dtype=RECORD, count=hi - lo)

    def read_by_source(self) -> np.ndarray:
        """The source order (see :attr:`by_source`), read into memory of its own."""
        return np.load(self.prefix + ".src.npy", allow_pickle=False)

    def key(self, row: int) -> bytes:
        rec = self.records[row]
        start = int(rec["key_off"])
        return self.blob[start : start + int(rec["key_len"])]

    def name(self, row: int) -> bytes:
        rec = self.records[row]
        start = int(rec["key_off"]) + int(rec["key_len"])
        return self.blob[start : start + int(rec["name_len"])]


def _records_start(f: BinaryIO) -> int:
    """Where the records begin in an open ``.rec.npy`` file (after its header).

    A header as this numpy writes it is recognised by its text; any other is
    parsed by numpy (which takes ~80 us: a shard writer opens the spill of
    every partition its samples come from).
    """
    f.seek(0)
    lead = f.read(10)
    if lead[:8] == b"\x93NUMPY\x01\x00":
        size = int.from_bytes(lead[8:10], "little")
        if f.read(size).startswith(_RECORDS_HEADER):
            return 10 + size
    f.seek(0)
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    _, _, dtype = read_header(f)
    assert dtype == RECORD, f"{getattr(f, 'name', '?')}: not a spill of this shardkit"
    return f.tell()


#: How a ``.rec.npy`` header (format 1.0) of this numpy begins: the records' type, C order, one dimension.
_RECORDS_HEADER = f"{{'descr': {np.lib.format.dtype_to_descr(RECORD)!r}, 'fortran_order': False, 'shape': (".encode("latin1")


class SpillFetcher:
    """Random reads of one partition's records, keys and names by ``pread``
    (what a shard writer needs: its samples are spread over every partition,
    and memory-mapped reads would leave those pages in its resident set).
    Close it when done."""

    def __init__(self, prefix: str):
        with open(prefix + ".rec.npy", "rb") as f:
            self._start = _records_start(f)
        self._path = prefix + ".rec.npy"
        self._records = os.open(prefix + ".rec.npy", os.O_RDONLY)
        self._strings = os.open(prefix + ".str", os.O_RDONLY)

    def fetch(self, rows: np.ndarray) -> tuple[np.ndarray, list[bytes], list[bytes]]:
        """The records of ``rows``, with their keys and names, in that order.

        A run of consecutive rows (a bucket's rows of one partition, in a
        shuffled write) is read with one ``pread`` for the records and one
        for their strings; other rows one by one.
        """
        size = RECORD.itemsize
        if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool(np.all(np.diff(rows) == 1)):
            data = os.pread(self._records, size * len(rows), self._start + int(rows[0]) * size)
        else:
            data = b"".join(os.pread(self._records, size, self._start + row * size) for row in rows.tolist())
        if len(data) != size * len(rows):
            raise OSError(f"{self._path}: the spill is shorter than its plan says")
        records = np.frombuffer(data, dtype=RECORD)
        key_off, key_len, name_len = (records[name].tolist() for name in ("key_off", "key_len", "name_len"))
        ends = records["key_off"] + records["key_len"] + records["name_len"]
        if len(records) and bool(np.all(records["key_off"][1:] == ends[:-1])):
            base = key_off[0]
            strings = os.pread(self._strings, int(ends[-1]) - base, base)
            starts = [off - base for off in key_off]
        else:
            strings = b"".join(os.pread(self._strings, k + n, off) for off, k, n in zip(key_off, key_len, name_len))
            starts = list(accumulate((k + n for k, n in zip(key_len, name_len)), initial=0))
        return (records, *cut_strings(strings, starts, key_len, name_len))

    def close(self) -> None:
        os.close(self._records)
        os.close(self._strings)


def cut_strings(strings: bytes, starts: list[int], key_len: list[int], name_len: list[int]) -> tuple[list[bytes], list[bytes]]:
    """The keys and names held in ``strings``: each record's key at its
    start, its name right after it."""
    middles = [a + k for a, k in zip(starts, key_len)]
    return [strings[a:m] for a, m in zip(starts, middles)], [strings[m : m + n] for m, n in zip(middles, name_len)]


def _load(path: str) -> np.ndarray:
    array_ = np.load(path, mmap_mode="r", allow_pickle=False)
    return array_ if len(array_) else np.load(path, allow_pickle=False)


def spill_intact(prefix: str, summary: dict) -> bool:
    """Whether the spill files at ``prefix`` are those ``summary`` describes
    (size and CRC-32 of each; a summary without them vouches for nothing)."""
    files = summary.get("files")
    if not isinstance(files, dict) or set(files) != set(_SPILL_SUFFIXES):
        return False
    return all(file_sum(prefix + suffix) == expected for suffix, expected in files.items())


def file_sum(path: str) -> list[int] | None:
    """``[size, crc32]`` of the file at ``path`` (what a summary records of
    the files it vouches for), or None when it cannot be read."""
    crc, size = 0, 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    except OSError:
        return None
    return [size, crc]


_SPILL_SUFFIXES = (".rec.npy", ".src.npy", ".str")


def load_summary(prefix: str) -> dict | None:
    """A complete partition spill's summary, or None when there is none (or a torn one)."""
    try:
        with open(prefix + ".json", "rb") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None
