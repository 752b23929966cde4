"""fsspec sources check sizes as local, HTTP and S3 ones do: an object of
another size than the manifest says is refused at open, naming it, and
``read_all(max_bytes=...)`` / ``read_at`` never fetch past what they may.
Run on fsspec's real in-memory filesystem (``memory://``)."""

from __future__ import annotations

import os
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import shardkit
from shardkit.errors import CorruptShardError, TruncatedShardError
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source

OBJECT = bytes(range(256)) * 64  # 16 KiB
SMALL_PARTS = SourceOptions(part_bytes=4096, chunk_bytes=4096, retry_deadline_s=1.0)


class CountingMemoryFileSystem(MemoryFileSystem):
    """fsspec's memory filesystem, counting the bytes ``cat_file`` hands out."""

    protocol = "countmem"
    fetched = 0

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = super().cat_file(path, start=start, end=end, **kwargs)
        type(self).fetched += len(data)
        return data


fsspec.register_implementation("countmem", CountingMemoryFileSystem, clobber=True)


@pytest.fixture
def stored():
    """An object of 16 KiB at a fresh ``countmem://`` URL."""
    url = f"countmem://fsspec-test-{uuid.uuid4().hex}/obj.tar"
    fsspec.filesystem("countmem").pipe_file(url, OBJECT)
    CountingMemoryFileSystem.fetched = 0
    return url


def _read(url: str, **kwargs) -> bytes:
    return b"".join(open_source(url, options=SMALL_PARTS, **kwargs).iter_range(0, None, chunk_bytes=4096))


def test_an_object_of_the_manifest_size_reads_whole(stored):
    assert _read(stored, expected_size=len(OBJECT)) == OBJECT
    assert open_source(stored, options=SMALL_PARTS, expected_size=len(OBJECT)).read_at(5000, 3) == OBJECT[5000:5003]


@pytest.mark.parametrize(("claimed", "error", "says"), [
    (len(OBJECT) - 512, CorruptShardError, "rewritten or appended to"),  # the object grew
    (len(OBJECT) + 512, TruncatedShardError, "truncated"),  # the object was cut short
])
def test_an_object_of_another_size_than_the_manifest_says_is_refused_at_open(stored, claimed, error, says):
    with pytest.raises(error) as caught:
        _read(stored, expected_size=claimed)
    assert stored in str(caught.value) and caught.value.path == stored and says in str(caught.value)
    assert CountingMemoryFileSystem.fetched == 0, "bytes were fetched before the size was checked"
    with pytest.raises(error):  # a random read checks it too
        open_source(stored, options=SMALL_PARTS, expected_size=claimed).read_at(0, 10)
    assert CountingMemoryFileSystem.fetched == 0


def test_read_all_refuses_an_object_over_max_bytes_before_fetching_it(stored):
    with pytest.raises(CorruptShardError, match="more than 1000 bytes") as caught:
        open_source(stored, options=SMALL_PARTS).read_all(max_bytes=1000)
    assert caught.value.path == stored
    assert CountingMemoryFileSystem.fetched == 0
    assert open_source(stored, options=SMALL_PARTS).read_all(max_bytes=len(OBJECT)) == OBJECT


def test_read_at_past_the_end_is_a_truncated_shard_error(stored):
    source = open_source(stored, options=SMALL_PARTS)
    with pytest.raises(TruncatedShardError, match=f"ends at byte {len(OBJECT)}"):
        source.read_at(len(OBJECT) - 10, 20)
    assert source.read_at(len(OBJECT) - 10, 10) == OBJECT[-10:]


def test_a_dataset_whose_shard_grew_is_refused_naming_the_shard(make_shards):
    manifest = make_shards([4, 4])
    root = f"memory://fsspec-ds-{uuid.uuid4().hex}/ds"
    fs = fsspec.filesystem("memory")
    folder = os.path.dirname(manifest.resolve(manifest.shards[0].path))
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            fs.pipe_file(f"{root}/{name}", f.read())
    assert sum(1 for _ in shardkit.ShardDataset(root + "/", shuffle=False)) == 8
    grown = f"{root}/{manifest.shards[1].path}"
    fs.pipe_file(grown, fs.cat_file(grown) + bytes(1024))  # appended after the manifest was written
    with pytest.raises(CorruptShardError) as caught:
        list(shardkit.ShardDataset(root + "/", shuffle=False))
    assert caught.value.path == grown and "manifest says" in str(caught.value)
    assert fs.exists(f"{root}/{MANIFEST_NAME}")
