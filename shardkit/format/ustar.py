"""Reproducible ustar encoding of members and samples: header blocks, padding, sizes, checksums.

Encoding writes plain ustar headers with fixed metadata (mtime 0, uid/gid 0,
empty owner names, mode 0644) so the same input gives the same bytes. A pax
extended header is emitted only for a member that needs one: a name that is
not ASCII or does not fit the ustar name/prefix fields, or a size of 8 GiB or
more. :mod:`shardkit.format.tar` parses what this writes (and any other tar).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

import numpy as np

BLOCK_SIZE = 512
END_OF_ARCHIVE = bytes(2 * BLOCK_SIZE)
ZERO_BLOCK = bytes(BLOCK_SIZE)

#: Fixed member metadata, so shards are byte-reproducible.
MEMBER_MTIME = 0
MEMBER_MODE = 0o644
PAX_HEADER_NAME = b"././@PaxHeader"

_USTAR_MAGIC = b"ustar\x0000"
_MAX_OCTAL_SIZE = 8**11 - 1  # what an 11-digit octal size field can hold


def byte_sum(block: bytes) -> int:
    """The sum of a block's bytes, as tar header checksums count them.

    Headers are mostly zero bytes. With fewer than 257 non-zero bytes the sum
    stays below Adler-32's modulus, so the low half of ``zlib.adler32`` (one
    plus the byte sum, modulo 65521) is the exact sum, computed in C; other
    blocks are summed in Python.
    """
    if len(block) - block.count(0) < 257:
        return (zlib.adler32(block) & 0xFFFF) - 1
    return sum(block)


def padding(size: int) -> int:
    """Bytes of zero padding that follow ``size`` bytes of member data."""
    return -size % BLOCK_SIZE


def _octal_field(value: int, width: int) -> bytes:
    digits = format(value, "o").rjust(width - 1, "0")
    if len(digits) > width - 1:
        raise ValueError(f"{value} does not fit a {width}-byte octal field")
    return digits.encode("ascii") + b"\x00"


def _header_template() -> bytes:
    """A header block with the fields every member shares (mode, owner,
    mtime, magic, device numbers) filled in and the checksum field blank."""
    header = bytearray(BLOCK_SIZE)
    header[100:108] = _octal_field(MEMBER_MODE, 8)
    header[108:116] = _octal_field(0, 8)
    header[116:124] = _octal_field(0, 8)
    header[136:148] = _octal_field(MEMBER_MTIME, 12)
    header[148:156] = b" " * 8
    header[257:265] = _USTAR_MAGIC
    header[329:337] = _octal_field(0, 8)
    header[337:345] = _octal_field(0, 8)
    return bytes(header)


_HEADER_TEMPLATE = _header_template()

# A regular file's header with a short ASCII name and an octal size, as pieces:
# name (100 bytes) + _MODE_OWNER + size (12) + _MTIME + checksum (8) + _REST.
_MODE_OWNER = _HEADER_TEMPLATE[100:124]
_MTIME = _HEADER_TEMPLATE[136:148]
_REST = b"0" + _HEADER_TEMPLATE[157:]  # typeflag "0", then linkname, magic, ..., an empty prefix
#: The byte sum of such a header without its name and size bytes (the
#: checksum field counted as spaces, as tar sums it).
_FIXED_SUM = byte_sum(_HEADER_TEMPLATE) + ord("0")


def _short_header(name: bytes, size: int) -> bytes:
    """:func:`_ustar_header` for an ASCII ``name`` of at most 100 bytes, an
    octal-sized regular file and no prefix, built from the fixed pieces: only
    the name, size and checksum are formatted. The name and size fields sum to
    less than Adler-32's modulus, so the low half of ``zlib.adler32`` (one plus
    the byte sum) gives their sum."""
    size_field = b"%011o\x00" % size
    checksum = _FIXED_SUM + (zlib.adler32(size_field, zlib.adler32(name)) & 0xFFFF) - 1
    return b"".join((name.ljust(100, b"\x00"), _MODE_OWNER, size_field, _MTIME, b"%06o\x00 " % checksum, _REST))


def _ustar_header(name: bytes, prefix: bytes, size: int, typeflag: bytes) -> bytes:
    header = bytearray(_HEADER_TEMPLATE)
    header[0 : len(name)] = name
    header[124:136] = _octal_field(size, 12)
    header[156:157] = typeflag
    header[345 : 345 + len(prefix)] = prefix
    header[148:156] = format(byte_sum(header), "06o").encode("ascii") + b"\x00 "
    return bytes(header)


def _split_ustar_name(raw: bytes) -> tuple[bytes, bytes] | None:
    """Fit a name in ustar's 155-byte prefix + 100-byte name fields, or None."""
    if len(raw) <= 100:
        return raw, b""
    # The split must fall on a slash: prefix "/" name.
    for cut in range(min(len(raw) - 1, 155), 0, -1):
        if raw[cut : cut + 1] == b"/" and len(raw) - cut - 1 <= 100:
            return raw[cut + 1 :], raw[:cut]
    return None


