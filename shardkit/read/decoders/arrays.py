"""Array fields: ``npy``, ``npz`` and webdataset's ``ten`` (tenbin) format.

None of them can run code from the data: ``npy`` / ``npz`` refuse object
arrays (``allow_pickle=False``), and tenbin holds only plain numeric dtypes.
"""

from __future__ import annotations

import io
import struct
from typing import Any

#: The tenbin chunk marker: the 8 ASCII bytes ``~TenBin~``.
TENBIN_MAGIC = b"~TenBin~"
#: tenbin's dtype codes (8-byte, NUL-padded ASCII) -> numpy dtype names.
TENBIN_DTYPES: dict[str, str] = {
    "f2": "float16", "f4": "float32", "f8": "float64",
    "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64",
}  # fmt: skip
_TENBIN_ALIGN = 64


def decode_npy(data: bytes) -> Any:
    """One array from ``.npy`` bytes; object arrays (pickles) are refused.

    Raises:
        ValueError: The array holds Python objects, or the bytes are not npy.
    """
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_npz(data: bytes) -> dict[str, Any]:
    """All arrays of an ``.npz`` archive, read at once into a plain dict.

    Returns:
        ``{name: numpy array}`` in the archive's order (webdataset returns the
        same ``dict``; the archive is not kept open).

    Raises:
        ValueError: An array holds Python objects, or the bytes are not npz.
    """
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _tenbin_chunks(data: bytes) -> list[memoryview]:
    """Split tenbin bytes into chunks: magic, int64 length, payload padded to 64."""
    view = memoryview(data)
    chunks = []
    offset = 0
    while offset < len(view):
        if view[offset : offset + 8] != TENBIN_MAGIC:
            raise ValueError(f"not tenbin data: no '~TenBin~' marker at byte {offset}")
        if offset + 16 > len(view):
            raise ValueError(f"tenbin data truncated at byte {offset}: a chunk header needs 16 bytes")
        (size,) = struct.unpack_from("<q", view, offset + 8)
        start = offset + 16
        if size < 0 or start + size > len(view):
            raise ValueError(f"tenbin chunk at byte {offset} claims {size} bytes; only {len(view) - start} follow")
        chunks.append(view[start : start + size])
        offset = start + -(-size // _TENBIN_ALIGN) * _TENBIN_ALIGN
    return chunks


def _tenbin_text(value: int) -> str:
    return struct.pack("<q", value).rstrip(b"\0").decode("ascii")


def decode_tenbin(data: bytes) -> list[Any]:
    """The arrays of a tenbin buffer (webdataset's ``.ten``), in order.

    The format is a run of chunks, two per array: a header (int64 values:
    dtype code, an 8-character info string, the number of dimensions, then
    each dimension) and the raw little-endian data.

    Returns:
        A list of writable numpy arrays (webdataset returns read-only views of
        the field's bytes; these are copies, so they can go to
        ``torch.from_numpy`` without a warning). Info strings are dropped.

    Raises:
        ValueError: The bytes are not a well-formed tenbin buffer.
    """
    import numpy as np

    chunks = _tenbin_chunks(data)
    if len(chunks) % 2:
        raise ValueError(f"tenbin data has {len(chunks)} chunks; arrays come as header + data pairs")
    arrays = []
    for header, payload in zip(chunks[::2], chunks[1::2]):
        fields = np.frombuffer(header, dtype="<i8")
        if len(fields) < 3 or len(fields) < 3 + int(fields[2]):
            raise ValueError(f"tenbin array header too short: {len(header)} bytes")
        code = _tenbin_text(int(fields[0]))
        if code not in TENBIN_DTYPES:
            raise ValueError(f"tenbin dtype code {code!r} is not one of {sorted(TENBIN_DTYPES)}")
        shape = tuple(int(n) for n in fields[3 : 3 + int(fields[2])])
        dtype = np.dtype(TENBIN_DTYPES[code]).newbyteorder("<")
        count = int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize > len(payload):
            raise ValueError(f"tenbin array of shape {shape} and dtype {dtype} needs {count * dtype.itemsize} bytes, has {len(payload)}")
        array = np.frombuffer(payload, dtype=dtype, count=count).reshape(shape)
        arrays.append(array.astype(array.dtype.newbyteorder("="), copy=True))
    return arrays
