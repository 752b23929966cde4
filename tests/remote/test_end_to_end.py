"""Whole datasets over HTTP and S3: ``shardkit write`` to s3://, ``ShardDataset`` back."""

from __future__ import annotations

import collections
import re

import pytest

import shardkit
from shardkit.cli import main
from shardkit.format.manifest import MANIFEST_NAME
from tests.remote.remote_servers import Faults, fast_options, most_attempts, without_aws_credentials

SIZES = [9, 0, 14, 6, 11]


def expected_keys(sizes=SIZES) -> list[str]:
    return [f"s{s:03d}_{i:05d}" for s, n in enumerate(sizes) for i in range(n)]


def read_keys(source, **kwargs) -> list[str]:
    return [sample["__key__"] for sample in shardkit.ShardDataset(source, **kwargs)]


def test_http_dataset_through_faults(make_shards, serve_dataset, http_server):
    manifest = make_shards(SIZES, payload_bytes=3000)
    base = serve_dataset(manifest)
    for entry in manifest.shards:
        http_server.faults[f"/data/{entry.path}"] = Faults(
            statuses=[503], drop_after=[5000, 9000], stall_after=[20000], stall_s=2.0
        )
    keys = read_keys(base + "/", mode="exact", shuffle=False, source_options=fast_options())
    assert keys == expected_keys()


def test_http_samples_have_right_bytes(make_shards, serve_dataset):
    from tests.conftest import sample_payload

    manifest = make_shards(SIZES, payload_bytes=2500)
    base = serve_dataset(manifest)
    for sample in shardkit.ShardDataset(
        base + "/" + MANIFEST_NAME, mode="exact", seed=3, source_options=fast_options()
    ):
        assert sample["bin"] == sample_payload(sample["__key__"], 2500)


def test_http_missing_shard_names_url(make_shards, serve_dataset, http_server):
    manifest = make_shards(SIZES)
    base = serve_dataset(manifest)
    del http_server.objects["/data/" + manifest.shards[2].path]
    with pytest.raises(shardkit.ShardkitError, match=rf"{base}/{manifest.shards[2].path}: HTTP 404"):
        read_keys(base + "/", mode="exact", shuffle=False, source_options=fast_options())


@pytest.mark.parametrize("world_size", [2, 3])
def test_http_multi_rank_sees_every_sample_once(make_shards, serve_dataset, world_size):
    manifest = make_shards(SIZES)
    base = serve_dataset(manifest)
    seen = collections.Counter()
    for rank in range(world_size):
        seen.update(
            read_keys(base + "/", mode="exact", seed=1, rank=rank, world_size=world_size, source_options=fast_options())
        )
    assert sorted(seen) == sorted(expected_keys()) and set(seen.values()) == {1}


def test_http_dataloader_two_workers_with_cache(make_shards, serve_dataset, http_server, tmp_path):
    from torch.utils.data import DataLoader

    manifest = make_shards(SIZES, payload_bytes=2000)
    base = serve_dataset(manifest)
    opts = fast_options(cache_dir=str(tmp_path / "cache"))
    dataset = shardkit.ShardDataset(base + "/", mode="exact", seed=0, source_options=opts)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        keys = [sample["__key__"] for sample in loader]
        assert sorted(keys) == sorted(expected_keys())
        if epoch == 0:
            tar_gets = sum(len(http_server.gets(f"/data/{e.path}")) for e in manifest.shards)
    # The second epoch read the shards from the cache.
    assert sum(len(http_server.gets(f"/data/{e.path}")) for e in manifest.shards) == tar_gets


def test_cli_write_to_s3_then_read_multi_rank(tmp_path, make_shards, s3_bucket, s3_options, capsys):
    _, bucket = s3_bucket
    local = make_shards(SIZES, name="src")
    url = f"s3://{bucket}/ds"
    code = main(["write", local.location, url, "--max-samples", "5", "--no-shuffle", "--workers", "2"])
    assert code == 0, capsys.readouterr().err
    manifest = shardkit.ShardDataset(url + "/", mode="exact", source_options=s3_options).catalog.manifest
    assert manifest is not None and manifest.num_samples == sum(SIZES) and manifest.num_shards >= 8
    seen = collections.Counter()
    for rank in range(2):
        seen.update(read_keys(url + "/", mode="exact", rank=rank, world_size=2, source_options=s3_options))
    assert sorted(seen) == sorted(expected_keys()) and set(seen.values()) == {1}
    # A second write to the same prefix is refused (exit 2, one line naming it).
    assert main(["write", local.location, url]) == 2
    assert "already there" in capsys.readouterr().err


