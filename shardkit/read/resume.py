"""Mid-epoch checkpoints of the reader: the state format and the pure math.

A slot's stream is a pure function of (options, world, epoch): its plan
gives the samples it reads, in order, and its shuffle buffer is seeded from
``(seed, epoch, rank, worker)``. The position of a slot is therefore one
number, the samples that have come out of its shuffle buffer so far
(*delivered*). From that number, running the slot's plan and buffer over
sample *positions* (shard, sample number and stored size, which the offset
index gives without reading data) rebuilds how far each read stream got,
which samples the buffer holds and its random generator. Only the buffered
samples are read again, through the index, and reading goes on from there:
the same topology continues with the identical sequence.

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

The state is plain JSON data (no sample bytes), versioned by
:data:`STATE_VERSION` with the key names below.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import StateError
from shardkit.read.shuffle import ShuffleBuffer
from shardkit.read.split import Mode, Piece, even_cut, iter_pieces, rank_span
from shardkit.world import World

log = logging.getLogger(__name__)

#: Version of the state format; a state of another version is refused.
STATE_VERSION = 1

KEY_VERSION = "version"
KEY_FINGERPRINT = "fingerprint"
KEY_OPTIONS = "options"
KEY_EPOCH = "epoch"
KEY_LEVELS = "levels"
#: Keys of a state, exactly.
STATE_KEYS = frozenset({KEY_VERSION, KEY_FINGERPRINT, KEY_OPTIONS, KEY_EPOCH, KEY_LEVELS})

KEY_WORLD_SIZE = "world_size"
KEY_NUM_WORKERS = "num_workers"
KEY_DELIVERED = "delivered"
KEY_NEXT_WORKER = "next_worker"
#: Keys of one level, exactly.
LEVEL_KEYS = frozenset({KEY_WORLD_SIZE, KEY_NUM_WORKERS, KEY_DELIVERED, KEY_NEXT_WORKER})

#: Reader options a state depends on; all must match on restore.
OPTION_KEYS = ("mode", "seed", "shuffle", "buffer_size", "buffer_bytes", "pad", "interleave")

#: Buffered samples of one shard closer than this many bytes are read in one
#: request, reading the samples between them too.
RESIDENT_GAP_BYTES = 16 << 10

#: A position in a replayed stream: (part, item, shard, sample, stored bytes),
#: where ``item`` counts the samples of that part's stream before this one.
Position = tuple[int, int, int, int, int]


# --------------------------------------------------------------- the format


@dataclass(frozen=True)
class Level:
    """One topology's progress through an epoch.

    Attributes:
        world_size: Ranks of this level.
        num_workers: DataLoader workers per rank (1 for in-process loading).
        delivered: Per rank, per worker: samples out of that slot's shuffle
            buffer; None where this state does not know (a rank-local state
            holds only its own rank).
        next_worker: Per rank, the worker whose batch the loader would have
            handed out next (so a resumed in-order loader keeps the order
            across workers); None where unknown.
    """

    world_size: int
    num_workers: int
    delivered: tuple[tuple[int | None, ...] | None, ...]
    next_worker: tuple[int | None, ...] = ()

    def first_worker(self, rank: int) -> int:
        """The worker a resumed loader of ``rank`` takes its first batch from."""
        found = self.next_worker[rank] if rank < len(self.next_worker) else None
        return found or 0

    def count(self, rank: int, worker: int) -> int | None:
        """The delivered count of one slot, or None if unknown."""
        entry = self.delivered[rank]
        return None if entry is None else entry[worker]

    @property
    def complete(self) -> bool:
        """Whether every slot's count is known."""
        return all(entry is not None and None not in entry for entry in self.delivered)

    def to_dict(self) -> dict[str, Any]:
        return {
            KEY_WORLD_SIZE: self.world_size,
            KEY_NUM_WORKERS: self.num_workers,
            KEY_DELIVERED: [None if e is None else list(e) for e in self.delivered],
            KEY_NEXT_WORKER: list(self.next_worker) if self.next_worker else [None] * self.world_size,
        }


