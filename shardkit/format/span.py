"""One sample from exactly its bytes: the parse of a random read.

A random read fetches the span the offset index gives a sample and must
find there one whole sample that fills it. :func:`parse_span` does that in
one pass for members as shardkit and most tar writers store them: plain
ustar headers with valid checksums, regular files named ``KEY.EXT`` with a
lower-case extension, one key, each member inside the span and the last one
ending where the span ends.

Anything else (extended headers, links or directories, a name in the ustar
prefix field, upper-case extensions, a damaged header, a second key, a
stored checksum to check) goes to :class:`~shardkit.format.tar.SampleParser`,
which reads every form and names what is wrong. The one pass accepts a part
of what the full parser accepts and returns the same sample for it, so the
two cannot disagree on what a span holds; it only saves the full parser's
bookkeeping, which is most of a tiny sample's read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from shardkit.format.tar import RawSample, SampleParser, split_key
from shardkit.format.ustar import BLOCK_SIZE, byte_sum

_PLAIN_TYPES = (b"0", b"\x00")  # a regular file, as tar writers old and new mark it
#: A ustar header's name, size, checksum, type flag, magic (without its
#: terminator) and the first byte of its prefix field.
_HEADER_FIELDS = struct.Struct("100s24x12s12x8sc100x5s83xc")


def parse_span(
    data: bytes, *, start: int, path: str | Callable[[], str], checksums: Sequence[int] | None = None
) -> RawSample:
    """The one sample ``data`` holds, which must fill it exactly.

    Args:
        data: The bytes of the span ``[start, start + len(data))`` of a shard.
        start: Where ``data`` begins in the shard (for offsets in errors).
        path: The shard, for errors; or a function that names it, called
            only when the full parser is needed.
        checksums: The sample's stored checksum (a one-item sequence), to check.

    Raises:
        CorruptShardError: The span does not hold exactly one whole sample,
            or the sample fails its checksum (see
            :class:`~shardkit.format.tar.SampleParser` with ``bounds``).
    """
    sample = None if checksums is not None else _plain_sample(data, start)
    if sample is not None:
        return sample
    end = start + len(data)
    parser = SampleParser(path=path if isinstance(path, str) else path(), base_offset=start, bounds=(start, end), checksums=checksums)
    samples = parser.feed(data)
    samples += parser.finish(expect_end_marker=False)
    return samples[0]


def _plain_sample(data: bytes, start: int) -> RawSample | None:
    """The sample of ``data`` when every member is plain (see the module
    docstring), else None."""
    total = len(data)
    pos = 0
    key = None
    fields: dict[str, bytes] = {}
    while pos < total:
        if total - pos < BLOCK_SIZE:
            return None
        name, size_field, stored, kind, magic, prefix = _HEADER_FIELDS.unpack_from(data, pos)
        if kind not in _PLAIN_TYPES or (prefix != b"\x00" and magic == b"ustar"):
            return None
        digits = stored.split(b"\x00", 1)[0].strip()
        size_digits = size_field.split(b"\x00", 1)[0].strip(b" ")
        # isdigit: ASCII digits only, so int() sees no sign, space, "_" or "0o"; it refuses 8 and 9.
        if not (digits.isdigit() and size_digits.isdigit()):
            return None
        try:
            checksum, size = int(digits, 8), int(size_digits, 8)
        except ValueError:
            return None
        if byte_sum(data[pos : pos + BLOCK_SIZE]) - sum(stored) + 256 != checksum:
            return None
        data_start = pos + BLOCK_SIZE
        data_end = data_start + size
        if data_end > total:
            return None
        parts = split_key(name.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape"))
        if parts is None:
            return None
        member_key, ext = parts
        if key is None:
            key = member_key
        elif member_key != key or ext in fields:
            return None
        if ext.lower() != ext:
            return None
        fields[ext] = data[data_start:data_end]
        pos = data_end + (-data_end % BLOCK_SIZE)
    if key is None or pos != total:
        return None
    return RawSample(key, fields, start, start + total)


__all__ = ["parse_span"]
