"""Property tests for the window sampler: coverage, balance, locality, mixing."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import UsageError
from shardkit.read.sampler import (
    ShardWindowSampler,
    epoch_window_sequence,
    rank_window_indices,
    samples_per_rank_padded,
)
from shardkit.read.shuffle import shuffle_quality
from shardkit.read.split import shard_permutation

counts_st = st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=12)
window_st = st.integers(min_value=1, max_value=5)
ranks_st = st.integers(min_value=1, max_value=5)
seed_st = st.integers(min_value=0, max_value=2**32)
epoch_st = st.integers(min_value=0, max_value=20)


def rank_list(counts, **kw) -> list[int]:
    return [i for chunk in rank_window_indices(counts, **kw) for i in chunk.tolist()]


@given(counts=counts_st, window=window_st, seed=seed_st, epoch=epoch_st)
def test_epoch_sequence_is_a_permutation_of_all_samples(counts, window, seed, epoch):
    seq = epoch_window_sequence(counts, window_shards=window, seed=seed, epoch=epoch)
    assert sorted(seq.tolist()) == list(range(sum(counts)))
    again = epoch_window_sequence(counts, window_shards=window, seed=seed, epoch=epoch)
    assert seq.tolist() == again.tolist()


@given(counts=counts_st, window=window_st, seed=seed_st, epoch=epoch_st)
def test_windows_follow_the_shard_order_and_hold_whole_shards(counts, window, seed, epoch):
    starts = np.concatenate([[0], np.cumsum(counts)])
    seq = epoch_window_sequence(counts, window_shards=window, seed=seed, epoch=epoch)
    shard_of = (np.searchsorted(starts, seq, side="right") - 1).tolist()
    order = shard_permutation(len(counts), seed=seed, epoch=epoch).tolist()
    pos = 0
    for w in range(0, len(order), window):
        shards = order[w : w + window]
        size = sum(counts[s] for s in shards)
        assert sorted(shard_of[pos : pos + size]) == sorted(s for s in shards for _ in range(counts[s]))
        pos += size
    assert pos == len(seq)


@given(counts=counts_st, window=window_st, seed=seed_st, epoch=epoch_st, world_size=ranks_st, drop_last=st.booleans())
@settings(max_examples=150)
def test_ranks_get_equal_counts_and_cover_every_index_once(counts, window, seed, epoch, world_size, drop_last):
    total = sum(counts)
    per = samples_per_rank_padded(total, world_size=world_size, drop_last=drop_last)
    kw = dict(window_shards=window, seed=seed, epoch=epoch, world_size=world_size, drop_last=drop_last)
    shares = [rank_list(counts, rank=r, **kw) for r in range(world_size)]
    assert all(len(share) == per for share in shares)
    together = [i for share in shares for i in share]
    seq = epoch_window_sequence(counts, window_shards=window, seed=seed, epoch=epoch).tolist()
    if drop_last:
        assert together == seq[: per * world_size]
        assert len(set(together)) == len(together)
    else:
        # Every index once, then the padding repeats the start of the sequence.
        assert Counter(together[:total]) == Counter(range(total))
        assert together[total:] == [seq[i % total] for i in range(per * world_size - total)] if total else True


def test_sampler_matches_the_pure_functions_and_changes_with_epoch():
    counts = [5, 3, 0, 8, 6, 4]
    sampler = ShardWindowSampler(counts, window_shards=2, seed=4, rank=1, world_size=2)
    first = list(sampler)
    assert len(first) == len(sampler) == 13
    assert first == rank_list(counts, window_shards=2, seed=4, epoch=0, rank=1, world_size=2)
    sampler.set_epoch(1)
    assert list(sampler) != first


def test_sampler_refuses_bad_options():
    with pytest.raises(UsageError, match="window_shards"):
        ShardWindowSampler([1, 2], window_shards=0, rank=0, world_size=1)
    with pytest.raises(UsageError, match="rank 2 is not within world_size 2"):
        ShardWindowSampler([1, 2], rank=2, world_size=2)
    with pytest.raises(UsageError, match="epoch"):
        ShardWindowSampler([1, 2], rank=0, world_size=1).set_epoch(-1)


def test_window_shuffle_quality_between_sequential_and_iid():
    num_shards, per_shard, num_classes, batch = 64, 100, 16, 32
    counts = [per_shard] * num_shards

    def quality(labels, window):
        seq = epoch_window_sequence(counts, window_shards=window, seed=0, epoch=0)
        return shuffle_quality(labels[seq], batch_size=batch)

    # Worst case for locality: each shard holds one class. A batch then mixes
    # at most the window's classes, so mixing improves with the window.
    sorted_labels = np.repeat(np.arange(num_shards) % num_classes, per_shard)
    sequential = shuffle_quality(sorted_labels, batch_size=batch)
    q = {w: quality(sorted_labels, w) for w in (1, 4, 8, 16, 32)}
    assert q[32] < q[16] < q[8] < q[4] < q[1] <= sequential
    assert q[16] < 0.6 * sequential and q[32] < 1.4
    # Shards written shuffled (what `shardkit write` does by default) but
    # in class-sorted order within each shard: a window of 4 is as mixed as i.i.d.
    rng = np.random.default_rng(1)
    written = np.concatenate([np.sort(rng.integers(0, num_classes, per_shard)) for _ in range(num_shards)])
    assert shuffle_quality(written, batch_size=batch) > 2.0
    assert quality(written, 4) < 1.15