def _pax_record(keyword: str, value: str) -> bytes:
    body = f" {keyword}={value}\n".encode("utf-8")
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode("ascii") + body


def encode_header(name: str, size: int) -> bytes:
    """Return the header block(s) for a regular-file member.

    One 512-byte ustar block in the common case; a pax extended header first
    when the name is not ASCII or too long for ustar, or the size too big.
    """
    if size <= _MAX_OCTAL_SIZE and len(name) <= 100 and name.isascii():
        return _short_header(name.encode("ascii"), size)  # the common case
    records = []
    raw = name.encode("utf-8")
    fitted = _split_ustar_name(raw) if raw.isascii() else None
    if fitted is None:
        records.append(_pax_record("path", name))
        # Fallback name for readers that ignore pax: ASCII, within 100 bytes.
        fitted = (name.encode("ascii", "replace")[-100:], b"")
    ustar_size = size
    if size > _MAX_OCTAL_SIZE:
        records.append(_pax_record("size", str(size)))
        ustar_size = 0
    header = _ustar_header(fitted[0], fitted[1], ustar_size, b"0")
    if not records:
        return header
    pax_data = b"".join(records)
    pax_header = _ustar_header(PAX_HEADER_NAME, b"", len(pax_data), b"x")
    return pax_header + pax_data + bytes(padding(len(pax_data))) + header


def encode_raw_header(name: bytes, size: int) -> bytes:
    """:func:`encode_header` for a name given encoded (UTF-8, with any
    undecodable bytes as ``surrogateescape`` left them)."""
    if size <= _MAX_OCTAL_SIZE and len(name) <= 100 and name.isascii():
        return _short_header(name, size)
    return encode_header(name.decode("utf-8", "surrogateescape"), size)


def encoded_member_size(name: str, size: int) -> int:
    """Bytes a member takes in a shard: header(s), data and padding."""
    return encoded_header_size(name, size) + size + padding(size)


def encoded_header_size(name: str, size: int) -> int:
    """``len(encode_header(name, size))`` by arithmetic, building no header (planning calls it per member)."""
    oversized = size > _MAX_OCTAL_SIZE
    if len(name) <= 100 and name.isascii() and not oversized:
        return BLOCK_SIZE  # the common case, decided without encoding the name
    raw = name.encode("utf-8")
    pax_bytes = _pax_record_size("path", len(raw)) if not raw.isascii() or _split_ustar_name(raw) is None else 0
    pax_bytes += _pax_record_size("size", len(str(size))) if oversized else 0
    return BLOCK_SIZE + (BLOCK_SIZE + pax_bytes + padding(pax_bytes) if pax_bytes else 0)


def _pax_record_size(keyword: str, value_bytes: int) -> int:
    """Length of ``"LEN keyword=value\n"``: LEN counts its own digits."""
    body = len(keyword) + value_bytes + 3  # the space, "=" and the newline
    digits = 1
    while len(str(body + digits)) != digits:
        digits += 1
    return body + digits


def encoded_sample_size(key: str, fields: Iterable[tuple[str, int]]) -> int:
    """Bytes a sample takes in a shard, given ``(extension, data size)`` pairs."""
    return sum(encoded_member_size(f"{key}.{ext}", size) for ext, size in fields)


def encode_sample(key: str, fields: Sequence[tuple[str, bytes]]) -> bytes:
    """Encode one sample (fields in the given order) as tar bytes."""
    parts = []
    for ext, data in fields:
        parts.append(encode_header(f"{key}.{ext}", len(data)))
        parts.append(data)
        parts.append(bytes(padding(len(data))))
    return b"".join(parts)


