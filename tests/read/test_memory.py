"""Per-worker memory does not grow with the dataset: a 1,000,000-sample manifest.

The big dataset is 100 links to one real 10,000-sample shard (and its index),
so it costs ~10 MB of disk but is, to the reader, a million samples.
"""

from __future__ import annotations

import itertools
import os
import tracemalloc

import pytest

from shardkit import Manifest, ShardDataset, ShardEntry
from shardkit.io.base import SourceOptions
from shardkit.world import World
from shardkit.write.shard import ShardFile, WrittenShard

PER_SHARD = 10_000


@pytest.fixture(scope="module")
def base_shard(tmp_path_factory) -> WrittenShard:
    """One real 10,000-sample shard that every synthetic dataset links to."""
    with ShardFile(str(tmp_path_factory.mktemp("base") / "base.tar")) as shard:
        for i in range(PER_SHARD):
            shard.add(f"k{i:06d}", [("cls", str(i % 10).encode())])
        return shard.commit()


def _linked_dataset(dest: str, num_shards: int, written: WrittenShard) -> Manifest:
    os.makedirs(dest)
    entries = []
    for n in range(num_shards):
        os.link(written.path, os.path.join(dest, f"s{n:04d}.tar"))
        os.link(written.index_path, os.path.join(dest, f"s{n:04d}.idx"))
        entries.append(ShardEntry(f"s{n:04d}.tar", PER_SHARD, written.num_bytes, written.sha256, f"s{n:04d}.idx"))
    return Manifest(shards=tuple(entries), location=dest)


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_a_million_samples_takes_memory_per_shard_not_per_sample(tmp_path, base_shard):
    big = ShardDataset(_linked_dataset(str(tmp_path / "big"), 100, base_shard), mode="exact")
    assert big.catalog.num_samples == 1_000_000

    def plan_all_slots():
        total = 0
        for rank, worker in itertools.product(range(8), range(4)):
            world = World(rank=rank, world_size=8, worker=worker, num_workers=4)
            total += sum(p.num_samples for p in big.plan.pieces(world, epoch=3))
        assert total == 1_000_000

    plan_all_slots()  # warm up numpy's lazy imports and caches
    # A per-sample list would take 8 MB (array) to 30+ MB (Python ints).
    assert _peak(plan_all_slots) < 512 << 10


def test_reading_from_a_million_sample_dataset_uses_no_more_memory_than_from_a_small_one(tmp_path, base_shard):
    options = SourceOptions(chunk_bytes=1 << 20)
    small = ShardDataset(_linked_dataset(str(tmp_path / "small"), 1, base_shard), mode="exact", source_options=options,
                         read_ahead_bytes=4 << 20, buffer_size=500, rank=0, world_size=1)
    big = ShardDataset(_linked_dataset(str(tmp_path / "big"), 100, base_shard), mode="exact", source_options=options,
                       read_ahead_bytes=4 << 20, buffer_size=500, rank=0, world_size=50)

    def read(ds):
        return lambda: sum(1 for _ in itertools.islice(iter(ds), 10_000))

    small_peak = _peak(read(small))
    big_peak = _peak(read(big))
    # Bounded by the configured buffers (4 MiB read-ahead + one chunk being
    # parsed + 500 samples), and not more for 100x the samples and shards.
    assert big_peak < 12 << 20
    assert big_peak < small_peak + (1 << 20)


_seen = [0]
_start = [0]


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon line in /proc/self/status")


def _note_start(worker_id: int) -> None:
    _start[0] = _rss_anon()


def _rss_growth_every_1000(sample):
    """The worker's anonymous RSS growth since it started, on every 1000th sample."""
    _seen[0] += 1
    return 0 if _seen[0] % 1000 else _rss_anon() - _start[0]


def _worker_rss_growth(ds: ShardDataset) -> int:
    """Peak anonymous RSS a DataLoader worker adds while reading 12,000 samples.

    Counted from the worker's start, before it opens the dataset, so what it
    allocates up front (plan, table, buffers) counts as well as what it
    allocates per sample.
    """
    import torch

    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, worker_init_fn=_note_start)
    return max(itertools.islice(iter(loader), 12_000 // 250))


def test_worker_rss_does_not_grow_with_dataset_size(tmp_path, base_shard):
    options = SourceOptions(chunk_bytes=1 << 20)
    kwargs = dict(mode="exact", source_options=options, read_ahead_bytes=4 << 20, buffer_size=500,
                  map=_rss_growth_every_1000, batch_size=250, collate=max)
    small = ShardDataset(_linked_dataset(str(tmp_path / "small"), 3, base_shard), rank=0, world_size=1, **kwargs)
    big = ShardDataset(_linked_dataset(str(tmp_path / "big"), 100, base_shard), rank=0, world_size=20, **kwargs)
    small_growth = _worker_rss_growth(small)
    big_growth = _worker_rss_growth(big)
    # 12,000 samples read from 30,000 vs 1,000,000: the same bounded buffers
    # (a per-sample int64 array over the big dataset alone would be 8 MB).
    assert big_growth < small_growth + (4 << 20), (small_growth, big_growth)
