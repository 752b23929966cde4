"""The byte ranges a :class:`~shardkit.read.pieces.PieceReader` asks a
source for: a remote range paced by its read-ahead's start budget, local
requests cut on sample boundaries, and what to read again after a fault."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from shardkit.errors import TruncatedShardError
from shardkit.io.base import ByteSource
from shardkit.read.prefetch import ReadAhead


def remote_range(
    source: ByteSource, start: int, end: int | None, ahead: ReadAhead[Any] | None, chunk_bytes: int
) -> Iterator[bytes]:
    """Bytes ``[start, end)`` of a remote shard, read for ``ahead`` (None:
    asked for whole).

    While ``ahead`` is still on its start budget (its consumer has taken
    nothing), the store is asked for that budget's worth of bytes alone,
    and for the rest once the consumer has taken half of them. A store
    sends a range as fast as the link allows, whatever the reader's budget:
    the kernel buffers what the reader does not take. One request for the whole range
    made ahead of the consumer would thus fill the link with bytes nobody
    waits for yet, while the rank's other DataLoader workers start and ask
    for their first bytes behind them. The bytes are the same either way.
    A range without a known end (no manifest size) is asked for whole: a
    cut could ask for bytes past the end of a short object.
    """
    if ahead is None or not ahead.starting or end is None or end <= start + ahead.start_bytes:
        yield from source.iter_range(start, end, chunk_bytes=chunk_bytes)
        return
    middle = start + ahead.start_bytes
    yield from source.iter_range(start, middle, chunk_bytes=chunk_bytes)
    if ahead.wait_room(ahead.start_bytes // 2):  # False: the reader was closed meanwhile
        yield from source.iter_range(middle, end, chunk_bytes=chunk_bytes)


def salvage_ranges(
    bounds: np.ndarray, exc: Exception, next_sample: int, stop: int, whole: bool
) -> list[tuple[int, int, bool]]:
    """What is worth reading again of samples ``[next_sample, stop)`` after
    ``exc``: ``(lo, hi, whole)`` ranges that leave out the sample holding the
    fault's offset (and, after truncation, everything after it).

    A fault at or past the end of the range's samples (data past the last
    one, a bad end marker) leaves them all, read once more without the
    end-marker check. Every range returned is smaller than the one that
    failed, or the same samples without that check, so retrying them ends.
    """
    offset = getattr(exc, "offset", None)
    if offset is None or next_sample >= stop:
        return []
    bad = int(np.searchsorted(bounds, offset, side="right")) - 1  # the sample whose span holds the fault
    if bad >= stop:
        return [(next_sample, stop, False)] if whole else []
    bad = max(bad, next_sample)
    ranges = [(next_sample, bad, False)]
    if not isinstance(exc, TruncatedShardError):
        ranges.append((bad + 1, stop, whole))
    return [r for r in ranges if r[0] < r[1]]


class AlignedSource:
    """A local source read in requests that end on sample boundaries.

    The parser then never holds a partial member across chunks, so it parses
    each chunk in place instead of copying it onto the leftover of the
    previous one. (Remote sources keep one streamed range, which their own
    read-ahead pipelines.)

    Args:
        source: The shard.
        cuts: Where the samples of the ranges to read end, ascending. A
            request ends on the furthest cut within ``chunk_bytes`` (or on
            the next one, for a sample larger than that); the request that
            reaches the last cut runs on to the end of the range, taking
            the tar end marker with it where the range has one.
    """

    def __init__(self, source: ByteSource, cuts: np.ndarray):
        self.source = source
        self.cuts = cuts
        self.url = source.url

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        assert end is not None, "an indexed range has a known end"
        cuts = self.cuts
        last = len(cuts) - 1
        pos = start
        first = int(np.searchsorted(cuts, pos, side="right"))  # the next cut after pos
        while first <= last:
            cut = max(int(np.searchsorted(cuts, pos + chunk_bytes, side="right")) - 1, first)
            stop = end if cut == last else int(cuts[cut])
            yield from self.source.iter_range(pos, stop, chunk_bytes=max(chunk_bytes, stop - pos))
            pos, first = stop, cut + 1

    def read_all(self) -> bytes:
        return self.source.read_all()


def gathered(bounds: np.ndarray, stored: np.ndarray, *, gap_bytes: int) -> tuple[np.ndarray, list[tuple[int, int, list[tuple[int, int]]]]]:
    """The samples at ``stored`` positions (rising) of a shard, as one
    stream of their bytes laid end to end: the bounds of that stream (from
    0), and the spans of the shard to read for it, each ``(start, end,
    runs)``: a span covers runs of consecutive positions less than
    ``gap_bytes`` apart, read through (one sequential read, the kernel's
    read-ahead intact), the bytes between them dropped; a larger gap is
    skipped. A sparse subset (a view) is parsed without the samples between."""
    starts = bounds[stored].astype(np.int64)
    ends = bounds[stored + 1].astype(np.int64)
    virtual = np.concatenate(([0], np.cumsum(ends - starts))).astype(np.int64)
    cuts = np.flatnonzero(np.diff(stored) != 1) + 1
    firsts = np.concatenate(([0], cuts))
    lasts = np.concatenate((cuts, [len(stored)])) - 1
    spans: list[tuple[int, int, list[tuple[int, int]]]] = []
    for lo, hi in zip(starts[firsts].tolist(), ends[lasts].tolist()):
        if spans and lo - spans[-1][1] < gap_bytes:
            spans[-1] = (spans[-1][0], hi, spans[-1][2] + [(lo, hi)])
        else:
            spans.append((lo, hi, [(lo, hi)]))
    return virtual, spans


def runs_of(chunks: Iterator[bytes], start: int, runs: list[tuple[int, int]]) -> Iterator[memoryview]:
    """The bytes of ``runs`` (rising, inside the stream) out of ``chunks``,
    a stream of a shard's bytes from ``start``."""
    pos, i = start, 0
    for chunk in chunks:
        end = pos + len(chunk)
        view = memoryview(chunk)  # slices without copies: the caller joins them once
        while i < len(runs) and runs[i][0] < end:
            lo, hi = runs[i]
            a, b = max(lo, pos), min(hi, end)
            if a < b:
                yield view[a - pos : b - pos]
            if hi > end:
                break
            i += 1
        pos = end
