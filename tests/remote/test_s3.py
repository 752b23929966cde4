"""s3:// reads and uploads against moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os

import pytest

from shardkit.errors import DestinationError, RemoteError
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_destination, open_source
from shardkit.io.manifest import fetch_manifest
from shardkit.write.publish import CARD_NAME, publish_manifest
from shardkit.write.upload import refuse_existing_dataset
from tests.remote.remote_servers import without_aws_credentials


def test_ranged_reads(s3_bucket, s3_options):
    client, bucket = s3_bucket
    data = os.urandom(700_001)
    client.put_object(Bucket=bucket, Key="d/a.tar", Body=data)
    source = open_source(f"s3://{bucket}/d/a.tar", options=s3_options)
    assert b"".join(source.iter_range(0, None, chunk_bytes=50_000)) == data
    assert b"".join(source.iter_range(123, 456_789, chunk_bytes=50_000)) == data[123:456_789]
    assert source.read_all() == data


def test_missing_key_fails_fast(s3_bucket, s3_options):
    _, bucket = s3_bucket
    # S3's error code, read from the answer's body, and what to do about it.
    with pytest.raises(RemoteError, match=rf"s3://{bucket}/nope\.tar: HTTP 404 NoSuchKey.*: no such object; check the key"):
        open_source(f"s3://{bucket}/nope.tar", options=s3_options).read_all()
    with pytest.raises(RemoteError, match="404"):
        b"".join(open_source(f"s3://{bucket}/nope.tar", options=s3_options).iter_range(0, None, chunk_bytes=10))


def test_missing_bucket_fails_fast(s3_server, s3_options):
    with pytest.raises(RemoteError, match=r"s3://no-such-bucket/x\.tar"):
        open_source("s3://no-such-bucket/x.tar", options=s3_options).read_all()


def test_upload_dataset_then_read_back(make_shards, s3_bucket, s3_options):
    client, bucket = s3_bucket
    manifest = make_shards([7, 0, 4], payload_bytes=5000)
    dest = open_destination(f"s3://{bucket}/ds", options=s3_options)
    refuse_existing_dataset(dest, overwrite=False)
    for entry in manifest.shards:
        dest.put_file(os.path.join(manifest.location, entry.path), entry.path)
        dest.put_file(os.path.join(manifest.location, entry.index), entry.index)
        assert not dest.exists(MANIFEST_NAME)  # nothing references the shards yet
    publish_manifest(dest, manifest)
    remote = fetch_manifest(f"s3://{bucket}/ds", options=s3_options)
    assert remote == manifest
    for entry in remote.shards:
        data = open_source(remote.resolve(entry.path), options=s3_options, expected_size=entry.num_bytes).read_all()
        assert hashlib.sha256(data).hexdigest() == entry.sha256
    with pytest.raises(DestinationError, match="already there"):
        refuse_existing_dataset(open_destination(f"s3://{bucket}/ds", options=s3_options), overwrite=False)
    refuse_existing_dataset(open_destination(f"s3://{bucket}/ds", options=s3_options), overwrite=True)


def test_upload_to_fsspec_memory(make_shards):
    import fsspec

    manifest = make_shards([3])
    dest = open_destination("memory://shardkit-test/ds")
    entry = manifest.shards[0]
    dest.put_file(os.path.join(manifest.location, entry.path), entry.path)
    publish_manifest(dest, manifest)
    fs = fsspec.filesystem("memory")
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("/shardkit-test/ds", detail=False)) == sorted(
        [MANIFEST_NAME, entry.path, manifest.table_file()[0], CARD_NAME]
    )
    data = open_source(f"memory://shardkit-test/ds/{entry.path}", options=SourceOptions(part_bytes=1000)).read_all()
    assert hashlib.sha256(data).hexdigest() == entry.sha256
    with pytest.raises(RemoteError, match="HTTP 404"):
        open_source("memory://shardkit-test/ds/none.tar").read_all()
    fs.rm("/shardkit-test", recursive=True)


def test_cache_over_s3(s3_bucket, s3_options, tmp_path):
    client, bucket = s3_bucket
    data = os.urandom(100_000)
    client.put_object(Bucket=bucket, Key="c.tar", Body=data)
    opts = SourceOptions(**{**s3_options.__dict__, "cache_dir": str(tmp_path / "cache")})
    url = f"s3://{bucket}/c.tar"
    assert open_source(url, options=opts).read_all() == data
    client.delete_object(Bucket=bucket, Key="c.tar")
    assert open_source(url, options=opts).read_all() == data  # from the cache


def test_large_file_goes_up_in_parts(s3_bucket, s3_options, tmp_path, monkeypatch):
    import shardkit.io.s3 as s3

    client, bucket = s3_bucket
    monkeypatch.setattr(s3, "MULTIPART_THRESHOLD_BYTES", 1 << 20)
    data = os.urandom((5 << 20) + 12345)
    path = tmp_path / "big.tar"
    path.write_bytes(data)
    open_destination(f"s3://{bucket}/ds", options=s3_options).put_file(str(path), "big.tar")
    assert client.get_object(Bucket=bucket, Key="ds/big.tar")["Body"].read() == data
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_dropped_s3_responses_resume(s3_bucket, s3_server):
    from urllib.parse import urlsplit

    from tests.remote.remote_servers import CuttingProxy

    client, bucket = s3_bucket
    data = os.urandom(900_000)
    client.put_object(Bucket=bucket, Key="cut.tar", Body=data)
    target = urlsplit(s3_server)
    proxy = CuttingProxy((target.hostname, target.port)).start()
    try:
        # Cut the first few connections partway through their responses.
        proxy.cut_after = [150_000, 60_000, 300_000, 1_000]
        options = SourceOptions(
            s3_endpoint_url=proxy.url,
            part_bytes=300_000,
            max_concurrent_requests=2,
            retry_deadline_s=5.0,
            backoff_initial_s=0.01,
            backoff_max_s=0.1,
        )
        source = open_source(f"s3://{bucket}/cut.tar", options=options, expected_size=len(data))
        assert b"".join(source.iter_range(0, None, chunk_bytes=64 << 10)) == data
        assert proxy.cuts >= 3
    finally:
        proxy.close()


def test_credentials_in_url_are_refused_without_echoing_them():
    from shardkit.errors import UsageError

    with pytest.raises(UsageError, match="credentials in s3:// URLs") as info:
        open_source("s3://AKIAXXX:SECRET@bucket/key.tar")
    assert "SECRET" not in str(info.value)


def test_unreachable_store_is_a_remote_error_naming_it(monkeypatch):
    import socket

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = SourceOptions(
        s3_endpoint_url=f"http://127.0.0.1:{port}", retry_deadline_s=0.3, backoff_initial_s=0.01, backoff_max_s=0.05
    )
    with pytest.raises(RemoteError, match=r"s3://bucket/ds/manifest\.json: giving up"):
        refuse_existing_dataset(open_destination("s3://bucket/ds", options=options), overwrite=False)


def test_missing_credentials_say_how_to_configure(monkeypatch, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    options = SourceOptions(s3_endpoint_url="http://127.0.0.1:9", s3_region="us-east-1", retry_deadline_s=0.3)
    with pytest.raises(RemoteError, match="no AWS credentials found"):
        open_source("s3://bucket/x.tar", options=options).read_all()


@pytest.mark.parametrize("source", ["folder", "shard_urls"])
def test_forked_dataloader_workers_make_no_s3_client_and_read_every_sample_once(
    source, make_shards, s3_bucket, s3_options, tmp_path, monkeypatch
):
    import collections
    import dataclasses

    import botocore.session
    from torch.utils.data import DataLoader

    from shardkit import ShardDataset

    client, bucket = s3_bucket
    manifest = make_shards([6, 5, 7, 4], payload_bytes=3000)
    for name in os.listdir(manifest.location):
        client.upload_file(os.path.join(manifest.location, name), bucket, f"ds/{name}")
    made = tmp_path / "clients"
    create_client = botocore.session.Session.create_client

    def noting_pid(self, *args, **kwargs):
        with open(made, "a") as f:
            f.write(f"{os.getpid()}\n")
        return create_client(self, *args, **kwargs)

    monkeypatch.setattr(botocore.session.Session, "create_client", noting_pid)
    # Settings no other test's client has. A folder's manifest is read in this
    # process; a list of shard URLs is not: the dataset prepares the signer itself.
    options = dataclasses.replace(s3_options, read_timeout_s=29.0 if source == "folder" else 27.0)
    if source == "folder":
        dataset = ShardDataset(f"s3://{bucket}/ds/", mode="exact", shuffle=False, source_options=options)
    else:
        urls = [f"s3://{bucket}/ds/{entry.path}" for entry in manifest.shards]
        dataset = ShardDataset(urls, mode="exact", shuffle=False, source_options=options)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    seen = collections.Counter()
    got = {}
    for sample in loader:
        seen[sample["__key__"]] += 1
        got[sample["__key__"]] = sample["bin"]
    local = {s["__key__"]: s["bin"] for s in ShardDataset(manifest.location, mode="exact", shuffle=False)}
    assert set(seen.values()) == {1} and got == local
    # The parent made the one client that signs; its forked workers made none.
    pids = made.read_text().split()
    assert pids == [str(os.getpid())]


def test_s3_reads_are_presigned_ranged_gets_on_the_http_path(http_server, monkeypatch, tmp_path, caplog):
    import logging

    from tests.remote.remote_servers import without_aws_credentials

    without_aws_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSHARDKITTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "shardkit-test-secret")
    data = os.urandom(300_001)
    http_server.add("/bkt/d/a.tar", data)
    options = SourceOptions(
        s3_endpoint_url=http_server.base_url,
        s3_region="eu-west-1",
        part_bytes=100_000,
        max_concurrent_requests=2,
        retry_deadline_s=2.0,
        read_timeout_s=28.0,  # settings no other test's client has
    )
    # Whatever an earlier test's logging set-up did (the CLI's), these lines reach caplog.
    for name in ("shardkit", "urllib3", "urllib3.connectionpool"):
        caplog.set_level(logging.DEBUG, logger=name)
        monkeypatch.setattr(logging.getLogger(name), "disabled", False)
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
    source = open_source("s3://bkt/d/a.tar", options=options, expected_size=len(data))
    assert b"".join(source.iter_range(0, None, chunk_bytes=64 << 10)) == data
    gets = [(path, rng) for method, path, rng in http_server.requests if path.startswith("/bkt/d/a.tar")]
    assert len(gets) >= 3  # parts in parallel, path-style, each signed for this region
    for path, rng in gets:
        assert rng is not None and rng.startswith("bytes=")
        assert "X-Amz-Credential=AKIDSHARDKITTEST%2F" in path and "%2Feu-west-1%2Fs3%2F" in path
        assert "X-Amz-Signature=" in path
    with pytest.raises(RemoteError, match=r"^s3://bkt/none\.tar: HTTP 404") as info:
        open_source("s3://bkt/none.tar", options=options).read_all()
    # Neither the message nor shardkit's or urllib3's log lines (botocore's own debug lines are its affair).
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.split(".")[0] in ("shardkit", "urllib3"))
    assert "GET /bkt/d/a.tar " in logged
    for secret in ("AKIDSHARDKITTEST", "Signature", "shardkit-test-secret"):
        assert secret not in str(info.value) and secret not in logged
    # Anonymous: the same path, nothing signed.
    anonymous = SourceOptions(s3_endpoint_url=http_server.base_url, s3_anonymous=True, read_timeout_s=28.0)
    assert open_source("s3://bkt/d/a.tar", options=anonymous).read_all() == data
    path = [p for m, p, r in http_server.requests if p.startswith("/bkt/d/a.tar")][-1]
    assert path == "/bkt/d/a.tar"
