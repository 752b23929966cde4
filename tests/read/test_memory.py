"""Per-worker memory does not grow with the dataset: a 1,000,000-sample manifest.

The big dataset is 100 links to one real 10,000-sample shard (and its index),
so it costs ~10 MB of disk but is, to the reader, a million samples.
"""

from __future__ import annotations

import itertools
import os
import tracemalloc

from shardkit import Manifest, ShardDataset, ShardEntry
from shardkit.read.sources import SourceOptions
from shardkit.world import World
from shardkit.write.shard import ShardFile

PER_SHARD = 10_000


def _linked_dataset(dest: str, num_shards: int) -> Manifest:
    os.makedirs(dest)
    with ShardFile(os.path.join(dest, "base.tar")) as shard:
        for i in range(PER_SHARD):
            shard.add(f"k{i:06d}", [("cls", str(i % 10).encode())])
        written = shard.commit()
    entries = []
    for n in range(num_shards):
        os.symlink(written.path, os.path.join(dest, f"s{n:04d}.tar"))
        os.symlink(written.index_path, os.path.join(dest, f"s{n:04d}.idx"))
        entries.append(ShardEntry(f"s{n:04d}.tar", PER_SHARD, written.num_bytes, written.sha256, f"s{n:04d}.idx"))
    return Manifest(shards=tuple(entries), location=dest)


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_a_million_samples_takes_memory_per_shard_not_per_sample(tmp_path):
    big = ShardDataset(_linked_dataset(str(tmp_path / "big"), 100), mode="exact")
    assert big.catalog.num_samples == 1_000_000

    def plan_all_slots():
        total = 0
        for rank, worker in itertools.product(range(8), range(4)):
            world = World(rank=rank, world_size=8, worker=worker, num_workers=4)
            total += sum(p.num_samples for p in big.pieces(world, epoch=3))
        assert total == 1_000_000

    plan_all_slots()  # warm up numpy's lazy imports and caches
    # A per-sample list would take 8 MB (array) to 30+ MB (Python ints).
    assert _peak(plan_all_slots) < 512 << 10


def test_reading_from_a_million_sample_dataset_uses_no_more_memory_than_from_a_small_one(tmp_path):
    options = SourceOptions(chunk_bytes=1 << 20)
    small = ShardDataset(_linked_dataset(str(tmp_path / "small"), 1), mode="exact", source_options=options,
                         read_ahead_bytes=4 << 20, buffer_size=500, rank=0, world_size=1)
    big = ShardDataset(_linked_dataset(str(tmp_path / "big"), 100), mode="exact", source_options=options,
                       read_ahead_bytes=4 << 20, buffer_size=500, rank=0, world_size=50)

    def read(ds):
        return lambda: sum(1 for _ in itertools.islice(iter(ds), 20_000))

    small_peak = _peak(read(small))
    big_peak = _peak(read(big))
    # Bounded by the configured buffers (4 MiB read-ahead + one chunk being
    # parsed + 500 samples), and not more for 100x the samples and shards.
    assert big_peak < 12 << 20
    assert big_peak < small_peak + (1 << 20)
