"""ReadPlan: the per-epoch plan as a pure function of counts, options and world."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit import ShardDataset
from shardkit.errors import UsageError
from shardkit.read.options import ReaderOptions
from shardkit.read.plan import ReadPlan, check_infinite
from shardkit.world import World


def _slots(world_size: int, num_workers: int) -> list[World]:
    return [
        World(rank=r, world_size=world_size, worker=w, num_workers=num_workers)
        for r, w in itertools.product(range(world_size), range(num_workers))
    ]


def _samples(plan: ReadPlan, world: World, epoch: int) -> list[tuple[int, int]]:
    out = []
    for part in range(plan.options.interleave):
        out += [(p.shard, i) for p in plan.pieces(world, epoch=epoch, part=part) for i in range(p.start, p.stop)]
    return out


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 3),
    interleave=st.integers(1, 3),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 3),
)
def test_exact_plan_reads_every_sample_once_over_all_slots_and_streams(
    counts, world_size, num_workers, interleave, seed, epoch
):
    plan = ReadPlan(np.array(counts), len(counts), ReaderOptions(mode="exact", seed=seed, interleave=interleave))
    seen = Counter(s for world in _slots(world_size, num_workers) for s in _samples(plan, world, epoch))
    assert seen == Counter((shard, i) for shard, n in enumerate(counts) for i in range(n))


def test_without_counts_whole_shards_are_dealt_once_per_epoch():
    plan = ReadPlan(None, 7, ReaderOptions(mode="exact", seed=2, interleave=2))
    shards = [p.shard for world in _slots(2, 2) for part in range(2) for p in plan.pieces(world, epoch=1, part=part)]
    assert sorted(shards) == list(range(7))
    assert plan.num_samples is None and plan.samples_per_rank(World()) is None


def test_plan_is_what_the_dataset_reads(make_shards):
    manifest = make_shards([6, 0, 4, 5])
    ds = ShardDataset(manifest, mode="exact", seed=3, buffer_size=0, rank=1, world_size=2)
    world = World(rank=1, world_size=2)
    keys = [s["__key__"] for s in ds.iter_slot(world, epoch=2)]
    assert keys == [f"s{shard:03d}_{i:05d}" for shard, i in _samples(ds.plan, world, 2)]
    assert len(ds) == ds.plan.samples_per_rank(world) == len(keys)


def test_shuffle_buffer_is_seeded_by_slot_and_epoch_and_absent_without_shuffling():
    options = ReaderOptions(mode="exact", seed=1, buffer_size=4)
    plan = ReadPlan(np.array([5, 5]), 2, options)

    def order(world: World, epoch: int) -> list[int]:
        buffer = plan.shuffle_buffer(world, epoch=epoch, nbytes=lambda item: 1)
        assert buffer is not None
        return list(buffer.shuffle(range(20)))

    assert order(World(), 0) == order(World(), 0)
    assert order(World(), 0) != order(World(), 1)
    assert order(World(), 0) != order(World(worker=1, num_workers=2), 0)
    no_buffer = ReadPlan(np.array([5]), 1, ReaderOptions(mode="exact", buffer_size=1))
    assert no_buffer.shuffle_buffer(World(), epoch=0, nbytes=lambda item: 1) is None


def test_infinite_plan_needs_a_sample_per_read_part():
    plan = ReadPlan(np.array([2, 1]), 2, ReaderOptions(mode="infinite", interleave=2))
    with pytest.raises(UsageError, match="at least one sample per slot and read part: 3 samples"):
        check_infinite([plan], World(rank=0, world_size=2), epoch=0)
    check_infinite([plan], World(rank=0, world_size=1), epoch=0)  # 3 samples for 2 parts
