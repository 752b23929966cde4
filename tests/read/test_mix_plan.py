"""The arithmetic of mixing (shares, walk, split, schedule), without I/O."""

from __future__ import annotations

import collections
import math
import sys
import threading

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from shardkit.errors import UsageError
from shardkit.read.schedule import (
    MixSchedule,
    Stream,
    WalkLayout,
    largest_remainder,
    schedule_labels,
    schedule_prefix,
    split_count,
)
from shardkit.read.slot import slot_epoch_counts
from shardkit.read.options import ReaderOptions
from shardkit.read.plan import ReadPlan
from shardkit.read.resume.elastic import LevelPlan
from shardkit.world import World

sizes_st = st.lists(st.integers(1, 60), min_size=1, max_size=4)


def _streams(weights) -> tuple[Stream, ...]:
    return tuple(Stream(f"s{i}", weight=w) for i, w in enumerate(weights))


def _layout(counts: np.ndarray, schedule: MixSchedule, index: int, *, seed: int = 3) -> WalkLayout:
    return WalkLayout(counts, schedule, index, seed, 1000 + index, True)


def _walk_samples(layout: WalkLayout, epoch: int, start: int, stop: int) -> list[tuple[int, int]]:
    return [(p.shard, i) for p in layout.pieces(epoch, start, stop) for i in range(p.start, p.stop)]


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 10_000), weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=6))
def test_largest_remainder_sums_exactly_and_stays_within_one_of_each_quota(total, weights):
    parts = largest_remainder(total, weights)
    assert sum(parts) == total
    whole = sum(weights)
    for part, weight in zip(parts, weights):
        assert abs(part - total * weight / whole) < 1 + 1e-9


@settings(max_examples=100, deadline=None)
@given(
    sizes=sizes_st,
    data=st.data(),
    spe=st.integers(1, 400),
)
def test_each_epoch_gives_every_stream_exactly_its_share(sizes, data, spe):
    weights = data.draw(st.lists(st.floats(0.05, 10), min_size=len(sizes), max_size=len(sizes)))
    schedule = MixSchedule(_streams(weights), tuple(sizes), samples_per_epoch=spe)
    for epoch in range(3):
        shares = schedule.shares(epoch)
        assert sum(shares) == spe
        assert shares == tuple(largest_remainder(spe, weights))
        assert schedule.offset(0, epoch) == epoch * shares[0]