def test_failed_upload_publishes_no_manifest(make_shards, s3_bucket, s3_options, monkeypatch):
    from shardkit.errors import RemoteError
    from shardkit.write.parallel import WriteOptions, write_dataset
    from shardkit.io.s3 import S3Destination

    client, bucket = s3_bucket
    local = make_shards(SIZES, name="src")
    real_put = S3Destination._put
    tries: list[str] = []

    def flaky_put(self, local_path, name):
        tries.append(name)
        if name == "shard-000002.tar":
            raise RemoteError(f"{self.object_url(name)}: HTTP 403 Forbidden: access denied", url=self.object_url(name))
        real_put(self, local_path, name)

    monkeypatch.setattr(S3Destination, "_put", flaky_put)
    with pytest.raises(RemoteError, match="shard-000002.tar: HTTP 403"):
        write_dataset(local.location, f"s3://{bucket}/ds", options=WriteOptions(max_samples=5, workers=1))
    assert tries.count("shard-000002.tar") == 1, "a 403 is final: no retry"
    assert MANIFEST_NAME not in tries
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert f"ds/{MANIFEST_NAME}" not in keys


def test_missing_bucket_is_a_clear_error(make_shards, s3_server):
    from shardkit.errors import RemoteError
    from shardkit.write.parallel import write_dataset

    local = make_shards([3], name="src")
    with pytest.raises(RemoteError, match="s3://no-such-bucket-for-shardkit/ds/"):
        write_dataset(local.location, "s3://no-such-bucket-for-shardkit/ds")


def test_http_brace_pattern_without_manifest(make_shards, serve_dataset):
    manifest = make_shards(SIZES)
    base = serve_dataset(manifest)
    pattern = base + "/shard-{000000..%06d}.tar" % (len(SIZES) - 1)
    keys = read_keys(pattern, mode="exact", shuffle=False, source_options=fast_options())
    assert sorted(keys) == sorted(expected_keys())


def test_a_laion_sized_brace_pattern_stays_a_pattern_in_every_worker(make_shards, serve_dataset):
    """500,000 shard URLs are not made into 500,000 strings in each process
    (nor 19 MB in each pickled dataset): the pattern pickles as itself, and
    the shards it names are read as a list's would be."""
    import pickle

    manifest = make_shards(SIZES)
    base = serve_dataset(manifest)
    huge = shardkit.ShardDataset(base + "/shard-{000000..499999}.tar", mode="exact")
    assert len(pickle.dumps(huge)) < 10_000
    pattern = base + "/shard-{000000..%06d}.tar" % (len(SIZES) - 1)
    dataset = pickle.loads(pickle.dumps(shardkit.ShardDataset(pattern, mode="exact", seed=3, source_options=fast_options())))
    loader = shardkit.make_loader(dataset, batch_size=None, num_workers=2)
    assert sorted(sample["__key__"] for sample in loader) == sorted(expected_keys())
    with pytest.raises(shardkit.UsageError, match="compressed shards"):  # told by the names, when asked
        shardkit.ShardDataset(base + "/s-{0..3}.tar.gz", mode="balanced")


def test_http_dead_server_fails_within_deadline_naming_url(make_shards, serve_dataset, http_server):
    manifest = make_shards(SIZES)
    base = serve_dataset(manifest)
    dataset = shardkit.ShardDataset(
        base + "/", mode="exact", shuffle=False, source_options=fast_options(retry_deadline_s=1.0)
    )
    # The manifest was read; now every shard request stalls past the read timeout.
    for entry in manifest.shards:
        http_server.faults[f"/data/{entry.path}"] = Faults(stall_after=[0] * 1000, stall_s=3.0)
    options = fast_options(retry_deadline_s=1.0)
    with pytest.raises(shardkit.RemoteError, match=rf"{base}/shard-\d+\.tar: giving up at byte \d+ .*ReadTimeoutError") as info:
        list(dataset)
    # Bounded by the deadline: a slow machine makes fewer attempts, never more.
    attempts = int(re.search(r"after (\d+) attempts", str(info.value)).group(1))
    assert 1 <= attempts <= most_attempts(options)


def _shard_gets(http_server) -> int:
    with http_server.lock:
        return sum(1 for method, path, _ in http_server.requests if method == "GET" and path.endswith(".tar"))


def test_reading_starts_at_iter_and_stops_when_the_iterator_is_dropped(make_shards, serve_dataset, http_server):
    """A DataLoader worker calls iter(dataset) when it starts: reads begin
    there, overlapping the other workers' start, not at the first next()."""
    import gc
    import threading

    manifest = make_shards([30, 30], payload_bytes=2000)
    base = serve_dataset(manifest)
    # A read-ahead budget below one shard keeps the reader thread waiting for the consumer.
    ds = shardkit.ShardDataset(
        base + "/", mode="exact", shuffle=False, read_ahead_bytes=8192, source_options=fast_options(chunk_bytes=4096)
    )
    stream = iter(ds)
    assert http_server.wait_for(lambda: _shard_gets(http_server) > 0), (
        "no shard was requested before the first sample was asked for"
    )
    assert [s["__key__"] for s in stream] == expected_keys([30, 30])

    def readers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "shardkit-read-ahead"}

    before = readers()  # other tests may have left readers stuck in a read
    unstarted = iter(ds)  # dropped before its first sample: its reader thread must stop
    started = readers() - before
    assert started, "iter() started no reader"
    del unstarted
    gc.collect()
    for thread in started:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in started)


