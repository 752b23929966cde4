"""A remote dataset's shard table: fetched once into the local cache, never
used partial, and ``shardkit upgrade`` over S3."""

from __future__ import annotations

import json
import os

import pytest

import shardkit
from shardkit.errors import ManifestError, RemoteError
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.manifest import fetch_manifest
from shardkit.io.registry import open_destination
from shardkit.write.publish import upgrade_dataset
from tests.remote.remote_servers import Faults, fast_options


def _table_name(manifest) -> str:
    return json.loads(manifest.to_json())["table"]["path"]


def test_remote_table_is_fetched_once_and_mapped_from_the_cache(make_shards, serve_dataset, http_server, tmp_path):
    manifest = make_shards([4, 0, 3])
    base = serve_dataset(manifest)
    options = fast_options(cache_dir=str(tmp_path / "cache"))
    for _ in range(2):
        keys = [s["__key__"] for s in shardkit.ShardDataset(base + "/", source_options=options)]
        assert len(keys) == 7
    table = _table_name(manifest)
    assert len(http_server.gets(f"/data/{table}")) == 1
    cached = os.listdir(tmp_path / "cache" / "tables")
    assert cached == [json.loads(manifest.to_json())["table"]["sha256"] + ".table"]


def test_a_pickled_remote_dataset_fetches_its_table_where_it_arrives(make_shards, serve_dataset, http_server, tmp_path):
    # As on another machine (a Ray Train worker): the sender's cached table is
    # not there, so the receiver fetches it into its own cache. The pickle
    # says where to fetch it, not where the sender cached it.
    import pickle
    import shutil

    manifest = make_shards([4, 0, 3])
    base = serve_dataset(manifest)
    options = fast_options(cache_dir=str(tmp_path / "cache"))
    dataset = shardkit.ShardDataset(base + "/", mode="exact", source_options=options)
    blob = pickle.dumps(dataset)
    assert len(blob) < 20_000
    shutil.rmtree(tmp_path / "cache")
    keys = [s["__key__"] for s in pickle.loads(blob)]
    assert sorted(keys) == sorted(s["__key__"] for s in dataset) and len(keys) == 7
    assert len(http_server.gets(f"/data/{_table_name(manifest)}")) == 2


def test_remote_table_that_fails_mid_fetch_is_an_error_naming_it(make_shards, serve_dataset, http_server, tmp_path):
    manifest = make_shards([4, 3])
    base = serve_dataset(manifest)
    table = _table_name(manifest)
    http_server.faults[f"/data/{table}"] = Faults(drop_after=[100] + [0] * 1000)
    options = fast_options(cache_dir=str(tmp_path / "cache"), retry_deadline_s=1.0)
    with pytest.raises(RemoteError) as info:
        fetch_manifest(base + "/", options=options)
    assert table in str(info.value) and "shard table" in str(info.value)
    assert os.listdir(tmp_path / "cache" / "tables") == []  # nothing partial kept
    http_server.faults.clear()
    assert fetch_manifest(base + "/", options=options) == manifest  # a rerun fetches it whole


def test_remote_table_of_other_bytes_is_refused(make_shards, serve_dataset, http_server, tmp_path):
    manifest = make_shards([4, 3])
    base = serve_dataset(manifest)
    table = _table_name(manifest)
    data = http_server.objects[f"/data/{table}"]
    options = fast_options(cache_dir=str(tmp_path / "cache"))
    http_server.add(f"/data/{table}", data + b"\0" * 64)
    with pytest.raises(ManifestError, match=f"{table}: shard table is longer than the {len(data)} bytes"):
        fetch_manifest(base + "/", options=options)
    http_server.add(f"/data/{table}", bytes(reversed(data)))
    with pytest.raises(ManifestError, match=f"{table}: shard table SHA-256 is not the one"):
        fetch_manifest(base + "/", options=options)
    assert os.listdir(tmp_path / "cache" / "tables") == []


def test_upgrade_on_s3(make_shards, s3_bucket, s3_options):
    _, bucket = s3_bucket
    manifest = make_shards([3, 2])
    url = f"s3://{bucket}/ds"
    dest = open_destination(url, options=s3_options)
    for entry in manifest.shards:
        dest.put_file(os.path.join(manifest.location, entry.path), entry.path)
        dest.put_file(os.path.join(manifest.location, entry.index), entry.index)
    dest.put_bytes(MANIFEST_NAME, manifest.to_format1_json().encode())
    assert fetch_manifest(url, options=s3_options).loaded_version == 1
    report = upgrade_dataset(url, options=s3_options)
    assert report.upgraded and report.num_shards == 2
    upgraded = fetch_manifest(url, options=s3_options)
    assert upgraded.loaded_version == 2 and upgraded == manifest and upgraded.fingerprint == manifest.fingerprint
    assert not upgrade_dataset(url, options=s3_options).upgraded


def test_remote_manifest_over_the_size_limit_is_refused_unread(make_shards, serve_dataset, http_server, monkeypatch):
    import shardkit.io.manifest as io_manifest

    manifest = make_shards([4, 3])
    base = serve_dataset(manifest)
    http_server.add("/data/" + MANIFEST_NAME, b" " * (1 << 20) + manifest.to_json().encode())
    monkeypatch.setattr(io_manifest, "MAX_MANIFEST_BYTES", 4096)
    with pytest.raises(ManifestError, match=rf"/data/{MANIFEST_NAME}: more than 4096 bytes, more than a manifest may hold"):
        fetch_manifest(base + "/", options=fast_options())
