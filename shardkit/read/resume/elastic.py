"""Elastic resume: the rest of an epoch, re-split over another topology.

**Levels.** A state is a list of levels, oldest first. Each level records a
topology (world size, workers per rank) and the delivered count of each of
its slots; the last level is the one being read. When a state is restored
with another topology, every slot of the last level is replayed to find what
was delivered, the rest of the epoch becomes a new, shorter sequence (the
*remainder*: the positions the plan still had to hand out, in sequence
order), and a new level splits it over the new slots with the mode's rule
(``"exact"``: near-equal shares; ``"balanced"``: equal shares, dropping fewer
than ``world_size`` samples, or padding with ``pad``). A level's sequence is
kept as intervals of the epoch's global positions, so memory is
O(buffered samples + slots), not O(samples).

**Infinite mode.** A slot never stops: when its share of an epoch ends it
reads its share of the next, through the same shuffle buffer, so a state's
``epoch`` is the epoch the iteration started from and a slot's delivered
count may span several epochs. At a checkpoint different slots may be in
different epochs, and a buffer may hold samples of two epochs at once. A
level therefore splits a :class:`LevelPlan`: the remainders of the epochs an
earlier level left unfinished (oldest first), then whole epochs without end.
When the topology changes, the remainder of *every* epoch that some old slot
had started is computed on its own (what no old slot delivered of that
epoch, the samples still in the old buffers included; samples an old slot
already delivered from a later epoch are not part of that later epoch's
remainder); epochs every old slot had finished are dropped. The new slots
then read, each through one buffer, their near-equal share of each of those
remainders in epoch order, then their share of every following whole epoch,
as a fresh run of the new topology would. So every epoch is delivered
exactly once over the old and new slots together.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from shardkit.errors import StateError
from shardkit.read.resume.replay import SlotReplay
from shardkit.read.resume.state import Level
from shardkit.read.plan import EpochLayout
from shardkit.read.split import Mode, Piece, part_span, rank_span
from shardkit.world import World


class EpochSequence:
    """A level's sequence: global positions of the epoch as ordered intervals.

    Args:
        starts: Interval starts (global positions).
        stops: Interval stops, same length.
        full: Whether this is the whole epoch ``[0, total)`` (the plan of
            :func:`~shardkit.read.split.plan_epoch`).
    """

    def __init__(self, starts: np.ndarray, stops: np.ndarray, *, full: bool = False):
        self.starts = np.asarray(starts, dtype=np.int64)
        self.stops = np.asarray(stops, dtype=np.int64)
        self.ends = np.cumsum(self.stops - self.starts)
        self.full = full

    @classmethod
    def whole(cls, total: int) -> EpochSequence:
        return cls(np.array([0]), np.array([total]), full=True)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def slice(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Global intervals of indices ``[lo, hi)``; indices past the end wrap
        around to the start (padding)."""
        length = len(self)
        out: list[tuple[int, int]] = []
        if hi <= lo:
            return out
        if length == 0:
            raise StateError("cannot plan samples from an empty remainder")
        pos = lo
        while pos < hi:
            at = pos % length
            i = int(np.searchsorted(self.ends, at, side="right"))
            first = int(self.ends[i] - (self.stops[i] - self.starts[i]))
            take = min(int(self.ends[i]) - at, hi - pos)
            start = int(self.starts[i]) + at - first
            out.append((start, start + take))
            pos += take
        return out


def sequence_pieces(seq: EpochSequence, layout: EpochLayout, epoch: int, lo: int, hi: int) -> Iterator[Piece]:
    """The pieces of indices ``[lo, hi)`` of a level's sequence of ``epoch``."""
    for start, stop in seq.slice(lo, hi):
        yield from layout.pieces(epoch, start, stop)


@dataclass(frozen=True)
class LevelPlan:
    """What a level splits over its slots: a sequence per epoch from ``epoch`` on.

    Attributes:
        epoch: The epoch of the first sequence.
        carried: Sequences of the epochs ``epoch, epoch + 1, ...``. In
            ``"exact"`` and ``"balanced"`` mode exactly one (a level reads
            one epoch). In ``"infinite"`` mode the remainders an earlier
            level left, oldest first (none at the start of an iteration).
        layout: The epochs' sequences (their lengths and samples).
        endless: Whole epochs follow the carried ones (``"infinite"``).
    """

    epoch: int
    carried: tuple[EpochSequence, ...]
    layout: EpochLayout
    endless: bool

    @classmethod
    def start(cls, layout: EpochLayout, *, epoch: int, endless: bool) -> LevelPlan:
        """The plan of an iteration that starts ``epoch`` afresh."""
        return cls(epoch, () if endless else (EpochSequence.whole(layout.length(epoch)),), layout, endless)

    @property
    def fresh(self) -> bool:
        """Whether every epoch of the plan is whole (nothing was carried)."""
        return not self.carried if self.endless else self.carried[0].full

    def sequence(self, k: int) -> EpochSequence:
        """The sequence of epoch ``epoch + k``."""
        if k < len(self.carried):
            return self.carried[k]
        if not self.endless:
            raise IndexError(f"a one-epoch plan has no epoch {self.epoch + k}")
        return EpochSequence.whole(self.layout.length(self.epoch + k))


#: One epoch of a read part: (k, lo, hi), indices [lo, hi) of plan.sequence(k).
Span = tuple[int, int, int]


