"""``.npy`` headers read without evaluating them.

Offset indexes and token-field values are ``.npy`` bytes from wherever they
came from. :func:`parse_npy_header` reads the dtype, order and shape of
one with regular expressions over at most :data:`MAX_HEADER_BYTES` bytes,
not with ``np.load`` (which evaluates the header with :mod:`ast`: CPython
3.11's AST state is shared by threads, so reader threads loading headers at
the same time could corrupt it, and with it every DataLoader worker forked
afterwards) and never with pickle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

#: The ``.npy`` prelude: magic, version, header length.
NPY_MAGIC = b"\x93NUMPY"
#: Most header bytes read to find an array (NumPy pads headers to 64 bytes;
#: a header of a few dimensions is far below this).
MAX_HEADER_BYTES = 4096
#: Most dimensions a header may state.
_MAX_DIMS = 32

_DESCR = re.compile(rb"'descr':\s*'([^']{1,16})'")
_FORTRAN = re.compile(rb"'fortran_order':\s*(True|False)")
_SHAPE = re.compile(rb"'shape':\s*\(([\d\s,]*)\)")


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What a ``.npy`` header says.

    Attributes:
        descr: The dtype as the header spells it (``'<u8'``).
        shape: The array's shape.
        fortran_order: Whether its data is in Fortran order.
        offset: Where its data starts, from the start of the header's magic.
    """

    descr: bytes
    shape: tuple[int, ...]
    fortran_order: bool
    offset: int

    def dtype(self) -> np.dtype | None:
        """The dtype ``descr`` names, or None when it names none."""
        try:
            return np.dtype(self.descr.decode("ascii"))
        except (TypeError, ValueError, UnicodeDecodeError):
            return None

    @property
    def count(self) -> int:
        """Elements the shape holds (a 19-digit dimension counts as 2**62: more than any file)."""
        total = 1
        for dim in self.shape:
            total = min(total * dim, 1 << 62)
        return total


def parse_npy_header(data: bytes) -> NpyHeader:
    """Read the ``.npy`` header at the start of ``data`` (the first
    :data:`MAX_HEADER_BYTES` bytes of a file are enough).

    Raises:
        ValueError: Not a ``.npy`` header; the message says what is wrong
            (``"no .npy magic"``, ``"header cut short"``...).
    """
    if data[:6] != NPY_MAGIC or len(data) < 10:
        raise ValueError("no .npy magic")
    if data[6] == 1:
        length, start = int.from_bytes(data[8:10], "little"), 10
    elif data[6] in (2, 3):
        length, start = int.from_bytes(data[8:12], "little"), 12
    else:
        raise ValueError(f".npy version {data[6]} is unknown")
    header = data[start : start + length]
    if len(header) < length or start + length > MAX_HEADER_BYTES:
        raise ValueError("header cut short")
    descr, shape, fortran = _DESCR.search(header), _SHAPE.search(header), _FORTRAN.search(header)
    if descr is None or shape is None:
        raise ValueError("no plain dtype and shape")
    dims = [part.strip() for part in shape.group(1).split(b",")]
    if dims and not dims[-1]:
        dims.pop()  # the trailing comma of (n,)
    if len(dims) > _MAX_DIMS or not all(dim.isdigit() for dim in dims):
        raise ValueError("a shape that is not a tuple of whole numbers")
    sizes = tuple(int(dim) if len(dim) < 19 else 1 << 62 for dim in dims)
    return NpyHeader(descr.group(1), sizes, fortran is not None and fortran.group(1) == b"True", start + length)


__all__ = ["MAX_HEADER_BYTES", "NPY_MAGIC", "NpyHeader", "parse_npy_header"]
