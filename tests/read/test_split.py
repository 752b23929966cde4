"""Property tests for the epoch plan: permutation and rank x worker split."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import UsageError
from shardkit.read.split import (
    assign_shards,
    even_cut,
    iter_pieces,
    plan_epoch,
    rank_span,
    samples_per_rank,
    shard_permutation,
)
from shardkit.world import World

counts_st = st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=10)
ranks_st = st.integers(min_value=1, max_value=5)
workers_st = st.integers(min_value=1, max_value=4)
seed_st = st.integers(min_value=0, max_value=2**32)
epoch_st = st.integers(min_value=0, max_value=50)


def _slots(world_size: int, num_workers: int):
    for rank in range(world_size):
        for worker in range(num_workers):
            yield World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)


def _samples(pieces) -> list[tuple[int, int]]:
    return [(p.shard, i) for p in pieces for i in range(p.start, p.stop)]


def _per_rank(counts, world_size, num_workers, **kw) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {r: [] for r in range(world_size)}
    for world in _slots(world_size, num_workers):
        out[world.rank] += _samples(plan_epoch(counts, world, **kw))
    return out


@given(num_shards=st.integers(0, 200), seed=seed_st, epoch=epoch_st)
def test_shard_permutation_is_a_pure_permutation(num_shards, seed, epoch):
    order = shard_permutation(num_shards, seed=seed, epoch=epoch)
    assert sorted(order.tolist()) == list(range(num_shards))
    assert order.tolist() == shard_permutation(num_shards, seed=seed, epoch=epoch).tolist()


def test_shard_permutation_changes_with_epoch_and_seed():
    base = shard_permutation(50, seed=1, epoch=0).tolist()
    assert base != shard_permutation(50, seed=1, epoch=1).tolist()
    assert base != shard_permutation(50, seed=2, epoch=0).tolist()


@given(length=st.integers(0, 1000), parts=st.integers(1, 40))
def test_even_cut_tiles_the_range_with_sizes_within_one(length, parts):
    spans = [even_cut(length, parts, i) for i in range(parts)]
    assert spans[0][0] == 0 and spans[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    sizes = [hi - lo for lo, hi in spans]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=200)
@given(counts=counts_st, world_size=ranks_st, num_workers=workers_st, seed=seed_st, epoch=epoch_st, shuffle=st.booleans())
def test_exact_reads_every_sample_once_with_rank_counts_within_one(counts, world_size, num_workers, seed, epoch, shuffle):
    per_rank = _per_rank(counts, world_size, num_workers, seed=seed, epoch=epoch, mode="exact", shuffle=shuffle)
    everything = [s for samples in per_rank.values() for s in samples]
    expected = [(shard, i) for shard, n in enumerate(counts) for i in range(n)]
    assert sorted(everything) == expected
    sizes = [len(v) for v in per_rank.values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=200)
@given(counts=counts_st, world_size=ranks_st, num_workers=workers_st, seed=seed_st, epoch=epoch_st)
def test_balanced_gives_equal_rank_counts_and_drops_under_world_size(counts, world_size, num_workers, seed, epoch):
    total = sum(counts)
    per_rank = _per_rank(counts, world_size, num_workers, seed=seed, epoch=epoch, mode="balanced")
    assert {len(v) for v in per_rank.values()} == {total // world_size}
    everything = [s for samples in per_rank.values() for s in samples]
    assert len(set(everything)) == len(everything)  # no sample twice
    assert total - len(everything) < world_size


@settings(max_examples=200)
@given(counts=counts_st, world_size=ranks_st, num_workers=workers_st, seed=seed_st, epoch=epoch_st)
def test_balanced_pad_gives_equal_counts_covering_every_sample(counts, world_size, num_workers, seed, epoch):
    total = sum(counts)
    per_rank = _per_rank(counts, world_size, num_workers, seed=seed, epoch=epoch, mode="balanced", pad=True)
    assert {len(v) for v in per_rank.values()} == {-(-total // world_size)}
    everything = Counter(s for samples in per_rank.values() for s in samples)
    assert len(everything) == total  # every sample at least once
    assert sum(everything.values()) - total < world_size


@given(counts=counts_st, world_size=ranks_st, num_workers=workers_st, seed=seed_st, epoch=epoch_st)
def test_each_slot_reads_a_contiguous_run_of_the_epoch_sequence(counts, world_size, num_workers, seed, epoch):
    order = shard_permutation(len(counts), seed=seed, epoch=epoch)
    sequence = [(int(shard), i) for shard in order for i in range(counts[shard])]
    position = {s: p for p, s in enumerate(sequence)}
    for world in _slots(world_size, num_workers):
        pieces = list(plan_epoch(counts, world, seed=seed, epoch=epoch, mode="exact"))
        assert all(p.num_samples > 0 for p in pieces)
        positions = [position[s] for s in _samples(pieces)]
        assert positions == list(range(positions[0], positions[0] + len(positions))) if positions else True


def test_fewer_shards_than_slots_still_splits_at_sample_precision():
    counts = [5, 4]  # 2 shards, 8 slots
    per_rank = _per_rank(counts, 4, 2, seed=0, epoch=0, mode="exact")
    assert sorted(len(v) for v in per_rank.values()) == [2, 2, 2, 3]
    assert all(per_rank.values())  # every rank has work


def test_rank_counts_helpers_agree_with_spans():
    assert samples_per_rank(10, rank=0, world_size=3, mode="exact") == 4
    assert samples_per_rank(10, rank=2, world_size=3, mode="balanced") == 3
    assert samples_per_rank(10, rank=2, world_size=3, mode="balanced", pad=True) == 4
    with pytest.raises(UsageError, match="mode must be one of"):
        rank_span(10, rank=0, world_size=1, mode="sometimes")  # type: ignore[arg-type]


def test_padding_wraps_around_the_epoch_sequence():
    pieces = list(iter_pieces([2, 1], np.array([1, 0]), 2, 6))
    assert _samples(pieces) == [(0, 1), (1, 0), (0, 0), (0, 1)]


@given(num_shards=st.integers(1, 40), world_size=ranks_st, num_workers=workers_st, seed=seed_st, epoch=epoch_st)
def test_assign_shards_deals_each_shard_to_one_slot(num_shards, world_size, num_workers, seed, epoch):
    dealt = [
        int(s)
        for world in _slots(world_size, num_workers)
        for s in assign_shards(num_shards, world, seed=seed, epoch=epoch)
    ]
    assert sorted(dealt) == list(range(num_shards))


def test_negative_seed_is_refused():
    with pytest.raises(UsageError, match="seed and epoch must be >= 0"):
        shard_permutation(3, seed=-1, epoch=0)


@given(counts=counts_st, world_size=ranks_st, num_workers=workers_st, num_parts=st.integers(1, 4), seed=seed_st)
def test_parts_of_a_slot_tile_its_share(counts, world_size, num_workers, num_parts, seed):
    for world in _slots(world_size, num_workers):
        whole = _samples(plan_epoch(counts, world, seed=seed, epoch=0, mode="exact"))
        parts = [
            _samples(plan_epoch(counts, world, seed=seed, epoch=0, mode="exact", part=p, num_parts=num_parts))
            for p in range(num_parts)
        ]
        assert [s for part in parts for s in part] == whole
