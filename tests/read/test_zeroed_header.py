"""A sample header zeroed on disk reads as an end-of-archive marker: only
that sample may be lost, not the intact samples after it."""

from __future__ import annotations

import pytest

from shardkit import CorruptShardError, ShardDataset
from shardkit.format.index import load_index
from shardkit.format.tar import END_OF_ARCHIVE

NUM = 60


def _zero_header(manifest, sample: int) -> tuple[str, int]:
    path = manifest.resolve(manifest.shards[0].path)
    offset = int(load_index(manifest.resolve(manifest.shards[0].index))[sample])
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(END_OF_ARCHIVE)  # two zero blocks: the header and the first data block
    return path, offset


@pytest.mark.parametrize("bad", [0, 29, NUM - 1])
@pytest.mark.parametrize("world_size", [1, 2])
def test_skip_loses_only_the_zeroed_sample(make_shards, bad, world_size):
    manifest = make_shards([NUM, 5], payload_bytes=1000)
    _zero_header(manifest, bad)
    keys: list[str] = []
    skipped = 0
    for rank in range(world_size):
        ds = ShardDataset(manifest, mode="exact", shuffle=False, on_error="skip", rank=rank, world_size=world_size)
        keys += [s["__key__"] for s in ds]
        skipped += ds.num_skipped
    assert len(keys) == NUM - 1 + 5
    assert sorted(keys) == sorted({f"s000_{i:05d}" for i in range(NUM) if i != bad} | {f"s001_{i:05d}" for i in range(5)})
    assert skipped == 1


@pytest.mark.parametrize("bad", [0, 29])
def test_raise_names_shard_and_offset_of_the_zeroed_header(make_shards, bad):
    manifest = make_shards([NUM], payload_bytes=1000)
    path, offset = _zero_header(manifest, bad)
    with pytest.raises(CorruptShardError, match=f"{path}: end-of-archive marker .* at byte {offset}, but the") as info:
        list(ShardDataset(manifest, mode="exact"))
    assert (info.value.path, info.value.offset) == (path, offset)
