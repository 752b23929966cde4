"""The pure parts of resume: buffer replay, skipping, interleave, sequences,
infinite-mode remainders."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardkit.read.plan import DatasetLayout
from shardkit.read.resume.elastic import EpochSequence, LevelPlan, remainder
from shardkit.read.resume.replay import SlotReplay, resident_runs
from shardkit.read.resume.state import Level
from shardkit.read.shuffle import ShuffleBuffer, round_robin
from shardkit.read.split import Piece, part_span, skip_samples
from shardkit.world import World


def _buffer(size: int, max_bytes: int | None, seed: int) -> ShuffleBuffer[int]:
    return ShuffleBuffer(
        size=size,
        rng=np.random.default_rng(seed),
        max_bytes=max_bytes,
        nbytes=(lambda item: item % 7 + 1) if max_bytes is not None else None,
    )


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 120),
    size=st.integers(0, 20),
    max_bytes=st.one_of(st.none(), st.integers(1, 60)),
    cut=st.integers(0, 130),
    seed=st.integers(0, 5),
)
def test_advance_then_shuffle_the_rest_equals_one_shuffle(n, size, max_bytes, cut, seed):
    whole = list(_buffer(size, max_bytes, seed).shuffle(range(n)))
    buffer = _buffer(size, max_bytes, seed)
    items = iter(range(n))
    resident, held, taken = buffer.advance(items, cut)
    assert taken <= n
    rest = list(buffer.shuffle(items, resident=resident, held=held))
    assert whole[: min(cut, n)] + rest == whole


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), max_size=8), skip=st.integers(0, 40))
def test_skip_samples_drops_exactly_the_first_samples(sizes, skip):
    pieces = [Piece(i, 1, 1 + n) for i, n in enumerate(sizes)]
    flat = [(p.shard, j) for p in pieces for j in range(p.start, p.stop)]
    kept = [(p.shard, j) for p in skip_samples(iter(pieces), skip) for j in range(p.start, p.stop)]
    assert kept == flat[skip:]
    assert all(p.num_samples > 0 for p in skip_samples(iter(pieces), skip))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 5), min_size=1, max_size=4), cut=st.integers(0, 20))
def test_round_robin_continues_from_any_point(lengths, cut):
    def streams(done=None):
        out = []
        for p, n in enumerate(lengths):
            start = 0 if done is None else done[p]
            out.append(iter([(p, i) for i in range(start, n)]))
        return out

    whole = list(round_robin(streams()))
    head = whole[:cut]
    done = [sum(1 for q, _ in head if q == p) for p in range(len(lengths))]
    first = head[-1][0] + 1 if head else 0
    assert head + list(round_robin(streams(done), first=first)) == whole


def test_sequence_slices_map_indices_to_positions_and_wrap():
    seq = EpochSequence(np.array([2, 10, 20]), np.array([5, 12, 21]))  # positions 2 3 4 10 11 20
    assert len(seq) == 6
    assert seq.slice(1, 5) == [(3, 5), (10, 12)]
    assert seq.slice(5, 8) == [(20, 21), (2, 4)]  # past the end wraps (padding)
    assert seq.slice(3, 3) == []


def test_resident_runs_merge_close_samples_only():
    sizes = np.full(100, 1000)
    resident = [(0, -1, 4, i, 1000) for i in (3, 4, 5, 9, 60)]
    assert resident_runs(resident, lambda shard: sizes, gap_bytes=4000) == {4: [(3, 10), (60, 61)]}
    assert resident_runs(resident, lambda shard: sizes, gap_bytes=0) == {4: [(3, 6), (9, 10), (60, 61)]}


def test_sequence_whole_is_the_full_epoch():
    seq = EpochSequence.whole(9)
    assert seq.full and len(seq) == 9
    assert list(itertools.chain(seq.slice(7, 11))) == [(7, 9), (0, 2)]


@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(2, 40),
    length=st.one_of(st.none(), st.integers(0, 300)),
    num_out=st.integers(0, 320),
    seed=st.integers(0, 5),
)
def test_vectorized_advance_matches_the_step_by_step_one(size, length, num_out, seed):
    slow = _buffer(size, None, seed)
    items = iter(range(10**9) if length is None else range(length))
    resident, _, taken = slow.advance(items, num_out)
    fast = _buffer(size, None, seed)
    assert fast.advance_indices(length=length, num_out=num_out) == (resident, taken)
    # Both leave the generator at the same point.
    assert [slow._uniform() for _ in range(3)] == [fast._uniform() for _ in range(3)]


def _positions_of(seq: EpochSequence) -> list[int]:
    return [p for a, b in seq.slice(0, len(seq)) for p in range(a, b)]


@st.composite
def _infinite_level(draw, plan: LevelPlan, num_parts: int):
    """A topology and, per slot, per read stream, what it consumed (up to
    three whole epochs' worth) and which of those items a buffer still holds."""
    world_size = draw(st.integers(1, 3))
    num_workers = draw(st.integers(1, 2))
    assume(plan.layout.length(plan.epoch) >= world_size * num_workers * num_parts)
    replays = {}
    per_stream = plan.layout.length(plan.epoch) // (world_size * num_workers * num_parts) + 1
    for rank in range(world_size):
        for worker in range(num_workers):
            consumed = [draw(st.integers(0, 3 * per_stream + 4)) for _ in range(num_parts)]
            held = []
            for part, n in enumerate(consumed):
                items = draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=3))
                held += [(part, i, 0, 0, 0) for i in sorted(items) if i < n]
            replays[rank, worker] = SlotReplay(consumed=consumed, next_part=0, resident=held, held=0, buffer=None)
    return Level(world_size, num_workers, ((0,) * num_workers,) * world_size), replays


