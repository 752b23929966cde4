"""Many whole samples at once: the parse of an indexed sequential read.

A reader that knows each sample's span (an offset index) and holds a chunk
of several whole samples can check their headers together, as arrays,
instead of member by member: :func:`plain_samples` does that for the
samples as shardkit and most tar writers store them. Its members are
*plain*: one ustar block each, checksum as ``%06o\\0 `` and size as eleven
octal digits (what Python's ``tarfile``, GNU tar and shardkit write), a
regular file, no name in the prefix field, named ``KEY.EXT`` with a
lower-case extension; every member of a sample shares its key, no
extension repeats, the last member ends where the sample's span does, and
neighbouring samples have different keys.

It returns the run of such samples at the start of the chunk and stops
before the first that is anything else (damaged, or an uncommon form); the
caller's :class:`~shardkit.format.tar.SampleParser` reads on from there,
reading every form and naming what is wrong. So the one pass accepts a part
of what the full parser accepts, and returns the same samples for it.

Per sample, what is left in Python is the member names and the fields'
bytes: a few microseconds a sample fewer than the full parser, which is
most of a small sample's read (a caption, a document of token ids).

A reader that wants one field of many one-member samples (the token ids of
documents) takes them as a :class:`SampleRun` from :func:`plain_run`: the
same checks, the names checked as arrays too, and nothing made per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardkit.format.sample import RawSample, split_key
from shardkit.format.ustar import BLOCK_SIZE

#: Samples checked in one call: bounds the arrays made for them (a header
#: block each), whatever the chunk holds.
MAX_SAMPLES = 4096
#: Members a plain sample may have; one with more goes to the full parser.
MAX_MEMBERS = 64

_DIGIT0, _DIGIT7 = ord("0"), ord("7")
_SIZE_POWERS = 8 ** np.arange(10, -1, -1, dtype=np.int64)  # eleven octal digits
_SUM_POWERS = 8 ** np.arange(5, -1, -1, dtype=np.int64)  # six
_USTAR = np.frombuffer(b"ustar", dtype=np.uint8)


def _octal(digits: np.ndarray, powers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's octal digits as a number, and whether all were octal digits."""
    ok = ((digits >= _DIGIT0) & (digits <= _DIGIT7)).all(axis=1)
    return (digits.astype(np.int64) - _DIGIT0) @ powers, ok


