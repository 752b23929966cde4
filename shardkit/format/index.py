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

import numpy as np

from shardkit.errors import ManifestError

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
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        raise ManifestError(f"{path}: not a shardkit offset index ({exc})", path=path) from None
    return _checked(array, path)


def load_index(path: str) -> np.ndarray:
    """Memory-map a local index file.

    Raises:
        ManifestError: The file is missing or is not a valid index.
    """
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: offset index missing; rewrite the dataset or run `shardkit verify`", path=path
        ) from None
    except ValueError as exc:
        raise ManifestError(f"{path}: not a shardkit offset index ({exc})", path=path) from None
    return _checked(array, path)


def _checked(array: np.ndarray, path: str) -> np.ndarray:
    if array.dtype != INDEX_DTYPE or array.ndim != 1 or len(array) < 1 or array[0] != 0:
        raise ManifestError(
            f"{path}: not a shardkit offset index (want a 1-D uint64 array starting at 0)", path=path
        )
    return array
