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

from collections.abc import Sequence

from shardkit.format.tar import RawSample, SampleParser, split_key
from shardkit.format.ustar import BLOCK_SIZE, byte_sum

_PLAIN_TYPES = (ord("0"), 0)  # a regular file, as tar writers old and new mark it
_OCTAL = b"01234567"


def parse_span(data: bytes, *, start: int, path: str, checksums: Sequence[int] | None = None) -> RawSample:
    """The one sample ``data`` holds, which must fill it exactly.

    Args:
        data: The bytes of the span ``[start, start + len(data))`` of a shard.
        start: Where ``data`` begins in the shard (for offsets in errors).
        path: The shard, for errors.
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
    parser = SampleParser(path=path, base_offset=start, bounds=(start, end), checksums=checksums)
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
        header = data[pos : pos + BLOCK_SIZE]
        if header[156] not in _PLAIN_TYPES or (header[257:262] == b"ustar" and header[345]):
            return None
        stored = header[148:156]
        digits = stored.split(b"\x00", 1)[0].strip()
        if not digits or digits.strip(_OCTAL) or byte_sum(header) - sum(stored) + 256 != int(digits, 8):
            return None
        size_digits = header[124:136].split(b"\x00", 1)[0].strip(b" ")
        if not size_digits or size_digits.strip(_OCTAL):
            return None
        data_start = pos + BLOCK_SIZE
        data_end = data_start + int(size_digits, 8)
        if data_end > total:
            return None
        parts = split_key(header[:100].split(b"\x00", 1)[0].decode("utf-8", "surrogateescape"))
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
