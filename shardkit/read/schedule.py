"""Mixing datasets: weighted streams with exact shares per epoch.

A *mixture* reads several datasets (:class:`Stream` s) as one epoch of
``samples_per_epoch`` samples. Everything here is pure arithmetic over
sample counts; :mod:`.slot` reads what it says.

**Shares.** Each epoch, stream *i* gives exactly ``shares(epoch)[i]``
samples: a stream with ``samples`` gives that many; the rest of
``samples_per_epoch`` is shared among the streams with a ``weight`` in
proportion to their weights, rounded by largest remainder so the shares
sum exactly (ties to the earlier stream). A weight may be a step function
of the epoch (``{0: 1.0, 5: 0.3}``: 1.0 for epochs 0-4, 0.3 from 5 on).
Without any weight or sample count, shares follow the streams' sizes.

**The walk.** Stream *i* is read as an endless *walk*: pass after pass over
it, each pass a new order of its shards (runs of samples in stored order),
drawn from ``(seed, pass, stream)``. Epoch *e* takes the next
``shares(e)[i]`` positions of the walk, so no sample is taken twice before
every sample was taken once, across epochs. A pass keeps in place the part
of the previous pass before the last epoch boundary in it, and reorders the
rest; so an epoch that spans passes ends among samples it has taken no more
often than the others, and a share of *k* times the stream takes each
sample ``floor(k)`` or ``ceil(k)`` times (:class:`WalkLayout`).

**Split and interleave.** Each stream's share is split over ranks and
workers like one dataset's epoch (see :mod:`.split`), so each slot gets a
near-equal part of every stream and a small stream leaves no slot empty of
the others. A slot then reads its parts side by side, each through its own
shuffle buffer, and interleaves them by a *stratified schedule*
(:func:`schedule_labels`): stream *i*'s *k*-th sample of the slot takes the
place of rank ``(k + 1/2) / m_i`` among all the slot's samples (``m_i``
samples of stream *i*), with ties to the earlier stream. In any run of
*B* consecutive samples a stream's count is then within
``1 + p_i (S - 2)`` of ``B * m_i / M`` for *S* streams, ``p_i = m_i / M``
(within 1 for two streams, under ``S - 1`` always): each stream's count in
a run is within 1 of its share of the run's length, and the run holds *B*
samples in all. That is instead of the
binomial noise of independent draws (whose standard deviation is
``sqrt(B p (1 - p))``, 3.7 samples for *B* = 64, *p* = 0.3).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from shardkit.errors import UsageError
from shardkit.format.manifest import Manifest
from shardkit.io.base import SourceOptions
from shardkit.io.urls import redact_url
from shardkit.read.split import WALK_ORDER_DOMAIN, Piece, seed_sequence

#: Labels computed at once by :func:`schedule_labels`.
_LABEL_BLOCK = 4096

Weight = float | Mapping[int, float]


def _describe(source: Any) -> str:
    if isinstance(source, Manifest):
        return f"manifest {source.fingerprint[:12]}"
    if isinstance(source, (list, tuple)):
        return f"{len(source)} shards from {redact_url(os.fspath(source[0])) if source else '?'}"
    return redact_url(os.fspath(source))  # never a URL's credentials or query


def _check_weight(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"{where}: a weight must be a positive number, not {value!r}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise UsageError(
            f"{where}: weight {value!r} is not a positive finite number; give a weight > 0 "
            "(leave the stream out to stop reading it)"
        )
    return number


@dataclass(frozen=True)
class Stream:
    """One dataset of a mixture (see :class:`~shardkit.ShardDataset`).

    Args:
        source: A dataset as :class:`~shardkit.ShardDataset` takes it, with a
            manifest (or ``.idx`` sidecars): a mixture needs sample counts.
        weight: Relative weight: a number, or a step function of the epoch
            as a mapping ``{first_epoch: weight}`` that must start at epoch
            0 (``{0: 1.0, 5: 0.3}``).
        samples: An absolute count of samples per epoch (instead of a weight).
        source_options: Storage options of this stream (default the dataset's).
        name: What ``sample["__stream__"]`` holds for this stream's samples
            (default the stream's index in the list). Name every stream or none.

    Raises:
        UsageError: Both ``weight`` and ``samples``; a weight that is zero,
            negative or not finite; ``samples`` < 1.
    """

    source: Any
    _: KW_ONLY
    weight: Weight | None = None
    samples: int | None = None
    source_options: SourceOptions | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        where = self.label
        if self.weight is not None and self.samples is not None:
            raise UsageError(f"{where}: give either weight= or samples=, not both")
        if isinstance(self.weight, Mapping):
            if not self.weight:
                raise UsageError(f"{where}: a weight schedule needs at least one step, {{0: weight}}")
            for epoch, value in self.weight.items():
                if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                    raise UsageError(f"{where}: weight schedule keys are first epochs (ints >= 0), not {epoch!r}")
                _check_weight(value, f"{where}, epoch {epoch}")
            if 0 not in self.weight:
                raise UsageError(
                    f"{where}: a weight schedule must say the weight of epoch 0, e.g. "
                    f"{{0: 1.0, {min(self.weight)}: {self.weight[min(self.weight)]}}}"
                )
        elif self.weight is not None:
            _check_weight(self.weight, where)
        if self.samples is not None and (
            isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1
        ):
            raise UsageError(f"{where}: samples must be an int >= 1, not {self.samples!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise UsageError(f"{where}: name must be a string, not {self.name!r}")

    @property
    def label(self) -> str:
        """How messages name the stream."""
        return f"stream {self.name!r}" if self.name is not None else f"stream {_describe(self.source)!r}"

    def weight_at(self, epoch: int) -> float | None:
        """The weight of ``epoch`` (a schedule's last step at or before it)."""
        if not isinstance(self.weight, Mapping):
            return None if self.weight is None else float(self.weight)
        return float(self.weight[max(e for e in self.weight if e <= epoch)])

    def weight_record(self) -> Any:
        """The weight as JSON data (a schedule's keys as strings)."""
        if isinstance(self.weight, Mapping):
            return {str(e): float(w) for e, w in sorted(self.weight.items())}
        return None if self.weight is None else float(self.weight)


def weight_from_record(value: Any) -> Weight | None:
    """Inverse of :meth:`Stream.weight_record`."""
    if isinstance(value, Mapping):
        return {int(e): float(w) for e, w in value.items()}
    return value


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights``, rounded so the parts sum
    to ``total`` exactly: each part is its quota rounded down, and the parts
    with the largest fractions get one more (ties to the earlier one)."""
    exact = [Fraction(w) for w in weights]
    whole = sum(exact)
    quotas = [total * w / whole for w in exact]
    parts = [math.floor(q) for q in quotas]
    left = total - sum(parts)
    by_fraction = sorted(range(len(parts)), key=lambda i: (-(quotas[i] - parts[i]), i))
    for i in by_fraction[:left]:
        parts[i] += 1
    return parts


@dataclass(frozen=True, eq=False)
class MixSchedule:
    """Per epoch, how many samples each stream gives (see the module docstring).

    Args:
        streams: The streams.
        sizes: Samples in each stream's dataset.
        samples_per_epoch: Samples per epoch; None for the default (the sum
            of the streams' ``samples`` if every stream has one, else the
            sum of the sizes).
        override: ``(epoch, schedule, index)``: that epoch takes its shares
            from another schedule (a checkpoint's mixture), whose streams are
            a subset of these: its stream ``k`` is this one's ``index[k]``.

    Raises:
        UsageError: Any bad combination, naming the stream.
    """

    streams: tuple[Stream, ...]
    sizes: tuple[int, ...]
    samples_per_epoch: int | None = None
    override: tuple[int, MixSchedule, tuple[int, ...]] | None = None
    _cache: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False)
    _offsets: list[tuple[int, ...]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        spe = self.samples_per_epoch
        if spe is not None and (isinstance(spe, bool) or not isinstance(spe, int) or spe <= 0):
            raise UsageError(f"samples_per_epoch must be an int > 0, not {spe!r}")
        weighted = [s for s in self.streams if s.weight is not None]
        counted = [s for s in self.streams if s.samples is not None]
        if weighted or counted:
            for stream in self.streams:
                if stream.weight is None and stream.samples is None:
                    raise UsageError(
                        f"{stream.label} has neither weight= nor samples=, while other streams do: "
                        "give every stream one of them (or none, to mix in proportion to their sizes)"
                    )
        fixed = sum(s.samples or 0 for s in counted)
        if spe is not None and not weighted and fixed != spe:
            raise UsageError(
                f"the streams' samples= add up to {fixed}, not samples_per_epoch={spe}: "
                "make them agree, or give some streams a weight to share the rest"
            )
        if spe is not None and weighted and fixed > spe:
            raise UsageError(
                f"the streams' samples= add up to {fixed}, more than samples_per_epoch={spe}, "
                "leaving nothing for the weighted streams"
            )
        total = self.epoch_total
        if total >= 2**31:
            raise UsageError(f"samples_per_epoch must be < 2**31, not {total}")

    @property
    def epoch_total(self) -> int:
        """Samples of every epoch."""
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch
        if all(s.samples is not None for s in self.streams):
            return sum(s.samples or 0 for s in self.streams)
        return sum(self.sizes)

    @property
    def stable_from(self) -> int:
        """The first epoch from which every epoch has the same shares."""
        steps = [max(s.weight) for s in self.streams if isinstance(s.weight, Mapping)]
        last = max(steps, default=0)
        if self.override is not None:
            last = max(last, self.override[0] + 1)
        return last

    def shares(self, epoch: int) -> tuple[int, ...]:
        """Samples each stream gives in ``epoch``; they sum to :attr:`epoch_total`."""
        found = self._cache.get(epoch)
        if found is not None:
            return found
        if self.override is not None and self.override[0] == epoch:
            _, other, index = self.override
            out = [0] * len(self.streams)
            for share, i in zip(other.shares(epoch), index):
                out[i] = share
            found = tuple(out)
        else:
            found = tuple(self._own_shares(epoch))
        self._cache[epoch] = found
        return found

    def _own_shares(self, epoch: int) -> list[int]:
        streams = self.streams
        if all(s.weight is None and s.samples is None for s in streams):
            return largest_remainder(self.epoch_total, self.sizes)
        out = [s.samples or 0 for s in streams]
        weighted = [i for i, s in enumerate(streams) if s.weight is not None]
        if weighted:
            rest = self.epoch_total - sum(out)
            parts = largest_remainder(rest, [streams[i].weight_at(epoch) or 0.0 for i in weighted])
            for i, part in zip(weighted, parts):
                out[i] = part
        return out

    def layout(
        self, index: int, counts: np.ndarray | None, *, seed: int, words: tuple[int, ...], shuffle: bool
    ) -> WalkLayout:
        """Stream ``index``'s epochs: windows of its walk (``words``: its seed word)."""
        assert counts is not None, "a mixture's streams have sample counts"
        return WalkLayout(counts, self, index, seed, words[0], shuffle)

    def offset(self, stream: int, epoch: int) -> int:
        """Where ``epoch`` starts in ``stream``'s walk: the samples the
        stream gave in all earlier epochs.

        The streams' read-ahead threads ask at once: the list only grows,
        under :data:`_OFFSETS`, so no two threads append the same epoch (which
        shifted every later epoch's walk, and so the samples read)."""
        offsets = self._offsets
        if len(offsets) <= epoch:
            with _OFFSETS:
                if not offsets:
                    offsets.append((0,) * len(self.streams))
                while len(offsets) <= epoch:
                    e = len(offsets) - 1
                    offsets.append(tuple(a + b for a, b in zip(offsets[e], self.shares(e))))
        return offsets[epoch][stream]


#: Held while a mixture schedule's epoch offsets grow (see :meth:`MixSchedule.offset`).
_OFFSETS = threading.Lock()
#: Held while a walk's passes are computed or read (see :meth:`WalkLayout.pass_arrays`).
_WALKS = threading.Lock()


class _Passes:
    """The passes of one stream's walk, computed in order (see :class:`WalkLayout`).

    A pass is a list of pieces (shard, first, stop) covering every sample of
    the stream once. Pass 0 is the shards in a permuted order. Pass ``q + 1``
    keeps the first ``c`` samples of pass ``q`` in place and permutes the
    pieces of the rest, where ``c`` is where the last epoch that began inside
    pass ``q`` began (0 if one began exactly at its end; inherited when no
    epoch began inside it). An epoch that runs from offset ``c`` of one pass
    into a later one thus ends, in its last pass, among samples it has not
    yet taken more often than the others: each sample is taken ``floor(k)``
    or ``ceil(k)`` times for a share of ``k`` passes.
    """

    def __init__(self, layout: WalkLayout):
        self.layout = layout
        self._restart()

    def _restart(self) -> None:
        layout = self.layout
        order = layout.first_order()
        counts = layout.counts[order]
        keep = counts > 0
        self.number = 0
        self.shards = order[keep]
        self.starts = np.zeros(int(keep.sum()), dtype=np.int64)
        self.stops = counts[keep].astype(np.int64)
        self.cut = 0
        self.epoch = 0  # epochs that began before this pass's start are behind

    def _advance(self) -> None:
        layout = self.layout
        size = layout.size
        begin, end = self.number * size, (self.number + 1) * size
        schedule, index = layout.schedule, layout.index
        # The last epoch that began inside (begin, end]: where it began.
        while schedule.offset(index, self.epoch + 1) <= end:
            if self.epoch >= schedule.stable_from and layout.length(self.epoch) == 0:
                break  # the stream gives nothing from here on
            self.epoch += 1
        boundary = schedule.offset(index, self.epoch)
        if boundary == end:
            self.cut = 0
        elif boundary > begin:
            self.cut = boundary - begin
        cut = self.cut
        shards, starts, stops = self.shards, self.starts, self.stops
        head = 0
        if cut > 0:
            lengths = stops - starts
            ends = np.cumsum(lengths)
            i = int(np.searchsorted(ends, cut, side="left"))  # the piece holding the cut's last sample
            if ends[i] != cut:  # the cut falls inside piece i: split it
                inner = int(starts[i] + cut - (ends[i] - lengths[i]))
                shards = np.insert(shards, i + 1, shards[i])
                starts = np.insert(starts, i + 1, inner)
                stops = np.insert(stops, i, inner)
            head = i + 1
        perm = layout.tail_order(self.number + 1, len(shards) - head)
        self.shards = np.concatenate((shards[:head], shards[head:][perm]))
        self.starts = np.concatenate((starts[:head], starts[head:][perm]))
        self.stops = np.concatenate((stops[:head], stops[head:][perm]))
        self.number += 1

    def get(self, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if number < self.number:
            self._restart()
        while self.number < number:
            self._advance()
        return self.shards, self.starts, self.stops


@dataclass(frozen=True, eq=False)
class WalkLayout:
    """The epochs of one stream of a mixture: windows of its walk (see the
    module docstring). An :class:`~shardkit.read.plan.EpochLayout`.

    Attributes:
        counts: Samples per shard of the stream.
        schedule: The mixture's shares.
        index: The stream's index in the schedule.
        seed: The reader's seed.
        tag: The stream's seed word (from its fingerprint, so it does not
            depend on where the stream sits in the list).
        shuffle: Permute the shards of each pass (else stored order).
    """

    counts: np.ndarray
    schedule: MixSchedule
    index: int
    seed: int
    tag: int
    shuffle: bool
    _passes: dict[str, _Passes] = field(default_factory=dict, init=False, repr=False)

    @property
    def stable_from(self) -> int:
        return self.schedule.stable_from

    @property
    def size(self) -> int:
        return int(self.counts.sum())

    def length(self, epoch: int) -> int:
        return self.schedule.shares(epoch)[self.index]

    def _rng(self, number: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(seed_sequence(self.seed, number, WALK_ORDER_DOMAIN, self.tag)))

    def first_order(self) -> np.ndarray:
        """Shard order of the walk's first pass."""
        if not self.shuffle:
            return np.arange(len(self.counts), dtype=np.int64)
        return self._rng(0).permutation(len(self.counts)).astype(np.int64)

    def tail_order(self, number: int, length: int) -> np.ndarray:
        """How pass ``number`` permutes the pieces after its kept head."""
        if not self.shuffle:
            return np.arange(length, dtype=np.int64)
        return self._rng(number).permutation(length).astype(np.int64)

    def pass_arrays(self, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pass ``number`` of the walk as arrays of pieces in order:
        shards, first samples, stops (no Python object per shard)."""
        # The walk is computed once, pass after pass, and shared by the
        # threads that read the stream's parts (each interleaved part's
        # read-ahead thread cuts its pieces from it): one at a time.
        with _WALKS:
            passes = self._passes.get("chain")
            if passes is None:
                passes = self._passes["chain"] = _Passes(self)
            return passes.get(number)

    def pass_pieces(self, number: int) -> list[Piece]:
        """Pass ``number`` of the walk, as pieces in order (for tests and
        inspection; the reader cuts :meth:`pass_arrays`)."""
        shards, starts, stops = self.pass_arrays(number)
        return [Piece(int(a), int(b), int(c)) for a, b, c in zip(shards, starts, stops)]

    def pieces(self, epoch: int, start: int, stop: int) -> Iterator[Piece]:
        length = self.length(epoch)
        if stop <= start:
            return
        if length == 0:
            raise UsageError(f"stream {self.index} has no samples in epoch {epoch}")
        base = self.schedule.offset(self.index, epoch)
        size = self.size
        pos = start
        while pos < stop:  # positions past the window wrap to its start (padding)
            at = pos % length
            take = min(length - at, stop - pos)
            walk, end = base + at, base + at + take
            while walk < end:
                number, first = divmod(walk, size)
                step = min(size - first, end - walk)
                yield from _cut(self.pass_arrays(number), first, first + step)
                walk += step
            pos += take


def _cut(arrays: tuple[np.ndarray, np.ndarray, np.ndarray], lo: int, hi: int) -> Iterator[Piece]:
    """Positions ``[lo, hi)`` of a pass's pieces (as arrays), as pieces."""
    shards, starts, stops = arrays
    ends = np.cumsum(stops - starts)
    i = int(np.searchsorted(ends, lo, side="right"))  # the piece holding position lo
    while i < len(shards) and lo < hi:
        begin = int(ends[i]) - int(stops[i] - starts[i])
        a = lo - begin
        b = min(hi, int(ends[i])) - begin
        yield Piece(int(shards[i]), int(starts[i]) + a, int(starts[i]) + b)
        lo = begin + b
        i += 1


def stream_tag(fingerprint: str) -> int:
    """A stream's seed word, from its dataset fingerprint."""
    return int(hashlib.sha256(fingerprint.encode()).hexdigest()[:8], 16)


# ----------------------------------------------------------- the schedule


def _placed_before(counts: Sequence[int], stream: int, k: np.ndarray) -> np.ndarray:
    """For items ``k`` of ``stream``, how many items of all streams come
    before them in the stratified order (their position)."""
    m_i = counts[stream]
    pos = k.copy()
    numer = (2 * k + 1)
    for j, m_j in enumerate(counts):
        if j == stream or m_j == 0:
            continue
        a = numer * m_j - m_i  # items of j with (2x+1) m_i < (or <=) (2k+1) m_j
        if j < stream:
            before = a // (2 * m_i) + 1
        else:
            before = -((-a) // (2 * m_i))
        pos += np.clip(before, 0, m_j)
    return pos


def _position(counts: Sequence[int], stream: int, k: int) -> int:
    return int(_placed_before(counts, stream, np.array([k], dtype=np.int64))[0])


def schedule_prefix(counts: Sequence[int], x: int) -> list[int]:
    """How many items of each stream the first ``x`` positions of the
    stratified order of ``counts`` hold."""
    out = []
    for i, m in enumerate(counts):
        lo, hi = 0, m  # the first k whose position is >= x
        while lo < hi:
            mid = (lo + hi) // 2
            if _position(counts, i, mid) < x:
                lo = mid + 1
            else:
                hi = mid
        out.append(lo)
    return out


def schedule_labels(counts: Sequence[int], *, start: int = 0) -> Iterator[int]:
    """The stream of each position of the stratified order of ``counts``
    (stream ``i`` has ``counts[i]`` items), from position ``start`` on."""
    counts = [int(c) for c in counts]
    total = sum(counts)
    at = start
    before = schedule_prefix(counts, at)
    while at < total:
        stop = min(at + _LABEL_BLOCK, total)
        after = schedule_prefix(counts, stop)
        labels = np.empty(stop - at, dtype=np.int64)
        for i in range(len(counts)):
            k = np.arange(before[i], after[i], dtype=np.int64)
            labels[_placed_before(counts, i, k) - at] = i
        yield from labels.tolist()
        at, before = stop, after


def split_count(epochs: Iterator[list[int]], count: int) -> list[int] | None:
    """Per stream, how many of a slot's first ``count`` samples it gave,
    the slot's per-epoch counts being ``epochs``; None if the slot has
    fewer than ``count`` samples."""
    out: list[int] | None = None
    left = count
    for counts in epochs:
        if out is None:
            out = [0] * len(counts)
        total = sum(counts)
        take = counts if left >= total else schedule_prefix(counts, left)
        out = [a + b for a, b in zip(out, take)]
        left -= min(left, total)
        if left == 0:
            return out
    return out if left == 0 and out is not None else None