def part_spans(plan: LevelPlan, world: World, *, mode: Mode, pad: bool, part: int, num_parts: int) -> Iterator[Span]:
    """The epochs one read part of ``world``'s slot reads at a level, in
    order: per epoch ``(k, lo, hi)``, the indices of ``plan.sequence(k)`` it
    covers. Ends after the carried epochs unless the plan is endless; an
    endless stream with nothing to read in a whole epoch of the layout's
    stable stretch ends there too."""
    for k in itertools.count() if plan.endless else range(len(plan.carried)):
        lo, hi = part_span(len(plan.sequence(k)), world, mode=mode, pad=pad, part=part, num_parts=num_parts)
        if hi == lo and k >= len(plan.carried) and plan.epoch + k >= plan.layout.stable_from:
            return  # every later whole epoch is as empty for this stream
        yield k, lo, hi


def consumed_spans(spans: Iterable[Span], consumed: int) -> list[Span]:
    """Where the first ``consumed`` samples of a read part came from: per
    epoch ``(k, lo, stop)``, the read indices ``[lo, stop)``; the last entry
    is the one the stream had reached (empty epochs on the way included).

    Raises:
        StateError: The stream has fewer than ``consumed`` samples.
    """
    out: list[Span] = []
    left = consumed
    for k, lo, hi in spans:
        if left == 0:
            break
        take = min(left, hi - lo)
        out.append((k, lo, lo + take))
        left -= take
    if left:
        raise StateError(f"reader state: a read part delivered {consumed} samples, more than its plan holds")
    return out


def item_indices(taken: list[Span], items: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Epoch ``k`` and sequence index of each item number of a read part
    whose first items came from ``taken`` (see :func:`consumed_spans`)."""
    firsts = list(itertools.accumulate((stop - lo for _, lo, stop in taken), initial=0))
    for item in items:
        j = bisect.bisect_right(firsts, item) - 1
        assert 0 <= j < len(taken) and item < firsts[-1], "a buffered item lies outside what its stream read"
        k, lo, _ = taken[j]
        yield k, lo + item - firsts[j]



def remainder(
    plan: LevelPlan,
    level: Level,
    replays: Mapping[tuple[int, int], SlotReplay],
    *,
    mode: Mode,
    pad: bool,
    num_parts: int,
) -> LevelPlan:
    """What a level's slots had not delivered: the plan of the level after it.

    Args:
        plan: The level's plan.
        level: The level (complete).
        replays: Each slot's replay, keyed by (rank, worker).
        mode: The reader mode.
        pad: Balanced padding.
        num_parts: Read parts per slot (``interleave``).

    Returns:
        Per epoch of ``plan`` that some slot read into (and every carried
        one), the undelivered indices of what the level planned, in order,
        as a sequence of global positions. In ``"infinite"`` mode the epochs
        left with nothing to deliver at the front are dropped, and whole
        epochs follow the last one.
    """
    taken: dict[int, list[tuple[int, int]]] = {}
    points: dict[int, list[int]] = {}
    epochs = len(plan.carried)
    for (rank, worker), replay in replays.items():
        world = World(rank=rank, world_size=level.world_size, worker=worker, num_workers=level.num_workers)
        for part in range(num_parts):
            spans = part_spans(plan, world, mode=mode, pad=pad, part=part, num_parts=num_parts)
            part_taken = consumed_spans(spans, replay.consumed[part])
            for k, lo, stop in part_taken:
                if stop > lo:
                    taken.setdefault(k, []).append((lo, stop))
            if part_taken:
                epochs = max(epochs, part_taken[-1][0] + 1)
            held = (pos[1] for pos in replay.resident if pos[0] == part)
            for k, index in item_indices(part_taken, held):
                points.setdefault(k, []).append(index)
    rests = []
    for k in range(epochs):
        seq = plan.sequence(k)
        cover = rank_span(len(seq), rank=level.world_size - 1, world_size=level.world_size, mode=mode, pad=pad)[1]
        rests.append(undelivered(seq, taken.get(k, []), points.get(k, []), cover=cover))
    if not plan.endless:
        return LevelPlan(plan.epoch, tuple(rests), plan.layout, endless=False)
    done = next((k for k, rest in enumerate(rests) if len(rest)), len(rests))
    return LevelPlan(plan.epoch + done, tuple(rests[done:]), plan.layout, endless=True)


def undelivered(
    seq: EpochSequence, taken: Iterable[tuple[int, int]], points: Iterable[int], *, cover: int
) -> EpochSequence:
    """Indices ``[0, cover)`` of ``seq`` less the ``taken`` index ranges, plus
    the single indices ``points`` (taken but still buffered), in order, as
    a sequence of global positions."""
    intervals: list[tuple[int, int]] = []
    at = 0
    for lo, hi in sorted(taken):
        if lo > at:
            intervals.append((at, lo))
        at = max(at, hi)
    if at < cover:
        intervals.append((at, cover))
    intervals.extend((v, v + 1) for v in points)
    intervals.sort()
    starts: list[int] = []
    stops: list[int] = []
    for lo, hi in intervals:
        for a, b in seq.slice(lo, hi):
            if stops and stops[-1] == a:
                stops[-1] = b
            else:
                starts.append(a)
                stops.append(b)
    return EpochSequence(np.array(starts, dtype=np.int64), np.array(stops, dtype=np.int64))