def test_a_whole_remote_shard_asks_for_its_index_and_its_bytes_at_once(make_shards, serve_dataset, http_server):
    # The first sample of a remote shard waits for one round trip, not two:
    # while the index's first answer is held back (until the client's read
    # timeout makes it ask again), the shard's bytes are already being asked
    # for. A reader asking one after the other sends the shard's GET only
    # after a second index GET has succeeded.
    manifest = make_shards([7], payload_bytes=3000)
    base = serve_dataset(manifest)
    shard = f"/data/{manifest.shards[0].path}"
    (index,) = [p for p in http_server.objects if p.endswith(".idx")]
    http_server.faults[index] = Faults(stall_after=[0], stall_s=2.0)
    keys = read_keys(base + "/", mode="exact", shuffle=False, source_options=fast_options(read_timeout_s=1.0))
    assert keys == expected_keys([7])
    gets = [p for m, p, _ in http_server.requests if m == "GET" and p in (shard, index)]
    # (The first index GET may arrive after the shard's first parts: they are
    # sent from threads of their own.)
    index_gets = [i for i, p in enumerate(gets) if p == index]
    assert len(index_gets) >= 2 and gets.index(shard) < index_gets[1], gets


@pytest.mark.parametrize("cached", [False, True])
def test_a_reader_asks_for_its_start_budget_alone_until_its_consumer_takes(
    make_shards, serve_dataset, http_server, tmp_path, cached
):
    """A reader starts at iter(), before anyone asks (a DataLoader worker
    while its siblings start): it asks the store for its start budget only,
    not for the whole range a store would send at once, and for the rest
    once its consumer has taken half of it. Same bytes as read whole. A
    cache fills its entry from one whole read, as before."""
    from shardkit.read.pieces import REMOTE_START_READ_AHEAD_BYTES as START
    from tests.conftest import sample_payload

    manifest = make_shards([40], payload_bytes=80_000)  # 3.2 MB: past the start budget
    base = serve_dataset(manifest)
    shard = f"/data/{manifest.shards[0].path}"
    size = manifest.shards[0].num_bytes
    options = shardkit.SourceOptions(max_concurrent_requests=1, cache_dir=str(tmp_path / "cache") if cached else None)
    stream = iter(shardkit.ShardDataset(base + "/", mode="exact", shuffle=False, source_options=options))
    assert http_server.wait_for(lambda: len(http_server.gets(shard)) > 0)
    first = next(stream)
    if not cached:
        assert http_server.gets(shard) == [f"bytes=0-{START - 1}"], "more than the start budget asked for ahead"
    samples = [first, *stream]
    assert [s["__key__"] for s in samples] == expected_keys([40])
    assert all(s["bin"] == sample_payload(s["__key__"], 80_000) for s in samples)
    whole = [f"bytes=0-{size - 1}"]
    assert http_server.gets(shard) == (whole if cached else [f"bytes=0-{START - 1}", f"bytes={START}-{size - 1}"])


@pytest.mark.parametrize(("requests", "read_ahead_mib", "budget_mib"), [(1, 32, 8), (2, 32, 16), (8, 32, 32), (1, 4, 4)])
def test_a_remote_reader_holds_a_few_connections_worth_ahead_not_its_whole_budget(
    make_shards, serve_dataset, monkeypatch, requests, read_ahead_mib, budget_mib
):
    """A remote reader's read-ahead is at most
    REMOTE_READ_AHEAD_BYTES_PER_REQUEST per request it may have in flight
    (a DataLoader worker of 8 sharing the default 8 has one), within its
    read_ahead_bytes: in a DataLoader, a worker far ahead of its siblings
    only takes the link from them. Every sample still comes through."""
    from shardkit.read import prefetch
    from shardkit.read.pieces import REMOTE_READ_AHEAD_BYTES_PER_REQUEST as PER_REQUEST

    assert PER_REQUEST == 8 << 20  # the table above is in MiB of it
    budgets: list[int] = []
    init = prefetch.ReadAhead.__init__

    def spy(self, *args, **kwargs):  # the real ReadAhead, its budget noted
        init(self, *args, **kwargs)
        budgets.append(self.budget_bytes)

    monkeypatch.setattr(prefetch.ReadAhead, "__init__", spy)
    manifest = make_shards([6], payload_bytes=1000)
    options = shardkit.SourceOptions(max_concurrent_requests=requests)
    keys = read_keys(
        serve_dataset(manifest) + "/", mode="exact", shuffle=False, source_options=options,
        read_ahead_bytes=read_ahead_mib << 20,
    )  # fmt: skip
    assert keys == expected_keys([6])
    assert budgets == [budget_mib << 20]