def _model_remainder(plan: LevelPlan, level: Level, replays, num_parts: int) -> list[list[int]]:
    """Per epoch from ``plan.epoch``: the positions not delivered, by listing
    every read stream's positions one by one."""
    delivered: set[tuple[int, int]] = set()
    last = len(plan.carried) - 1
    for (rank, worker), replay in replays.items():
        world = World(rank=rank, world_size=level.world_size, worker=worker, num_workers=level.num_workers)
        for part, consumed in enumerate(replay.consumed):
            stream: list[tuple[int, int]] = []
            k = 0
            while len(stream) < consumed:
                positions = _positions_of(plan.sequence(k))
                lo, hi = part_span(len(positions), world, mode="infinite", pad=False, part=part, num_parts=num_parts)
                stream += [(k, p) for p in positions[lo:hi]]
                k += 1
            held = {i for p, i, *_ in replay.resident if p == part}
            delivered.update(pos for i, pos in enumerate(stream[:consumed]) if i not in held)
            last = max([last] + [k for k, _ in stream[:consumed]])
    return [[p for p in _positions_of(plan.sequence(k)) if (k, p) not in delivered] for k in range(last + 1)]


@settings(max_examples=80, deadline=None)
@given(data=st.data(), total=st.integers(1, 40), num_parts=st.integers(1, 2), epoch=st.integers(0, 3))
def test_infinite_remainder_keeps_every_undelivered_position_of_each_epoch_once(data, total, num_parts, epoch):
    plan = LevelPlan.start(DatasetLayout(np.array([total]), 0, False), epoch=epoch, endless=True)
    for _ in range(2):  # two topology changes in a row
        level, replays = data.draw(_infinite_level(plan, num_parts))
        expected = _model_remainder(plan, level, replays, num_parts)
        skip = next((k for k, rest in enumerate(expected) if rest), len(expected))
        after = remainder(plan, level, replays, mode="infinite", pad=False, num_parts=num_parts)
        assert after.endless and after.layout.length(after.epoch) == total
        assert after.epoch == plan.epoch + skip
        assert [_positions_of(seq) for seq in after.carried] == expected[skip:]
        assert all(after.sequence(len(after.carried) + k).full for k in range(2))  # whole epochs follow
        plan = after
