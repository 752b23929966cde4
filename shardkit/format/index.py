"""Per-shard sample offset index.

Each shard ``NAME.tar`` has a sidecar ``NAME.idx``: a NumPy ``.npy`` file
holding one little-endian ``uint64`` array of ``num_samples + 1`` sample
boundaries. Sample ``i`` occupies bytes ``[bounds[i], bounds[i + 1])`` of the
shard, headers and padding included; ``bounds[0]`` is 0 and
``bounds[num_samples]`` is where the end-of-archive marker starts. A reader
can thus start at any sample with one seek and read exactly its bytes.

The array is loaded with ``mmap_mode="r"`` so DataLoader workers share the
page cache instead of each holding a copy.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np

from shardkit.errors import ManifestError
from shardkit.format.location import open_regular

INDEX_SUFFIX = ".idx"
INDEX_DTYPE = np.dtype("<u8")


def index_path_for(shard_path: str) -> str:
    """The sidecar index path of a shard: ``a/b.tar`` -> ``a/b.idx``."""
    root, ext = os.path.splitext(shard_path)
    return (root if ext == ".tar" else shard_path) + INDEX_SUFFIX


def encode_index(bounds: "np.ndarray | list[int]") -> bytes:
    """Serialize sample boundaries as ``.npy`` bytes."""
    array = np.asarray(bounds, dtype=INDEX_DTYPE)
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def decode_index(data: bytes, *, path: str = "<index>") -> np.ndarray:
    """Parse ``.npy`` index bytes (e.g. fetched over HTTP) into an array."""
    count, offset = _read_npy_header(data, path)
    if len(data) < offset + count * INDEX_DTYPE.itemsize:
        raise ManifestError(f"{path}: not a shardkit offset index (data shorter than its header says)", path=path)
    return _checked(np.frombuffer(data, dtype=INDEX_DTYPE, count=count, offset=offset), path)


def load_index(path: str) -> np.ndarray:
    """Memory-map a local index file.

    Raises:
        ManifestError: The file is missing, not a regular file (a FIFO, a
            device...), or not a valid index.
    """
    try:
        f, size = open_regular(path, what="offset index")
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: offset index missing; rewrite the dataset or run `shardkit verify`", path=path
        ) from None
    with f:  # mapped through the file checked above, not by opening the path again
        count, offset = _read_npy_header(f.read(_MAX_HEADER_BYTES), path)
        if size < offset + count * INDEX_DTYPE.itemsize:
            raise ManifestError(f"{path}: not a shardkit offset index (file shorter than its header says)", path=path)
        return _checked(np.memmap(f, dtype=INDEX_DTYPE, mode="r", offset=offset, shape=(count,)), path)


#: The ``.npy`` prelude: magic, version, header length.
_NPY_MAGIC = b"\x93NUMPY"
#: Most header bytes read to find the array (NumPy pads headers to 64 bytes;
#: a 1-D array's header is far below this).
_MAX_HEADER_BYTES = 4096
_DESCR = re.compile(rb"'descr':\s*'([^']*)'")
_SHAPE = re.compile(rb"'shape':\s*\(\s*(\d+)\s*,?\s*\)")


def _read_npy_header(data: bytes, path: str) -> tuple[int, int]:
    """``(element count, data offset)`` of a 1-D little-endian uint64 ``.npy``.

    Parsed here rather than by ``np.load``, which evaluates the header with
    :mod:`ast`: CPython 3.11's AST state is shared by threads, so reader
    threads loading indexes at the same time could corrupt it (and with it
    every DataLoader worker forked afterwards).
    """

    def bad(why: str) -> ManifestError:
        return ManifestError(f"{path}: not a shardkit offset index ({why})", path=path)

    if data[:6] != _NPY_MAGIC or len(data) < 10:
        raise bad("no .npy magic")
    if data[6] == 1:
        length, start = int.from_bytes(data[8:10], "little"), 10
    elif data[6] in (2, 3):
        length, start = int.from_bytes(data[8:12], "little"), 12
    else:
        raise bad(f".npy version {data[6]} is unknown")
    header = data[start : start + length]
    if len(header) < length:
        raise bad("header cut short")
    descr, shape = _DESCR.search(header), _SHAPE.search(header)
    if descr is None or shape is None:
        raise bad("want a 1-D array")
    try:
        dtype = np.dtype(descr.group(1).decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError):
        dtype = None
    if dtype != INDEX_DTYPE:
        raise bad(f"dtype {descr.group(1).decode('ascii', 'replace')!r}, want '<u8'")
    if int(shape.group(1)) < 1:
        raise bad("empty; an index holds at least the start of the end marker")
    return int(shape.group(1)), start + length


def _checked(array: np.ndarray, path: str) -> np.ndarray:
    if array.dtype != INDEX_DTYPE or array.ndim != 1 or len(array) < 1 or array[0] != 0:
        raise ManifestError(
            f"{path}: not a shardkit offset index (want a 1-D uint64 array starting at 0)", path=path
        )
    return array
