"""IndexedDataset over HTTP and S3: the streamed samples' bytes, one request each."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardkit
from shardkit.read.indexed import IndexedDataset
from tests.remote.remote_servers import fast_options

SIZES = (6, 4, 0, 7)


def streamed(source, **kwargs) -> list[dict]:
    return list(shardkit.ShardDataset(source, mode="exact", shuffle=False, **kwargs))


def assert_random_reads_match(ds: IndexedDataset, expected: list[dict]) -> None:
    assert len(ds) == len(expected)
    for i in np.random.default_rng(0).permutation(len(ds)).tolist():
        got = ds[i]
        assert got.pop("__index__") == i
        assert got == expected[i]


@pytest.mark.parametrize("storage", ["local", "http", "s3"])
def test_every_sample_read_at_random_is_the_streamed_sample(make_shards, storage, request):
    # Samples of 20 KB: over HTTP and S3 each is fetched in concurrent parts
    # of 16 KB; one batch read concurrently, then every sample on its own.
    manifest = make_shards(SIZES, payload_bytes=20_000)
    expected = streamed(manifest.location)
    if storage == "local":
        location, options = manifest.location, None
    elif storage == "http":
        location, options = request.getfixturevalue("serve_dataset")(manifest) + "/", fast_options()
    else:
        client, bucket = request.getfixturevalue("s3_bucket")
        for name in sorted(os.listdir(manifest.location)):
            client.upload_file(os.path.join(manifest.location, name), bucket, f"ds/{name}")
        location = f"s3://{bucket}/ds/"
        options = fast_options(s3_endpoint_url=request.getfixturevalue("s3_server"))
    ds = IndexedDataset(location, source_options=options, max_open_shards=2)
    order = np.random.default_rng(1).permutation(len(ds)).tolist()
    batch = ds.__getitems__(order)
    assert [s.pop("__index__") for s in batch] == order
    assert batch == [expected[i] for i in order]
    assert_random_reads_match(ds, expected)


@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_random_reads_are_one_ranged_get_a_sample_after_the_index(make_shards, serve_dataset, http_server, scheme):
    # s3:// reads are presigned ranged GETs on the HTTP path: the same server
    # stands in for the store (anonymous, so its paths carry no signature).
    manifest = make_shards((3, 2, 0, 2), payload_bytes=3000)  # few samples: the suite runs it twice
    expected = streamed(manifest.location)
    prefix = "/data" if scheme == "http" else "/bkt/ds"
    base = serve_dataset(manifest, prefix)
    if scheme == "http":
        location, options = base + "/", fast_options(part_bytes=1 << 20)
    else:
        location = "s3://bkt/ds/"
        options = fast_options(part_bytes=1 << 20, s3_endpoint_url=http_server.base_url, s3_anonymous=True)
    ds = IndexedDataset(location, source_options=options)
    http_server.requests.clear()
    assert_random_reads_match(ds, expected)
    shard_gets = [(p, r) for m, p, r in http_server.requests if p.endswith(".tar")]
    index_gets = [p for m, p, r in http_server.requests if p.endswith(".idx")]
    assert len(shard_gets) == len(expected), "one ranged request per sample"
    assert all(r is not None and r.startswith("bytes=") for _, r in shard_gets)
    assert len(http_server.requests) == len(shard_gets) + len(index_gets), "no other request"
    assert sorted(index_gets) == sorted({f"{prefix}/{s.index}" for s in manifest.shards if s.num_samples})
    # Each request asked for exactly one sample's bytes.
    asked = sum(int(r.split("-")[1]) + 1 - int(r[6:].split("-")[0]) for _, r in shard_gets)
    assert asked == sum(s.num_bytes for s in manifest.shards) - 1024 * sum(1 for s in manifest.shards)
    # Its indexes held, later reads are the samples' GETs alone.
    http_server.requests.clear()
    for i in (6, 0, 5):
        assert ds[i]["__key__"] == expected[i]["__key__"]
    assert [p.rsplit("/", 1)[1] for m, p, r in http_server.requests] == [
        "shard-000003.tar", "shard-000000.tar", "shard-000003.tar"
    ]


def test_http_with_a_cache_fills_it_in_the_background_then_reads_only_it(
    make_shards, serve_dataset, http_server, tmp_path
):
    manifest = make_shards(SIZES, payload_bytes=3000)
    expected = streamed(manifest.location)
    base = serve_dataset(manifest)
    cache = tmp_path / "cache"
    options = fast_options(cache_dir=str(cache))
    ds = IndexedDataset(base + "/", source_options=options)
    http_server.requests.clear()
    assert_random_reads_match(ds, expected)
    deadline = time.monotonic() + 20
    while len(list(cache.glob("*.shard"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(list(cache.glob("*.shard"))) == 3  # the three shards that hold samples
    # Each shard crossed whole once, plus the samples read before its copy was in.
    for s in manifest.shards:
        if s.num_samples:
            assert s.num_bytes <= http_server.sent[f"/data/{s.path}"] < 2 * s.num_bytes
    # A fresh dataset (another process, another run) reads from the cache alone.
    http_server.requests.clear()
    again = IndexedDataset(base + "/", source_options=options)
    assert_random_reads_match(again, expected)
    assert not [p for m, p, r in http_server.requests if p.endswith(".tar")]


def test_http_loader_with_workers_and_window_sampler(make_shards, serve_dataset):
    manifest = make_shards(SIZES)
    base = serve_dataset(manifest)
    ds = IndexedDataset(base + "/", source_options=fast_options())
    sampler = shardkit.ShardWindowSampler(ds, window_shards=2, seed=0, rank=0, world_size=1)
    loader = DataLoader(ds, sampler=sampler, batch_size=3, num_workers=2)
    keys = sorted(k for batch in loader for k in batch["__key__"])
    assert keys == sorted(s["__key__"] for s in streamed(manifest.location))


def test_s3_random_reads_are_the_streamed_samples(make_shards, s3_bucket, s3_options):
    client, bucket = s3_bucket
    manifest = make_shards(SIZES, payload_bytes=2000)
    expected = streamed(manifest.location)
    for name in sorted(os.listdir(manifest.location)):
        client.upload_file(os.path.join(manifest.location, name), bucket, f"ds/{name}")
    ds = IndexedDataset(f"s3://{bucket}/ds/", source_options=s3_options)
    assert_random_reads_match(ds, expected)


def test_remote_compressed_shard_is_refused(http_server, tmp_path):
    import gzip

    from shardkit.format.manifest import Manifest, ShardEntry

    http_server.add("/gz/a.tar.gz", gzip.compress(b"x" * 2048))
    entry = ShardEntry(path="a.tar.gz", num_samples=1, num_bytes=1, sha256="0" * 64, index="a.idx")
    with pytest.raises(shardkit.UsageError, match="Reshard it uncompressed with `shardkit write"):
        IndexedDataset(Manifest(shards=(entry,), location=http_server.base_url + "/gz"))