def test_streams_asking_for_epoch_offsets_at_once_get_the_offsets_asked_alone():
    # Each stream's read-ahead thread asks its schedule where an epoch starts.
    # Two threads growing the offsets together once appended the same epoch
    # twice, shifting every later epoch: a mixture then read other samples
    # (1 run in ~200 of a recorded order).
    streams = (Stream("a", weight={0: 1.0, 2: 0.2}), Stream("b", weight=1.0))
    alone = MixSchedule(streams, (22, 13), samples_per_epoch=12)
    expected = [[alone.offset(s, e) for e in range(60)] for s in range(2)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as the interpreter can
    try:
        for _ in range(20):
            shared = MixSchedule(streams, (22, 13), samples_per_epoch=12)
            start = threading.Barrier(8)
            got: dict[int, list[int]] = {}

            def ask(thread: int) -> None:
                start.wait()
                got[thread] = [shared.offset(thread % 2, e) for e in range(60)]

            threads = [threading.Thread(target=ask, args=(t,)) for t in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(got[t] == expected[t % 2] for t in range(8))
    finally:
        sys.setswitchinterval(switch)


def test_a_schedule_steps_at_its_epochs_and_samples_take_their_count_first():
    streams = (Stream("a", weight={0: 1.0, 2: 3.0}), Stream("b", weight=1.0), Stream("c", samples=10))
    schedule = MixSchedule(streams, (100, 100, 5), samples_per_epoch=50)
    assert [schedule.shares(e) for e in range(4)] == [(20, 20, 10), (20, 20, 10), (30, 10, 10), (30, 10, 10)]
    assert schedule.stable_from == 2
    assert schedule.offset(0, 3) == 20 + 20 + 30
    # Without samples_per_epoch: the streams' sizes in total; without weights: shares by size.
    assert MixSchedule((Stream("a"), Stream("b")), (30, 10)).shares(0) == (30, 10)
    assert MixSchedule((Stream("a", samples=7), Stream("b", samples=3)), (30, 10)).shares(0) == (7, 3)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    weights=st.lists(st.floats(0.1, 10), min_size=4, max_size=4),
    spe=st.integers(1, 300),
)
def test_the_walk_takes_no_sample_twice_before_every_sample_was_taken_once(counts, weights, spe):
    """Over epochs of changing shares (a weight schedule), every window of
    ``size`` consecutive walk positions holds each sample once, and a share
    larger than the stream takes each sample floor(k) or ceil(k) times."""
    arr = np.array(counts, dtype=np.int64)
    size = int(arr.sum())
    assume(size > 0)
    schedule = MixSchedule(
        (Stream("x", weight=dict(enumerate(weights))), Stream("y", weight=1.0)), (size, 50), samples_per_epoch=spe
    )
    layout = _layout(arr, schedule, 0)
    walk: list[tuple[int, int]] = []
    for epoch in range(len(weights)):
        share = schedule.shares(epoch)[0]
        assert schedule.offset(0, epoch) == len(walk)
        got = _walk_samples(layout, epoch, 0, share)
        assert len(got) == share
        times = collections.Counter(got)
        if share >= size:
            assert set(times.values()) <= {share // size, -(-share // size)}
            assert len(times) == size
        else:
            assert set(times.values()) <= {1}
        walk += got
    for start in range(0, len(walk) - size + 1, size):  # each pass of the walk
        assert len(set(walk[start : start + size])) == size


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(0, 120), min_size=1, max_size=5), batch=st.integers(1, 70))
@example(counts=[4, 4, 4, 4, 113], batch=4)
def test_every_run_of_the_schedule_holds_each_stream_in_proportion(counts, batch):
    """The stated bound: in any ``batch`` consecutive positions, a stream's
    count is within 1 + p (S - 2) of batch * p, p = m_i / M, for S streams
    that have samples (within 1 for two). S / 2 + 1, stated before, fails
    for a large stream among 5 or more: counts=[4, 4, 4, 4, 113], batch=4."""
    total = sum(counts)
    assume(total > 0)
    labels = np.array(list(schedule_labels(counts)))
    assert len(labels) == total
    streams = len([c for c in counts if c])
    for i, m in enumerate(counts):
        mine = (labels == i).astype(np.int64)
        assert mine.sum() == m
        bound = 1 + m / total * max(streams - 2, 0)
        if total >= batch:
            windows = np.convolve(mine, np.ones(batch, dtype=np.int64), "valid")
            assert np.abs(windows - batch * m / total).max() <= bound + 1e-9
    x = total // 3
    assert schedule_prefix(counts, x) == [int((labels[:x] == i).sum()) for i in range(len(counts))]
    assert list(schedule_labels(counts, start=x)) == labels[x:].tolist()