def _plain_headers(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which header blocks (rows of 512 bytes) are plain (see the module
    docstring), and the member size each states."""
    stored = rows[:, 148:156]
    checksum, ok = _octal(stored[:, :6], _SUM_POWERS)
    ok &= (stored[:, 6] == 0) & (stored[:, 7] == 32)
    # The header's bytes, its checksum field counted as eight spaces.
    ok &= rows.sum(axis=1, dtype=np.int64) - stored.sum(axis=1, dtype=np.int64) + 8 * 32 == checksum
    size, digits = _octal(rows[:, 124:135], _SIZE_POWERS)
    ok &= digits & ((rows[:, 135] == 0) | (rows[:, 135] == 32))
    kind = rows[:, 156]
    ok &= (kind == _DIGIT0) | (kind == 0)
    ok &= ~((rows[:, 257:262] == _USTAR).all(axis=1) & (rows[:, 345] != 0))  # no name in the prefix field
    return ok, size


def _whole_spans(buf: bytes, pos: int, base: int, bounds: Sequence[int] | np.ndarray) -> np.ndarray | None:
    """The buffer offsets of the spans of the samples whose spans lie whole
    in ``buf`` from ``pos`` (at most :data:`MAX_SAMPLES`), or None when
    there is none or they do not line up on tar blocks."""
    end = base + len(buf)
    count = min(int(np.searchsorted(bounds, end, side="right")) - 1, MAX_SAMPLES, len(bounds) - 1)
    if count <= 0 or base % BLOCK_SIZE or pos % BLOCK_SIZE or int(bounds[0]) != base + pos:
        return None
    spans = np.asarray(bounds[: count + 1], dtype=np.int64) - base
    if (spans % BLOCK_SIZE).any() or (np.diff(spans) < BLOCK_SIZE).any():
        return None
    return spans


def tar_blocks(buf: bytes) -> np.ndarray:
    """``buf``'s whole tar blocks, one a row (a view)."""
    return np.frombuffer(buf, dtype=np.uint8, count=len(buf) // BLOCK_SIZE * BLOCK_SIZE).reshape(-1, BLOCK_SIZE)


def plain_samples(
    buf: bytes, pos: int, base: int, bounds: Sequence[int] | np.ndarray, *, previous: str | None = None
) -> list[RawSample]:
    """The plain whole samples that start ``buf[pos:]``, in order.

    Args:
        buf: Bytes of a shard; ``buf[0]`` is at shard offset ``base``.
        pos: Where in ``buf`` the first sample begins.
        base: The shard offset of ``buf[0]`` (a multiple of 512).
        bounds: The offset index's boundaries of the samples from there on
            (``bounds[0] == base + pos``): sample ``k`` spans
            ``[bounds[k], bounds[k + 1])``.
        previous: The key of the sample before the first (a sample of that
            key would be read as part of it, so is not plain).

    Returns:
        The samples, up to :data:`MAX_SAMPLES`: those whose spans lie whole
        in ``buf``, stopping before the first that is not plain. Empty when
        there is none, or the arguments do not line up on tar blocks.
    """
    spans = _whole_spans(buf, pos, base, bounds)
    if spans is None:
        return []
    count = len(spans) - 1
    blocks = tar_blocks(buf)
    stops = spans[1:]
    cursor = spans[:-1].copy()
    good = count  # samples before the first one found not plain
    rounds: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # (samples, offsets, sizes, names)
    live = np.arange(count)
    for _ in range(MAX_MEMBERS):
        at = cursor[live]
        rows = blocks[at // BLOCK_SIZE]
        ok, size = _plain_headers(rows)
        after = at + BLOCK_SIZE + size
        after += -after % BLOCK_SIZE
        ok &= after <= stops[live]
        if not ok.all():
            good = min(good, int(live[np.argmin(ok)]))
        keep = live < good
        rounds.append((live[keep], at[keep], size[keep], rows[keep, :100]))
        cursor[live] = after
        live = live[keep & (after < stops[live])]
        if not len(live):
            break
    else:
        good = min(good, int(live[0]))  # more members than MAX_MEMBERS
    if good == 0:
        return []
    samples, offsets, sizes, names = (np.concatenate(parts) for parts in zip(*rounds))
    order = np.argsort(samples, kind="stable")  # each sample's members in round order: stored order
    order = order[samples[order] < good]
    return _assemble(buf, base, spans, samples[order].tolist(), offsets[order].tolist(), sizes[order].tolist(),
                     names[order].tobytes(), previous)  # fmt: skip


def _assemble(
    buf: bytes, base: int, spans: np.ndarray, samples: list[int], offsets: list[int], sizes: list[int],
    names: bytes, previous: str | None,
) -> list[RawSample]:  # fmt: skip
    """The samples of checked headers (``samples[i]``'s member at buffer
    offset ``offsets[i]``, of ``sizes[i]`` bytes, its name field
    ``names[100 * i : 100 * (i + 1)]``), up to the first whose names are
    not plain (see the module docstring)."""
    out: list[RawSample] = []
    current = -1
    key = previous
    fields: dict[str, bytes] = {}
    name_at = 0
    for sample, at, size in zip(samples, offsets, sizes):
        raw = names[name_at : name_at + 100]
        name_at += 100
        nul = raw.find(0)
        parts = split_key((raw if nul < 0 else raw[:nul]).decode("utf-8", "surrogateescape"))
        starts = sample != current
        if starts and current >= 0:  # every member of the one before was read
            out.append(RawSample(key, fields, base + int(spans[current]), base + int(spans[current + 1])))  # type: ignore
        if parts is None or parts[1].lower() != parts[1]:
            return out
        member_key, ext = parts
        if starts:
            if member_key == key:  # would be read as a member of the sample before
                return out
            current, key, fields = sample, member_key, {}
        elif member_key != key or ext in fields:
            return out
        fields[ext] = buf[at + BLOCK_SIZE : at + BLOCK_SIZE + size]
    if current >= 0:
        out.append(RawSample(key, fields, base + int(spans[current]), base + int(spans[current + 1])))  # type: ignore
    return out


@dataclass(frozen=True, eq=False)
class SampleRun:
    """Consecutive samples of one member each, of one field, checked as
    :func:`plain_samples` checks samples (see :func:`plain_run`), kept as
    arrays: what a reader of that one field takes instead of a
    :class:`~shardkit.format.sample.RawSample` each.

    Attributes:
        buf: The bytes the samples lie in (held only while the run is read).
        base: The shard offset of ``buf[0]``.
        field: The samples' one field.
        spans: The samples' spans as buffer offsets: sample ``i`` is
            ``buf[spans[i] : spans[i + 1]]``.
        sizes: Each sample's member size: its data is
            ``buf[spans[i] + 512 : spans[i] + 512 + sizes[i]]``.
        names: The member names' header fields, 100 bytes each.
    """

    buf: bytes
    base: int
    field: str
    spans: np.ndarray
    sizes: np.ndarray
    names: bytes

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def start(self) -> int:
        """The shard offset where the first sample begins."""
        return self.base + int(self.spans[0])

    @property
    def end(self) -> int:
        """The shard offset where the last sample ends."""
        return self.base + int(self.spans[-1])

    def key(self, i: int) -> str:
        """Sample ``i``'s key."""
        raw = self.names[100 * i : 100 * (i + 1)]
        name = raw.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
        return name[: len(name) - len(self.field) - 1]

    def sample(self, i: int) -> RawSample:
        """Sample ``i`` as the full parser returns it."""
        at = int(self.spans[i]) + BLOCK_SIZE
        data = self.buf[at : at + int(self.sizes[i])]
        start, end = self.base + int(self.spans[i]), self.base + int(self.spans[i + 1])
        return RawSample(self.key(i), {self.field: data}, start, end)


def plain_run(
    buf: bytes, pos: int, base: int, bounds: Sequence[int] | np.ndarray, field: str, *, previous: str | None = None
) -> SampleRun | None:
    """The plain whole samples that start ``buf[pos:]`` and are one member
    ``KEY.<field>`` each, as one run; None when the first is not one.

    Takes what :func:`plain_samples` takes, and the field (lower-case, as
    fields are named). The samples are those :func:`plain_samples` would
    return, up to the first that has more members or another field.
    """
    spans = _whole_spans(buf, pos, base, bounds)
    suffix = ("." + field).encode("utf-8", "surrogateescape")
    if spans is None or field != field.lower() or "/" in field or len(suffix) > 99:
        return None
    rows = tar_blocks(buf)[spans[:-1] // BLOCK_SIZE]
    ok, size = _plain_headers(rows)
    after = spans[:-1] + BLOCK_SIZE + size
    ok &= after + (-after % BLOCK_SIZE) == spans[1:]  # one member, filling its span
    names = rows[:, :100]
    ok &= _named(names, suffix, previous)
    count = int(np.argmin(ok)) if not ok.all() else len(ok)
    if count == 0:
        return None
    return SampleRun(buf, base, field, spans[: count + 1], size[:count], names[:count].tobytes())


_COLUMNS = np.arange(100)
_SLASH, _DOT = ord("/"), ord(".")


def _named(names: np.ndarray, suffix: bytes, previous: str | None) -> np.ndarray:
    """Which name fields (rows) name a member ``KEY<suffix>`` whose key is
    what :func:`~shardkit.format.sample.split_key` makes of it, each key
    other than the one before it (``previous`` before the first)."""
    nul = names == 0
    length = np.where(nul.any(axis=1), nul.argmax(axis=1), 100)  # the name ends at its first NUL
    stem = length - len(suffix)  # where the key ends
    ok = stem >= 1
    at = np.clip(stem, 0, None)[:, None] + np.arange(len(suffix))
    ok &= (np.take_along_axis(names, np.clip(at, 0, 99), axis=1) == np.frombuffer(suffix, dtype=np.uint8)).all(axis=1)
    in_key = _COLUMNS < stem[:, None]
    slash = np.where((names == _SLASH) & in_key, _COLUMNS, -1).max(axis=1)
    ok &= stem > slash + 1  # a basename before the extension
    ok &= ~((names == _DOT) & in_key & (_COLUMNS > slash[:, None])).any(axis=1)  # the extension's dot is the first
    kept = np.where(_COLUMNS < length[:, None], names, 0)
    ok[1:] &= (kept[1:] != kept[:-1]).any(axis=1)
    if previous is not None:
        name = (previous.encode("utf-8", "surrogateescape") + suffix)[:100]
        ok[0] &= kept[0].tobytes() != name.ljust(100, b"\x00")
    return ok


__all__ = ["MAX_MEMBERS", "MAX_SAMPLES", "SampleRun", "plain_run", "plain_samples", "tar_blocks"]
