"""Replay: rebuild a slot's position from its delivered count alone.

A slot's stream is a pure function of the plan and its seeded shuffle
buffer, so running the plan and the buffer over sample *positions* (shard,
sample number and stored size, which the offset index gives without reading
data) until ``count`` samples have come out of the buffer tells how far each
read part got and which samples the buffer holds, and leaves the buffer's
generator where the run had it. Only the buffered samples are read again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.read.shuffle import ShuffleBuffer, round_robin
from shardkit.read.split import Piece

#: Buffered samples of one shard closer than this many bytes are read in one
#: request, reading the samples between them too.
RESIDENT_GAP_BYTES = 16 << 10

#: A position in a replayed stream: (part, item, shard, sample, stored bytes),
#: where ``item`` counts the samples of that part's stream before this one.
Position = tuple[int, int, int, int, int]


@dataclass
class SlotReplay:
    """A slot's state after its first ``count`` delivered samples.

    Attributes:
        consumed: Samples each read part (part) had handed to the buffer.
        next_part: The part the interleave takes from next.
        resident: The buffer's positions in buffer order.
        held: Bytes the residents hold (with a byte cap).
        buffer: The shuffle buffer with its generator advanced, or None
            without shuffling.
    """

    consumed: list[int]
    next_part: int
    resident: list[Position]
    held: int
    buffer: ShuffleBuffer[Any] | None


SizesFn = Callable[[int], np.ndarray]


def _positions(part: int, pieces: Iterator[Piece], sizes: SizesFn) -> Iterator[Position]:
    item = 0
    for piece in pieces:
        stored = sizes(piece.shard)[piece.start : piece.stop].tolist()
        for i, size in enumerate(stored, piece.start):
            yield (part, item, piece.shard, i, size)
            item += 1


def _replay_indices(
    count: int, pieces: Iterator[Piece], length: int | None, sizes: SizesFn, buffer: ShuffleBuffer[Any]
) -> SlotReplay:
    """:func:`replay_slot` for one read part and a count-only buffer:
    the buffer runs over item numbers (vectorized), and only the residents
    are mapped to positions."""
    resident_items, taken = buffer.advance_indices(length=length, num_out=count)
    wanted = sorted(resident_items)
    found: dict[int, Position] = {}
    at = 0  # stream index of the current piece's first sample
    k = 0
    for piece in pieces:
        if k == len(wanted):
            break
        end = at + piece.num_samples
        while k < len(wanted) and wanted[k] < end:
            item = wanted[k]
            index = piece.start + item - at
            size = int(sizes(piece.shard)[index])  # only shards with residents load their index
            found[item] = (0, item, piece.shard, index, size)
            k += 1
        at = end
    assert k == len(wanted), "a buffered item lies past the slot's pieces"
    return SlotReplay(
        consumed=[taken],
        next_part=1 if taken else 0,
        resident=[found[i] for i in resident_items],
        held=0,
        buffer=buffer,
    )


def replay_slot(
    *,
    count: int,
    parts: list[tuple[Iterator[Piece], int | None]],
    sizes: SizesFn,
    buffer: ShuffleBuffer[Any] | None,
) -> SlotReplay:
    """Replay a slot over positions until ``count`` samples have been delivered.

    Args:
        count: Delivered samples to replay.
        parts: Per read part: its pieces, and how many samples it holds
            (None for an endless stream, ``"infinite"``).
        sizes: Stored size of each sample of a shard.
        buffer: A fresh shuffle buffer seeded as the slot's (None without
            shuffling); it is advanced in place.
    """
    if len(parts) == 1 and buffer is not None and buffer.max_bytes is None and buffer.size > 1:
        pieces, length = parts[0]
        return _replay_indices(count, pieces, length, sizes, buffer)
    consumed = [0] * len(parts)
    last = [-1]

    def counted(stream: Iterator[Position]) -> Iterator[Position]:
        for item in stream:
            consumed[item[0]] += 1
            last[0] = item[0]
            yield item

    positions = [_positions(p, pieces, sizes) for p, (pieces, _) in enumerate(parts)]
    # One read part needs no per-item counting: what was taken is its count.
    source = positions[0] if len(positions) == 1 else counted(round_robin(positions))
    resident: list[Position] = []
    held = 0
    if buffer is None:
        taken = sum(1 for _ in zip(range(count), source))
    else:
        resident, held, taken = buffer.advance(source, count)
    if len(positions) == 1:
        consumed[0] = taken
        last[0] = 0 if taken else -1
    return SlotReplay(consumed=consumed, next_part=last[0] + 1, resident=resident, held=held, buffer=buffer)


def resident_runs(
    resident: Iterable[Position], sizes: SizesFn, *, gap_bytes: int = RESIDENT_GAP_BYTES
) -> dict[int, list[tuple[int, int]]]:
    """Per shard, few runs ``[lo, hi)`` of sample numbers covering the
    buffered samples: samples closer than ``gap_bytes`` share one read."""
    by_shard: dict[int, set[int]] = {}
    for _, _, shard, index, _ in resident:
        by_shard.setdefault(shard, set()).add(index)
    runs: dict[int, list[tuple[int, int]]] = {}
    for shard in sorted(by_shard):
        indices = np.array(sorted(by_shard[shard]), dtype=np.int64)
        stored = sizes(shard)
        # Bytes between consecutive buffered samples of this shard.
        ends = np.concatenate(([0], np.cumsum(stored)))
        gaps = ends[indices[1:]] - ends[indices[:-1] + 1]
        cut = np.flatnonzero(gaps > gap_bytes)
        firsts = np.concatenate(([indices[0]], indices[cut + 1]))
        lasts = np.concatenate((indices[cut], [indices[-1]]))
        runs[shard] = [(int(lo), int(hi) + 1) for lo, hi in zip(firsts, lasts)]
    return runs
