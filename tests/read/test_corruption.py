"""Damaged shards: a damaged sample is left out whole or raised before any of
it is yielded, recovery from any number of faults ends, and per-sample
checksums name the sample a changed byte hit."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardkit
from shardkit.errors import CorruptShardError, VerifyError
from shardkit.format.index import encode_index, load_index, load_offset_index
from shardkit.verify import verify_dataset

from tests.conftest import sample_payload

BITFLIPS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "fixtures", "bitflips-demo")


@pytest.mark.skipif(not os.path.isdir(BITFLIPS), reason="the shared bit-flip fixture is not beside this checkout")
def test_the_bitflip_fixture_reads_under_skip_without_recursion():
    ds = shardkit.ShardDataset(BITFLIPS, mode="exact", shuffle=False, on_error="skip")
    keys = [s["__key__"] for s in ds]
    # Its flipped bits sit in member data (invisible without checksums) and in the end marker.
    assert len(keys) == len(set(keys)) == 300
    assert ds.num_skipped == 1


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def test_recovery_from_thousands_of_faults_in_one_shard_is_a_loop(make_shards):
    num = 3000
    manifest = make_shards([num], payload_bytes=10)
    path = manifest.resolve(manifest.shards[0].path)
    bounds = load_index(manifest.resolve(manifest.shards[0].index))
    for i in range(1, num, 2):  # a bit of every other sample's first header name
        _flip(path, int(bounds[i]) + 3)
    ds = shardkit.ShardDataset(manifest, mode="exact", shuffle=False, on_error="skip")
    keys = [s["__key__"] for s in ds]
    assert keys == [f"s000_{i:05d}" for i in range(0, num, 2)]
    assert ds.num_skipped == num // 2


@pytest.fixture
def flipped(make_shards):
    """A dataset whose sample 5 of shard 0 has one bit flipped in its payload."""
    manifest = make_shards([12, 4], payload_bytes=3000)
    path = manifest.resolve(manifest.shards[0].path)
    start = int(load_index(manifest.resolve(manifest.shards[0].index))[5])
    _flip(path, start + 512 + 1234)  # inside the first member's data
    return manifest


def test_a_flipped_data_bit_passes_unchecked_but_is_caught_with_checksums(flipped):
    unchecked = {s["__key__"]: s["bin"] for s in shardkit.ShardDataset(flipped, mode="exact", shuffle=False)}
    assert unchecked["s000_00005"] != sample_payload("s000_00005", 3000)  # what every peer returns too
    path = flipped.resolve(flipped.shards[0].path)
    with pytest.raises(CorruptShardError, match=f"{path}: sample 's000_00005' fails its checksum") as info:
        list(shardkit.ShardDataset(flipped, mode="exact", shuffle=False, verify_checksums=True))
    assert info.value.path == path
    ds = shardkit.ShardDataset(flipped, mode="exact", shuffle=False, verify_checksums=True, on_error="skip")
    out = {s["__key__"]: s["bin"] for s in ds}
    assert "s000_00005" not in out and len(out) == 15 and ds.num_skipped == 1
    assert all(data == sample_payload(key, 3000) for key, data in out.items())


def test_random_access_checks_checksums_when_asked(flipped):
    assert shardkit.IndexedDataset(flipped)[5]["__key__"] == "s000_00005"
    with pytest.raises(CorruptShardError, match="sample 's000_00005' fails its checksum"):
        shardkit.IndexedDataset(flipped, verify_checksums=True)[5]
    ds = shardkit.IndexedDataset(flipped, verify_checksums=True, on_error="skip")
    assert ds[5] is None and ds[4]["bin"] == sample_payload("s000_00004", 3000)


def test_verify_names_the_sample_a_flipped_bit_hit(flipped):
    with pytest.raises(VerifyError, match="shard-000000.tar: sample 's000_00005' at byte .* fails its checksum"):
        verify_dataset(flipped.location)


def test_indexes_without_checksums_keep_working(make_shards, tmp_path):
    manifest = make_shards([6, 3])
    for entry in manifest.shards:
        index_path = manifest.resolve(entry.index)
        index = load_offset_index(index_path)
        assert index.checksums is not None and len(index.checksums) == entry.num_samples
        bounds = np.array(index.bounds)
        del index  # the file is rewritten below: no mapping of it may be read after
        with open(index_path, "wb") as f:
            f.write(encode_index(bounds))  # as written before checksums existed
        assert load_offset_index(index_path).checksums is None
    keys = [s["__key__"] for s in shardkit.ShardDataset(manifest, mode="exact", verify_checksums=True)]
    assert len(keys) == 9
    assert shardkit.IndexedDataset(manifest, verify_checksums=True)[8]["__key__"] == "s001_00002"
    assert verify_dataset(manifest.location).num_samples_checked == 9


def test_numpy_reads_the_boundaries_of_an_index_with_checksums(make_shards):
    manifest = make_shards([4])
    index_path = manifest.resolve(manifest.shards[0].index)
    assert np.array_equal(np.load(index_path), load_index(index_path))


def test_a_damaged_index_is_refused_naming_the_file(make_shards, tmp_path):
    manifest = make_shards([6])
    index_path = manifest.resolve(manifest.shards[0].index)
    checksums = np.array(load_offset_index(index_path).checksums)  # a copy: the file is rewritten below
    cases = {
        "do not rise": [0, 1024, 512, 2048, 3072, 4096, 5120],
        "not on a 512-byte tar block": [0, 1024, 2048, 2049, 4096, 5120, 6144],
        "leaves no end marker": [0, 1024, 2048, 3072, 4096, 5120, 1 << 40],
    }
    for why, bounds in cases.items():
        with open(index_path, "wb") as f:
            f.write(encode_index(bounds, checksums))
        for read in (
            lambda: list(shardkit.ShardDataset(manifest, mode="exact")),
            lambda: shardkit.IndexedDataset(manifest)[3],
        ):
            with pytest.raises(CorruptShardError, match=f"{index_path}: offset index is corrupt: .*{why}"):
                read()
        with pytest.raises(VerifyError, match="offset index unusable"):
            verify_dataset(manifest.location)
        skipping = shardkit.ShardDataset(manifest, mode="exact", on_error="skip")
        assert list(skipping) == [] and skipping.num_skipped == 1