@dataclass(frozen=True)
class ReaderState:
    """A reader's position in an epoch (see the module docstring).

    Attributes:
        fingerprint: Identifies the dataset's content.
        options: The reader options in :data:`OPTION_KEYS`.
        epoch: The epoch being read.
        levels: Topologies that read parts of the epoch, oldest first; empty
            at the start of an epoch.
    """

    fingerprint: str
    options: Mapping[str, Any]
    epoch: int
    levels: tuple[Level, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-serializable form (what ``state_dict()`` returns)."""
        return {
            KEY_VERSION: STATE_VERSION,
            KEY_FINGERPRINT: self.fingerprint,
            KEY_OPTIONS: dict(self.options),
            KEY_EPOCH: self.epoch,
            KEY_LEVELS: [level.to_dict() for level in self.levels],
        }

    @classmethod
    def from_dict(cls, data: Any) -> ReaderState:
        """Parse and check a state produced by :meth:`to_dict`.

        Raises:
            StateError: Not a mapping, missing or extra keys, values of the
                wrong type or out of range, or another format version.
        """
        if not isinstance(data, Mapping):
            raise StateError(f"a reader state must be a mapping, not {type(data).__name__}")
        keys = set(data)
        if keys != STATE_KEYS:
            raise StateError(_key_problem("reader state", keys, STATE_KEYS))
        if data[KEY_VERSION] != STATE_VERSION:
            raise StateError(
                f"reader state version {data[KEY_VERSION]!r} is not supported "
                f"(this shardkit reads version {STATE_VERSION})"
            )
        fingerprint = data[KEY_FINGERPRINT]
        if not isinstance(fingerprint, str):
            raise StateError(f"reader state: 'fingerprint' must be a string, not {type(fingerprint).__name__}")
        options = data[KEY_OPTIONS]
        if not isinstance(options, Mapping) or set(options) != set(OPTION_KEYS):
            raise StateError(
                f"reader state: 'options' must be a mapping with keys {sorted(OPTION_KEYS)}, got {options!r}"
            )
        epoch = _int(data[KEY_EPOCH], "epoch")
        levels_data = data[KEY_LEVELS]
        if not isinstance(levels_data, list):
            raise StateError(f"reader state: 'levels' must be a list, not {type(levels_data).__name__}")
        levels = tuple(_parse_level(level, i) for i, level in enumerate(levels_data))
        for i, level in enumerate(levels[:-1]):
            if not level.complete:
                raise StateError(f"reader state: level {i} is not the last one but lacks some slots' counts")
        return cls(fingerprint=fingerprint, options=dict(options), epoch=epoch, levels=levels)


def _key_problem(what: str, keys: set[str], expected: frozenset[str]) -> str:
    missing = sorted(expected - keys)
    extra = sorted(keys - expected)
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"unexpected {extra}")
    return f"{what}: {', '.join(parts)}"


def _int(value: Any, name: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StateError(f"reader state: {name!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _parse_level(data: Any, index: int) -> Level:
    if not isinstance(data, Mapping):
        raise StateError(f"reader state: level {index} must be a mapping, not {type(data).__name__}")
    if set(data) != LEVEL_KEYS:
        raise StateError(_key_problem(f"reader state level {index}", set(data), LEVEL_KEYS))
    world_size = _int(data[KEY_WORLD_SIZE], f"levels[{index}].world_size", minimum=1)
    num_workers = _int(data[KEY_NUM_WORKERS], f"levels[{index}].num_workers", minimum=1)
    delivered = data[KEY_DELIVERED]
    if not isinstance(delivered, list) or len(delivered) != world_size:
        raise StateError(
            f"reader state: levels[{index}].delivered must be a list of {world_size} entries (one per rank)"
        )
    entries: list[tuple[int | None, ...] | None] = []
    for rank, entry in enumerate(delivered):
        if entry is None:
            entries.append(None)
            continue
        if not isinstance(entry, list) or len(entry) != num_workers:
            raise StateError(
                f"reader state: levels[{index}].delivered[{rank}] must be null or a list of {num_workers} counts"
            )
        entries.append(
            tuple(None if c is None else _int(c, f"levels[{index}].delivered[{rank}]") for c in entry)
        )
    next_worker = data[KEY_NEXT_WORKER]
    if not isinstance(next_worker, list) or len(next_worker) != world_size:
        raise StateError(f"reader state: levels[{index}].next_worker must be a list of {world_size} entries")
    for rank, worker in enumerate(next_worker):
        if worker is not None and (_int(worker, f"levels[{index}].next_worker[{rank}]") >= num_workers):
            raise StateError(f"reader state: levels[{index}].next_worker[{rank}] must be < {num_workers}")
    return Level(
        world_size=world_size, num_workers=num_workers, delivered=tuple(entries), next_worker=tuple(next_worker)
    )


def catalog_fingerprint(urls: Iterable[str], counts: Iterable[int], manifest_fingerprint: str | None) -> str:
    """What identifies a dataset in a state: the manifest's fingerprint, or
    for shards without a manifest a hash of their names and sample counts."""
    if manifest_fingerprint is not None:
        return manifest_fingerprint
    digest = hashlib.sha256()
    for url, count in zip(urls, counts):
        digest.update(f"{url.rsplit('/', 1)[-1]}\0{int(count)}\n".encode())
    return digest.hexdigest()


def check_compatible(state: ReaderState, *, fingerprint: str, options: Mapping[str, Any]) -> None:
    """Refuse a state from another dataset or with other reader options.

    Raises:
        StateError: Naming the mismatch.
    """
    if state.fingerprint != fingerprint:
        raise StateError(
            f"reader state is from another dataset: its manifest fingerprint is {state.fingerprint[:16]}..., "
            f"this dataset's is {fingerprint[:16]}... Restore it with the dataset it was saved from."
        )
    for key in OPTION_KEYS:
        if state.options[key] != options[key]:
            raise StateError(
                f"reader state was saved with {key}={state.options[key]!r} but this dataset has "
                f"{key}={options[key]!r}; create the dataset with the same {key} to resume"
            )


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine rank-local states (one per rank, as each rank's loader saves
    them) into one state that knows every slot, which resuming with a
    different world size or worker count needs.

    Raises:
        StateError: Malformed states, or states of different epochs,
            datasets, options or earlier levels.
    """
    parsed = [ReaderState.from_dict(s) for s in states]
    if not parsed:
        raise StateError("merge_states needs at least one state")
    first = parsed[0]
    if any(len(s.levels) == 0 for s in parsed):
        if all(len(s.levels) == 0 for s in parsed) and all(s.epoch == first.epoch for s in parsed):
            return first.to_dict()
        raise StateError("cannot merge a state at the start of an epoch with states in the middle of one")
    for other in parsed[1:]:
        for what, a, b in (
            ("fingerprint", first.fingerprint, other.fingerprint),
            ("options", dict(first.options), dict(other.options)),
            ("epoch", first.epoch, other.epoch),
            ("earlier levels", first.levels[:-1], other.levels[:-1]),
        ):
            if a != b:
                raise StateError(f"cannot merge reader states with different {what}: {a!r} vs {b!r}")
    last = first.levels[-1]
    merged: list[list[int | None] | None] = [None] * last.world_size
    turns: list[int | None] = [None] * last.world_size
    for state in parsed:
        level = state.levels[-1]
        if (level.world_size, level.num_workers) != (last.world_size, last.num_workers):
            raise StateError("cannot merge reader states of different world sizes or worker counts")
        for rank, entry in enumerate(level.delivered):
            if entry is None:
                continue
            if level.next_worker[rank] is not None:
                turns[rank] = level.next_worker[rank]
            slot = merged[rank]
            if slot is None:
                slot = merged[rank] = [None] * last.num_workers
            for worker, count in enumerate(entry):
                if count is None:
                    continue
                if slot[worker] is not None and slot[worker] != count:
                    raise StateError(
                        f"reader states disagree on rank {rank} worker {worker}: {slot[worker]} vs {count}"
                    )
                slot[worker] = count
    level = Level(
        world_size=last.world_size,
        num_workers=last.num_workers,
        delivered=tuple(None if e is None else tuple(e) for e in merged),
        next_worker=tuple(turns),
    )
    return ReaderState(first.fingerprint, first.options, first.epoch, first.levels[:-1] + (level,)).to_dict()


def rank_local_level(world: World, counts: Iterable[int | None], *, next_worker: int = 0) -> Level:
    """A level that knows one rank's workers' counts."""
    delivered: list[tuple[int | None, ...] | None] = [None] * world.world_size
    delivered[world.rank] = tuple(counts)
    turns: list[int | None] = [None] * world.world_size
    turns[world.rank] = next_worker
    return Level(
        world_size=world.world_size, num_workers=world.num_workers, delivered=tuple(delivered), next_worker=tuple(turns)
    )


def start_for(state: ReaderState, world: World) -> tuple[tuple[Level, ...], int]:
    """Where a slot starts when resuming ``state`` (in any mode).

    Returns:
        The levels before the slot's own (their remainder is what the slot's
        level splits) and the slot's delivered count within its level.

    Raises:
        StateError: The state lacks the slot's count (same topology), or
            lacks other slots' counts (another topology).
    """
    if not state.levels:
        return (), 0
    last = state.levels[-1]
    if (last.world_size, last.num_workers) == (world.world_size, world.num_workers):
        count = last.count(world.rank, world.worker)
        if count is None:
            raise StateError(
                f"reader state has no position for rank {world.rank}, worker {world.worker}: restore each rank "
                "from its own state, or from merge_states() of all ranks' states"
            )
        return state.levels[:-1], count
    if not last.complete:
        known = [r for r, e in enumerate(last.delivered) if e is not None]
        raise StateError(
            f"resuming with {world.world_size} ranks x {world.num_workers} workers a state saved with "
            f"{last.world_size} x {last.num_workers} needs every old rank's position, but this state holds "
            f"ranks {known}: combine all ranks' states with shardkit.read.resume.merge_states() "
            "(or gather_states() under torch.distributed)"
        )
    return state.levels, 0


# ---------------------------------------------------------- sequences


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


def sequence_pieces(
    seq: EpochSequence, counts: np.ndarray, order: np.ndarray, lo: int, hi: int
) -> Iterator[Piece]:
    """The pieces of indices ``[lo, hi)`` of a level's sequence."""
    for start, stop in seq.slice(lo, hi):
        yield from iter_pieces(counts, order, start, stop)


def part_range(length: int, world: World, *, mode: Mode, pad: bool, part: int, num_parts: int) -> tuple[int, int]:
    """Indices of a level's sequence that one read stream of a slot covers
    (the same cut as :func:`~shardkit.read.split.plan_epoch`)."""
    start, stop = rank_span(length, rank=world.rank, world_size=world.world_size, mode=mode, pad=pad)
    lo, hi = even_cut(stop - start, world.num_workers, world.worker)
    a, b = even_cut(hi - lo, num_parts, part)
    return start + lo + a, start + lo + b


@dataclass(frozen=True)
class LevelPlan:
    """What a level splits over its slots: a sequence per epoch from ``epoch`` on.

    Attributes:
        epoch: The epoch of the first sequence.
        carried: Sequences of the epochs ``epoch, epoch + 1, ...``. In
            ``"exact"`` and ``"balanced"`` mode exactly one (a level reads
            one epoch). In ``"infinite"`` mode the remainders an earlier
            level left, oldest first (none at the start of an iteration).
        total: Samples of a whole epoch.
        endless: Whole epochs follow the carried ones (``"infinite"``).
    """

    epoch: int
    carried: tuple[EpochSequence, ...]
    total: int
    endless: bool

    @classmethod
    def start(cls, total: int, *, epoch: int, endless: bool) -> LevelPlan:
        """The plan of an iteration that starts ``epoch`` afresh."""
        return cls(epoch, () if endless else (EpochSequence.whole(total),), total, endless)

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
        return EpochSequence.whole(self.total)


#: One epoch of a read stream: (k, lo, hi), indices [lo, hi) of plan.sequence(k).
Span = tuple[int, int, int]


def part_spans(plan: LevelPlan, world: World, *, mode: Mode, pad: bool, part: int, num_parts: int) -> Iterator[Span]:
    """The epochs one read stream of ``world``'s slot reads at a level, in
    order: per epoch ``(k, lo, hi)``, the indices of ``plan.sequence(k)`` it
    covers. Ends after the carried epochs unless the plan is endless; an
    endless stream with nothing to read in a whole epoch ends there too."""
    for k in itertools.count() if plan.endless else range(len(plan.carried)):
        lo, hi = part_range(len(plan.sequence(k)), world, mode=mode, pad=pad, part=part, num_parts=num_parts)
        if hi == lo and k >= len(plan.carried):
            return  # every whole epoch is as empty for this stream
        yield k, lo, hi


def consumed_spans(spans: Iterable[Span], consumed: int) -> list[Span]:
    """Where the first ``consumed`` samples of a read stream came from: per
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
        raise StateError(f"reader state: a read stream delivered {consumed} samples, more than its plan holds")
    return out


def item_indices(taken: list[Span], items: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Epoch ``k`` and sequence index of each item number of a read stream
    whose first items came from ``taken`` (see :func:`consumed_spans`)."""
    firsts = list(itertools.accumulate((stop - lo for _, lo, stop in taken), initial=0))
    for item in items:
        j = bisect.bisect_right(firsts, item) - 1
        assert 0 <= j < len(taken) and item < firsts[-1], "a buffered item lies outside what its stream read"
        k, lo, _ = taken[j]
        yield k, lo + item - firsts[j]


# ---------------------------------------------------------- replay


def round_robin(streams: list[Iterator[Any]], *, first: int = 0) -> Iterator[Any]:
    """One item from each stream in turn until all are done; the first round
    starts at stream ``first`` (to continue an interrupted interleave)."""
    active = list(streams)
    turn = list(streams[first:])
    try:
        while active:
            for stream in turn:
                try:
                    yield next(stream)
                except StopIteration:
                    active.remove(stream)
            turn = list(active)
    finally:
        for stream in streams:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # stop read-ahead threads


@dataclass
class SlotReplay:
    """A slot's state after its first ``count`` delivered samples.

    Attributes:
        consumed: Samples each read stream (part) had handed to the buffer.
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


PiecesFn = Callable[[int], Iterator[Piece]]
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
    """:func:`replay_slot` for one read stream and a count-only buffer:
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
        parts: Per read stream: its pieces, and how many samples it holds
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

    streams = [_positions(p, pieces, sizes) for p, (pieces, _) in enumerate(parts)]
    # One read stream needs no per-item counting: what was taken is its count.
    source = streams[0] if len(streams) == 1 else counted(round_robin(streams))
    resident: list[Position] = []
    held = 0
    if buffer is None:
        taken = sum(1 for _ in zip(range(count), source))
    else:
        resident, held, taken = buffer.advance(source, count)
    if len(streams) == 1:
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


# ---------------------------------------------------------- remainder


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
        num_parts: Read streams per slot (``interleave``).

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
        return LevelPlan(plan.epoch, tuple(rests), plan.total, endless=False)
    done = next((k for k, rest in enumerate(rests) if len(rest)), len(rests))
    return LevelPlan(plan.epoch + done, tuple(rests[done:]), plan.total, endless=True)


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


def gather_states(state: Mapping[str, Any]) -> dict[str, Any]:
    """Every rank's state merged into one (see :func:`merge_states`).

    A collective under ``torch.distributed``: call it on every rank at the
    same step. Returns ``state`` unchanged when not distributed.
    """
    from shardkit.world import all_gather_objects

    return merge_states(all_gather_objects(dict(state)))  # type: ignore[arg-type]