def sample_checksum(key: str, fields: Iterable[tuple[str, bytes]]) -> int:
    """A sample's CRC-32: over its key, then each field's extension, length
    and bytes in member order (what the offset index stores per sample)."""
    crc = zlib.crc32(key.encode("utf-8", "surrogateescape") + b"\x00")
    for ext, data in fields:
        crc = zlib.crc32(ext.encode("utf-8", "surrogateescape") + b"\x00" + len(data).to_bytes(8, "little"), crc)
        crc = zlib.crc32(data, crc)
    return crc


def append_sample(out: bytearray, key: str, fields: Iterable[tuple[str, bytes]]) -> int:
    """Append one sample's tar bytes (:func:`encode_sample`) to ``out`` and
    return its :func:`sample_checksum`: the shard writer's one pass per sample."""
    crc = zlib.crc32(key.encode("utf-8", "surrogateescape") + b"\x00")
    for ext, data in fields:
        size = len(data)
        out += encode_header(f"{key}.{ext}", size)
        out += data
        out += ZERO_BLOCK[: -size % BLOCK_SIZE]
        crc = zlib.crc32(data, zlib.crc32(ext.encode("utf-8", "surrogateescape") + b"\x00" + size.to_bytes(8, "little"), crc))
    return crc


def append_joined_sample(out: bytearray, key: str, heads: Sequence[bytes], data: bytes) -> int:
    """:func:`append_sample` for members given joined: ``heads`` alternates
    each member's extension (UTF-8) and its size (decimal digits), and
    ``data`` is their bytes one after another. Same bytes, same checksum,
    without a list of ``(extension, bytes)`` pairs in between (the writer's
    path for tiny samples, whose values the scan carried packed)."""
    raw_key = key.encode("utf-8", "surrogateescape")
    crc = zlib.crc32(raw_key + b"\x00")
    prefix = raw_key + b"."
    pos = 0
    for i in range(0, len(heads), 2):
        ext, size = heads[i], int(heads[i + 1])
        name = prefix + ext
        out += encode_raw_header(name, size)
        member = data[pos : pos + size]
        if len(member) != size:
            raise ValueError(f"member {name!r} claims {size} bytes; {len(member)} are left")
        out += member
        out += ZERO_BLOCK[: -size % BLOCK_SIZE]
        crc = zlib.crc32(member, zlib.crc32(ext + b"\x00" + size.to_bytes(8, "little"), crc))
        pos += size
    return crc


# ----------------------------------------------------------- many at once


