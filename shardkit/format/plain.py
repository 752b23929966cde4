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
most of a small sample's read (a document of token ids, a caption).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    end = base + len(buf)
    count = min(int(np.searchsorted(bounds, end, side="right")) - 1, MAX_SAMPLES, len(bounds) - 1)
    if count <= 0 or base % BLOCK_SIZE or pos % BLOCK_SIZE or int(bounds[0]) != base + pos:
        return []
    spans = np.asarray(bounds[: count + 1], dtype=np.int64) - base
    if (spans % BLOCK_SIZE).any() or (np.diff(spans) < BLOCK_SIZE).any():
        return []
    blocks = np.frombuffer(buf, dtype=np.uint8, count=len(buf) // BLOCK_SIZE * BLOCK_SIZE).reshape(-1, BLOCK_SIZE)
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
            out.append(RawSample(key, fields, base + int(spans[current]), base + int(spans[current + 1])))  # type: ignore[arg-type]
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
        out.append(RawSample(key, fields, base + int(spans[current]), base + int(spans[current + 1])))  # type: ignore[arg-type]
    return out


__all__ = ["MAX_MEMBERS", "MAX_SAMPLES", "plain_samples"]