MODES = [("exact", False), ("balanced", False), ("balanced", True)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 80), min_size=2, max_size=3),
    data=st.data(),
    world_size=st.integers(1, 4),
    num_workers=st.integers(1, 3),
    mode_pad=st.sampled_from(MODES),
)
def test_the_mixed_epoch_splits_over_ranks_and_workers_like_one_epoch(sizes, data, world_size, num_workers, mode_pad):
    """Per stream: ``exact`` hands every drawn sample to one slot; ``balanced``
    gives every rank the same count (dropping fewer than world_size samples
    of each stream, or padding). Every batch of a slot holds each stream
    within the schedule's bound of the stream's share."""
    mode, pad = mode_pad
    weights = data.draw(st.lists(st.floats(0.1, 5), min_size=len(sizes), max_size=len(sizes)))
    spe = data.draw(st.integers(world_size * num_workers, 300))
    shard_counts = [np.array([n // 2, n - n // 2], dtype=np.int64) for n in sizes]
    schedule = MixSchedule(_streams(weights), tuple(sizes), samples_per_epoch=spe)
    options = ReaderOptions(mode=mode, seed=2, pad=pad, buffer_size=4)
    epoch = data.draw(st.integers(0, 3))
    shares = schedule.shares(epoch)
    plans = [
        ReadPlan(c, 2, options, layout=_layout(c, schedule, i), seed_tag=(i,)) for i, c in enumerate(shard_counts)
    ]
    per_rank = collections.Counter()
    got: list[collections.Counter] = [collections.Counter() for _ in sizes]
    for rank in range(world_size):
        for worker in range(num_workers):
            world = World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
            levels = [LevelPlan.start(p.layout, epoch=epoch, endless=False) for p in plans]
            (slot_counts,) = list(slot_epoch_counts(levels, world, options))
            for i, plan in enumerate(plans):
                samples = [(p.shard, k) for p in plan.pieces(world, epoch=epoch) for k in range(p.start, p.stop)]
                assert len(samples) == slot_counts[i]
                got[i].update(samples)
            per_rank[rank] += sum(slot_counts)
            labels = np.array(list(schedule_labels(slot_counts)), dtype=np.int64)
            for i in range(len(sizes)):
                mine = (labels == i).astype(np.int64)
                if len(labels) >= 8:
                    windows = np.convolve(mine, np.ones(8, dtype=np.int64), "valid")
                    bound = 1 if len(sizes) == 2 else len(sizes) / 2 + 1
                    assert np.abs(windows - 8 * slot_counts[i] / len(labels)).max() <= bound + 1e-9
    for i, share in enumerate(shares):
        window = collections.Counter(_walk_samples(plans[i].layout, epoch, 0, share))
        if mode == "exact":
            assert got[i] == window
        elif not pad:
            assert not got[i] - window and share - sum(got[i].values()) < world_size
        else:
            assert set(got[i]) == set(window)
    if mode == "balanced":
        assert len(set(per_rank.values())) == 1
    else:
        assert max(per_rank.values()) - min(per_rank.values()) <= len(sizes)


@given(counts=st.lists(st.integers(0, 50), min_size=1, max_size=4), data=st.data())
def test_split_count_inverts_the_schedule_over_epochs(counts, data):
    epochs = [counts, [c // 2 for c in counts]]
    total = sum(map(sum, epochs))
    count = data.draw(st.integers(0, total))
    labels = [label for e in epochs for label in schedule_labels(e)]
    expected = [labels[:count].count(i) for i in range(len(counts))]
    assert split_count(iter(epochs), count) == expected
    assert split_count(iter(epochs), total + 1) is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"weight": 0}, "not a positive finite number"),
        ({"weight": -1.0}, "not a positive finite number"),
        ({"weight": math.inf}, "not a positive finite number"),
        ({"weight": math.nan}, "not a positive finite number"),
        ({"weight": {3: 1.0}}, "must say the weight of epoch 0"),
        ({"weight": {0: 1.0, 2: 0.0}}, "epoch 2: weight 0.0"),
        ({"weight": True}, "a positive number"),
        ({"weight": 1.0, "samples": 10}, "either weight= or samples="),
        ({"samples": 0}, "samples must be an int >= 1"),
    ],
)
def test_bad_stream_arguments_are_refused_naming_the_stream(kwargs, message):
    with pytest.raises(UsageError, match=message) as info:
        Stream("data/web", name="web", **kwargs)
    assert "stream 'web'" in str(info.value)


@pytest.mark.parametrize(
    "streams,spe,message",
    [
        ((Stream("a", weight=1.0), Stream("b")), None, "stream 'b' has neither weight= nor samples="),
        ((Stream("a", samples=5), Stream("b", samples=5)), 12, "add up to 10, not samples_per_epoch=12"),
        ((Stream("a", samples=50), Stream("b", weight=1.0)), 12, "more than samples_per_epoch=12"),
        ((Stream("a", weight=1.0),), 0, "samples_per_epoch must be an int > 0"),
        ((Stream("a", weight=1.0),), -5, "samples_per_epoch must be an int > 0"),
    ],
)
def test_bad_mixtures_are_refused(streams, spe, message):
    with pytest.raises(UsageError, match=message):
        MixSchedule(streams, tuple(10 for _ in streams), samples_per_epoch=spe)


def test_a_pass_asked_again_after_later_ones_is_the_same_pass():
    counts = np.array([4, 0, 7, 3], dtype=np.int64)
    schedule = MixSchedule((Stream("x", weight=1.0), Stream("y", weight=2.0)), (14, 50), samples_per_epoch=17)
    fresh = [_layout(counts, schedule, 0).pass_pieces(n) for n in range(8)]
    layout = _layout(counts, schedule, 0)
    assert [layout.pass_pieces(n) for n in (7, 2, 5, 0, 3)] == [fresh[n] for n in (7, 2, 5, 0, 3)]
    for pieces in fresh:  # each pass covers every sample once
        samples = sorted((p.shard, i) for p in pieces for i in range(p.start, p.stop))
        assert samples == [(s, i) for s, n in enumerate(counts) for i in range(n)]


def test_a_walk_read_by_several_threads_at_once_gives_each_the_same_passes():
    # Each interleaved read part cuts its pieces from its stream's walk in its
    # own read-ahead thread; the walk is computed pass after pass and shared.
    import sys
    import threading

    counts = np.array([7, 3, 9, 5, 8, 2, 6, 4] * 4)
    schedule = MixSchedule(_streams([0.7, 0.3]), (int(counts.sum()), 50), samples_per_epoch=37)
    expected = {n: _layout(counts, schedule, 0).pass_arrays(n) for n in range(12)}
    shared = _layout(counts, schedule, 0)
    wrong: list[int] = []

    def read(numbers: list[int]) -> None:
        for n in numbers:
            got = shared.pass_arrays(n)
            if not all(np.array_equal(a, b) for a, b in zip(got, expected[n])):
                wrong.append(n)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=read, args=([*range(12), *range(11, -1, -1)] * 20,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
