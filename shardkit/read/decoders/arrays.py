"""Array fields: ``npy``, ``npz`` and webdataset's ``ten`` (tenbin) format.

None of them can run code from the data: ``npy`` / ``npz`` refuse object
arrays (``allow_pickle=False``), and tenbin holds only plain numeric dtypes.

None of them allocates more than the bytes at hand say: an ``npy`` header
(or a tenbin one) that claims a larger array than the bytes after it hold
is refused before the array is made, and an ``npz`` archive (a zip file,
its members deflated) is inflated only if its members' stated sizes add up
to at most ``max_bytes`` (the reader's ``max_member_bytes``), each member
read no further than its stated size.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from typing import Any

from shardkit.errors import MemberTooLargeError
from shardkit.format.compression import DEFAULT_MAX_MEMBER_BYTES

#: The tenbin chunk marker: the 8 ASCII bytes ``~TenBin~``.
TENBIN_MAGIC = b"~TenBin~"
#: tenbin's dtype codes (8-byte, NUL-padded ASCII) -> numpy dtype names.
TENBIN_DTYPES: dict[str, str] = {
    "f2": "float16", "f4": "float32", "f8": "float64",
    "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64",
}  # fmt: skip
_TENBIN_ALIGN = 64


#: The first bytes of an ``.npy`` file.
NPY_MAGIC = b"\x93NUMPY"


def _check_npy_size(stream: io.BytesIO, available: int) -> None:
    """Refuse an npy header whose array needs more bytes than follow it."""
    from numpy.lib import format as npy_format

    major, _ = npy_format.read_magic(stream)
    read_header = npy_format.read_array_header_1_0 if major == 1 else npy_format.read_array_header_2_0
    shape, _, dtype = read_header(stream)
    needed = dtype.itemsize
    for n in shape:
        needed *= int(n)
    left = available - stream.tell()
    if needed > left:
        raise ValueError(
            f"npy header gives an array of shape {tuple(shape)} and dtype {dtype} ({needed:,} bytes), "
            f"but only {left:,} bytes follow it"
        )


def decode_npy(data: bytes) -> Any:
    """One array from ``.npy`` bytes; object arrays (pickles) are refused.

    Raises:
        ValueError: The array holds Python objects, the bytes are not npy,
            or the header claims more bytes than follow it (checked before
            the array is allocated).
    """
    import numpy as np

    stream = io.BytesIO(data)
    if data.startswith(NPY_MAGIC):
        _check_npy_size(stream, len(data))
        stream.seek(0)
    return np.load(stream, allow_pickle=False)


def decode_npz(data: bytes, *, max_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES) -> dict[str, Any]:
    """All arrays of an ``.npz`` archive, read at once into a plain dict.

    Args:
        data: The archive.
        max_bytes: Most bytes its members may inflate to, all together
            (the reader's ``max_member_bytes``; None: no limit).

    Returns:
        ``{name: numpy array}`` in the archive's order (webdataset returns the
        same ``dict``; the archive is not kept open). A member that is not
        an ``.npy`` array is returned as its bytes, as ``numpy.load`` does.

    Raises:
        MemberTooLargeError: The members' sizes add up to more than
            ``max_bytes``; nothing is inflated.
        ValueError: An array holds Python objects, or the bytes are not npz.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ValueError(f"not an npz archive ({exc})") from None
    with archive:
        members = archive.infolist()
        total = sum(m.file_size for m in members)
        if max_bytes is not None and total > max_bytes:
            what = f"npz archive of {len(members)} arrays inflates to {total:,} bytes"
            raise MemberTooLargeError.over_limit(what, limit=max_bytes, option="max_member_bytes", amount=total)
        out = {}
        for member in members:
            try:
                raw = archive.read(member)  # never past its stated size
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError, zlib.error) as exc:
                raise ValueError(f"npz member {member.filename!r} cannot be read ({exc})") from None
            name = member.filename[: -len(".npy")] if member.filename.endswith(".npy") else member.filename
            out[name] = decode_npy(raw) if raw.startswith(NPY_MAGIC) else raw
        return out


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
