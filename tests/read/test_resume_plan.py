"""The pure parts of resume: buffer replay, skipping, interleave, sequences."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.read.resume import EpochSequence, resident_runs, round_robin
from shardkit.read.shuffle import ShuffleBuffer
from shardkit.read.split import Piece, skip_samples


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
