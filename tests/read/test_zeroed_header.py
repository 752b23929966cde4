"""A sample header zeroed on disk reads as an end-of-archive marker: only
that sample may be lost, not the intact samples after it."""

from __future__ import annotations

import pytest

import shardkit
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
    with pytest.raises(CorruptShardError, match=f"{path}: zero block .* inside the samples the offset index lists .* at byte {offset}\\.") as info:
        list(ShardDataset(manifest, mode="exact"))
    assert (info.value.path, info.value.offset) == (path, offset)


def _zero_second_member_header(manifest, sample: int) -> tuple[str, int]:
    """Zero the header block of a sample's second member (its ``cls``)."""
    path = manifest.resolve(manifest.shards[0].path)
    start = int(load_index(manifest.resolve(manifest.shards[0].index))[sample])
    with open(path, "r+b") as f:
        f.seek(start)
        header = f.read(512)
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        second = start + 512 + -(-size // 512) * 512  # past the first member's header, data and padding
        f.seek(second)
        f.write(bytes(512))
    return path, second


@pytest.mark.parametrize("bad", [0, 29, NUM - 1])
def test_a_zeroed_second_member_header_never_yields_a_partial_sample(make_shards, bad):
    manifest = make_shards([NUM, 5], payload_bytes=1000)
    path, offset = _zero_second_member_header(manifest, bad)
    # raise: the error comes before any of the damaged sample is yielded.
    seen: list[dict] = []
    with pytest.raises(CorruptShardError, match=f"{path}: zero block .* at byte {offset}\\."):
        for sample in ShardDataset(manifest, mode="exact", shuffle=False):
            seen.append(sample)
    assert [s["__key__"] for s in seen] == [f"s000_{i:05d}" for i in range(len(seen))] and len(seen) <= bad
    # skip: every other sample comes whole, the damaged one not at all.
    ds = ShardDataset(manifest, mode="exact", shuffle=False, on_error="skip")
    out = list(ds)
    assert all(set(s) >= {"bin", "cls", "json"} for s in out)
    keys = [s["__key__"] for s in out]
    assert f"s000_{bad:05d}" not in keys and len(keys) == NUM - 1 + 5 and ds.num_skipped == 1


def test_a_zeroed_second_member_header_is_refused_by_random_access(make_shards):
    manifest = make_shards([NUM], payload_bytes=1000)
    path, offset = _zero_second_member_header(manifest, 7)
    ds = shardkit.IndexedDataset(manifest)
    with pytest.raises(CorruptShardError, match=f"{path}: zero block .* at byte {offset}\\."):
        ds[7]
    assert ds[6]["__key__"] == "s000_00006" and ds[8]["__key__"] == "s000_00008"
    skipping = shardkit.IndexedDataset(manifest, on_error="skip")
    assert skipping[7] is None and skipping.num_skipped == 1