def test_public_bucket_reads_unsigned_without_credentials(make_shards, s3_bucket, s3_options, tmp_path, monkeypatch):
    import dataclasses
    import os
    import subprocess
    import sys

    from tests.conftest import sample_payload

    client, bucket = s3_bucket
    local = make_shards(SIZES, payload_bytes=700)
    # A public bucket: anyone may list it and read its objects (moto answers
    # an unsigned request for a private object with 403, as S3 does).
    client.put_bucket_acl(Bucket=bucket, ACL="public-read")
    for name in sorted(os.listdir(local.location)):
        with open(os.path.join(local.location, name), "rb") as f:
            data = f.read()
        client.put_object(Bucket=bucket, Key=f"pub/{name}", Body=data, ACL="public-read")
        if name.endswith(".tar"):  # the shards alone, as published by others
            client.put_object(Bucket=bucket, Key=f"raw/{name}", Body=data, ACL="public-read")
    url = f"s3://{bucket}/pub/"
    without_aws_credentials(monkeypatch, tmp_path)

    # Signed (the default), a machine without credentials is told how to read a public bucket.
    signed = dataclasses.replace(s3_options, connect_timeout_s=4.0)  # a client of its own, made without credentials
    with pytest.raises(shardkit.RemoteError, match=r"no AWS credentials found.*s3_anonymous=True"):
        read_keys(url, mode="exact", source_options=signed)

    # Unsigned: every sample once, its bytes as written, through two DataLoader workers.
    from torch.utils.data import DataLoader

    anonymous = dataclasses.replace(s3_options, s3_anonymous=True)
    dataset = shardkit.ShardDataset(url, mode="exact", seed=1, source_options=anonymous)
    seen = collections.Counter()
    for sample in DataLoader(dataset, batch_size=None, num_workers=2):
        seen[sample["__key__"]] += 1
        assert sample["bin"] == sample_payload(sample["__key__"], 700)
    assert sorted(seen) == expected_keys() and set(seen.values()) == {1}

    # The command line: --s3-anonymous for info and verify; without it, the same advice.
    env = dict(os.environ)
    info = subprocess.run([sys.executable, "-m", "shardkit", "info", url, "--s3-anonymous"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert info.returncode == 0, info.stderr
    assert re.search(rf"samples: +{sum(SIZES)}\n", info.stdout)
    check = subprocess.run([sys.executable, "-m", "shardkit", "verify", url, "--s3-anonymous", "-q", "--workers", "1"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert check.returncode == 0, check.stderr
    refused = subprocess.run([sys.executable, "-m", "shardkit", "info", url], capture_output=True, text=True,
                             env=env, timeout=120)
    assert refused.returncode != 0 and "--s3-anonymous" in refused.stderr, refused.stderr

    # The shards alone, indexed in place into a local folder, then read from the bucket.
    out = tmp_path / "index"
    indexed = subprocess.run(
        [sys.executable, "-m", "shardkit", "index", f"s3://{bucket}/raw/", "--out", str(out), "--s3-anonymous",
         "--workers", "1", "-q"], capture_output=True, text=True, env=env, timeout=120,
    )
    assert indexed.returncode == 0, indexed.stderr
    assert sorted(read_keys(str(out), mode="exact", source_options=anonymous)) == expected_keys()


def test_s3_anonymous_must_be_a_bool():
    from shardkit.io.base import SourceOptions
    from shardkit.write.download import DownloadOptions

    with pytest.raises(shardkit.UsageError, match="s3_anonymous must be True or False, got 'yes'"):
        SourceOptions(s3_anonymous="yes")
    with pytest.raises(shardkit.UsageError, match="s3_anonymous must be True or False"):
        DownloadOptions(s3_anonymous=1)


def test_a_folder_of_shards_without_a_manifest_says_how_to_index_it(make_shards, http_server):
    manifest = make_shards([3, 4], with_manifest=False)
    for entry in manifest.shards:
        with open(f"{manifest.location}/{entry.path}", "rb") as f:
            http_server.add(f"/pub/{entry.path}", f.read())
    base = http_server.base_url + "/pub"
    with pytest.raises(shardkit.ManifestError, match=rf"{base}/manifest\.json: no manifest here.*`shardkit index {base}/ --out DIR`"):
        shardkit.ShardDataset(base + "/", source_options=fast_options())
    # At shard granularity they read as they are.
    urls = [f"{base}/{entry.path}" for entry in manifest.shards]
    assert sorted(read_keys(urls, mode="exact", source_options=fast_options())) == expected_keys([3, 4])