def join_members(members: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A sample's members, ``(extension as UTF-8, data)``, in one buffer:
    ``EXT\\0SIZE`` for each (size in decimal), ``\\0``-separated, then
    ``\\0\\0`` and the data one after another. Extensions hold no NUL and no
    item is empty, so the first ``\\0\\0`` ends the list. (What the writer's
    scan carries for a tiny sample, and :func:`encode_joined_block` takes.)"""
    members = list(members)
    head = b"\0".join(b"%s\0%d" % (ext, len(data)) for ext, data in members)
    return b"".join([head, b"\0\0", *[data for _, data in members]])


def joined_members(joined: bytes) -> list[tuple[str, bytes]]:
    """The ``(extension, data)`` members :func:`join_members` joined.

    Raises:
        ValueError: ``joined`` is not such a buffer (a size that is not a
            number, or data shorter than the sizes say).
    """
    items, data = split_joined(joined)
    if len(items) % 2:
        raise ValueError("joined members: an extension without its size")
    members = []
    pos = 0
    for i in range(0, len(items), 2):
        end = pos + int(items[i + 1])
        if end > len(data):
            raise ValueError(f"joined members: {len(data)} bytes of data, the sizes say at least {end}")
        members.append((items[i].decode("utf-8", "surrogateescape"), data[pos:end]))
        pos = end
    return members


def split_joined(joined: bytes) -> tuple[list[bytes], bytes]:
    """:func:`join_members`' buffer as ``[EXT, SIZE, EXT, SIZE, ...]`` and the
    data joined: what :func:`append_joined_sample` takes."""
    head, _, data = joined.partition(b"\0\0")
    return head.split(b"\0"), data


# The short header (see _short_header) as an array: typeflag "0", checksum
# field blank (spaces), name and size fields zero.
_TEMPLATE_ARRAY = np.frombuffer(_HEADER_TEMPLATE[:156] + b"0" + _HEADER_TEMPLATE[157:], dtype=np.uint8)
_TEMPLATE_SUM = int(_TEMPLATE_ARRAY.sum())
#: The header's bytes from the mode field to the typeflag (mode, owner,
#: size, mtime, checksum, typeflag) and from the magic to the device
#: numbers: all of its bytes that are not zero, but for the name's.
_MIDDLE = slice(100, 157)
_MAGIC_TO_DEVICES = slice(257, 345)
_SIZE_SHIFTS = np.arange(30, -1, -3, dtype=np.int64)  # 11 octal digits
_SUM_SHIFTS = np.arange(15, -1, -3, dtype=np.int64)  # 6 octal digits
_MAX_SIZE_DIGITS = 10  # decimal digits of _MAX_OCTAL_SIZE


def encode_joined_block(keys: Sequence[bytes], joined: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """Many samples' :func:`append_joined_sample` at once, with numpy: the
    same bytes and checksums, encoded a column at a time rather than a
    member at a time (the writer's path for runs of tiny samples).

    Args:
        keys: Each sample's key, encoded (UTF-8).
        joined: Each sample's members as :func:`join_members` lays them out.

    Returns:
        The tar bytes (uint8 array), each sample's end offset in them, and
        each sample's :func:`sample_checksum`; or None when a sample is not
        of the kind this encodes (a name that is not ASCII or longer than a
        ustar name field, a size an octal field cannot hold, a buffer not
        laid out as :func:`join_members` does): :func:`append_joined_sample`
        then takes each sample, and names what is wrong.
    """
    raw_keys = b"".join(keys)
    if not keys or not raw_keys.isascii():
        return None
    packed = np.frombuffer(b"".join(joined), dtype=np.uint8)
    sample_lens = _lengths(joined)
    members = _members(packed, np.cumsum(sample_lens) - sample_lens, sample_lens)
    if members is None:
        return None
    counts, ext_starts, ext_lens, sizes, data_starts = members
    key_lens = _lengths(keys)
    key_starts = np.cumsum(key_lens) - key_lens
    owner = np.repeat(np.arange(len(keys)), counts)  # each member's sample
    member_key_lens = key_lens[owner]
    if int((member_key_lens + 1 + ext_lens).max()) > 100 or int(packed[_spread(ext_starts, ext_lens)].max()) > 127:
        return None  # a name too long for the name field, or not ASCII
    keys_array = np.frombuffer(raw_keys, dtype=np.uint8)
    # Each member: its header, then its data padded to whole blocks.
    spans = BLOCK_SIZE + (sizes + (BLOCK_SIZE - 1)) // BLOCK_SIZE * BLOCK_SIZE
    member_ends = np.cumsum(spans)
    member_starts = member_ends - spans
    out = np.zeros(int(member_ends[-1]), dtype=np.uint8)
    blocks = out.reshape(-1, BLOCK_SIZE)
    at = member_starts // BLOCK_SIZE
    # The name field: KEY.EXT, NUL-padded.
    names = np.zeros((len(sizes), 100), dtype=np.uint8)
    name_bytes = names.reshape(-1)
    dots = np.arange(len(sizes)) * 100 + member_key_lens
    _copy(name_bytes, dots - member_key_lens, keys_array, key_starts[owner], member_key_lens)
    name_bytes[dots] = ord(".")
    _copy(name_bytes, dots + 1, packed, ext_starts, ext_lens)
    blocks[at, :100] = names
    middle = np.empty((len(sizes), _MIDDLE.stop - _MIDDLE.start), dtype=np.uint8)
    middle[:] = _TEMPLATE_ARRAY[_MIDDLE]
    size_field = ((sizes[:, None] >> _SIZE_SHIFTS) & 7) + ord("0")
    middle[:, 24:35] = size_field  # header bytes 124-134
    checksum = _TEMPLATE_SUM + names.sum(axis=1, dtype=np.int64) + size_field.sum(axis=1)
    middle[:, 48:54] = ((checksum[:, None] >> _SUM_SHIFTS) & 7) + ord("0")  # header bytes 148-153
    middle[:, 54] = 0
    blocks[at, _MIDDLE] = middle
    blocks[at, _MAGIC_TO_DEVICES] = _TEMPLATE_ARRAY[_MAGIC_TO_DEVICES]
    _copy(out, member_starts + BLOCK_SIZE, packed, data_starts, sizes)
    last = np.cumsum(counts) - 1
    checksums = _checksums(keys_array, key_starts, key_lens, packed, owner, counts, ext_starts, ext_lens, sizes, data_starts)
    return out, member_ends[last], checksums


def _members(
    packed: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Where the members of each buffer of :func:`join_members` (found in
    ``packed`` at ``starts``, of ``lengths``) are: their number per sample,
    then per member its extension's start and length, its size and its
    data's start. None for a buffer laid out otherwise."""
    ends = starts + lengths
    nul = packed == 0
    pairs = np.flatnonzero(nul[:-1] & nul[1:])
    found = np.searchsorted(pairs, starts)
    if int(found.max()) >= len(pairs):
        return None
    head_ends = pairs[found]  # each list's "\0\0"
    if bool((head_ends <= starts).any()) or bool((head_ends + 2 > ends).any()):
        return None
    # The NULs inside the lists separate their items.
    inside = np.zeros(len(packed) + 1, dtype=np.int8)
    inside[starts] = 1  # no list ends where another starts: each is followed by its data
    inside[head_ends] = -1
    separators = np.flatnonzero(nul & (np.cumsum(inside[:-1]) > 0))
    item_starts = np.sort(np.concatenate((starts, separators + 1)))
    item_ends = np.sort(np.concatenate((separators, head_ends)))
    items = np.searchsorted(item_starts, head_ends) - np.searchsorted(item_starts, starts)
    if bool((items % 2).any()) or bool((item_ends <= item_starts).any()):
        return None
    counts = items // 2
    digit_starts, digit_lens = item_starts[1::2], item_ends[1::2] - item_starts[1::2]
    if int(digit_lens.max()) > _MAX_SIZE_DIGITS:
        return None
    digits = packed[_spread(digit_starts, digit_lens)].astype(np.int64) - ord("0")
    if bool(((digits < 0) | (digits > 9)).any()):
        return None
    place = np.repeat(digit_starts + digit_lens - 1, digit_lens) - _spread(digit_starts, digit_lens)
    sizes = np.add.reduceat(digits * 10**place, np.cumsum(digit_lens) - digit_lens)
    first = np.cumsum(counts) - counts
    before = np.cumsum(sizes) - sizes  # member bytes before each member's, over all samples
    if int(sizes.max()) > _MAX_OCTAL_SIZE or not np.array_equal(np.add.reduceat(sizes, first), ends - head_ends - 2):
        return None
    owner = np.repeat(np.arange(len(starts)), counts)
    data_starts = (head_ends + 2)[owner] + before - before[first][owner]
    return counts, item_starts[0::2], item_ends[0::2] - item_starts[0::2], sizes, data_starts


def _checksums(
    keys: np.ndarray,
    key_starts: np.ndarray,
    key_lens: np.ndarray,
    packed: np.ndarray,
    owner: np.ndarray,
    counts: np.ndarray,
    ext_starts: np.ndarray,
    ext_lens: np.ndarray,
    sizes: np.ndarray,
    data_starts: np.ndarray,
) -> list[int]:
    """Each sample's :func:`sample_checksum`: what it sums (the key, a NUL,
    then per member its extension, a NUL, its size in 8 bytes and its data)
    laid out for all the samples, then one CRC call per sample."""
    member_lens = ext_lens + 9 + sizes
    first = np.cumsum(counts) - counts
    sample_lens = key_lens + 1 + np.add.reduceat(member_lens, first)
    sample_ends = np.cumsum(sample_lens)
    sample_starts = sample_ends - sample_lens
    before = np.cumsum(member_lens) - member_lens
    member_starts = (sample_starts + key_lens + 1)[owner] + before - before[first][owner]
    summed = np.zeros(int(sample_ends[-1]), dtype=np.uint8)
    _copy(summed, sample_starts, keys, key_starts, key_lens)
    _copy(summed, member_starts, packed, ext_starts, ext_lens)
    size_at = member_starts + ext_lens + 1
    summed[size_at[:, None] + np.arange(8)] = sizes.astype("<u8").view(np.uint8).reshape(-1, 8)
    _copy(summed, size_at + 8, packed, data_starts, sizes)
    view = memoryview(summed)
    return [zlib.crc32(view[a:b]) for a, b in zip(sample_starts.tolist(), sample_ends.tolist())]


def _lengths(items: Sequence[bytes]) -> np.ndarray:
    return np.fromiter(map(len, items), dtype=np.int64, count=len(items))


def _spread(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``start, start + 1, ..., start + length - 1`` of each piece, one after another."""
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


def _copy(out: np.ndarray, to: np.ndarray, source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Copy the pieces of ``source`` at ``starts``, of ``lengths``, to ``out`` at ``to``."""
    out[_spread(to, lengths)] = source[_spread(starts, lengths)]
