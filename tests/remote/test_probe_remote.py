"""``shardkit bench`` (issue #56) over http:// and s3:// (servers on
127.0.0.1): the ceiling is read through the reader's own sources, and the
loader's bytes are the shards' bytes."""

from __future__ import annotations

import os

from shardkit.probe.measure import bench_dataset

SIZES = [20, 20, 20]
PAYLOAD = 5000


def _check(rows, shard_bytes: int) -> None:
    assert [r.workers for r in rows] == [0, 1]
    for row in rows:
        assert row.ceiling.nbytes >= shard_bytes and row.ceiling.cold is None  # read whole, nothing local to drop
        assert row.raw.samples >= sum(SIZES) and row.raw.nbytes >= shard_bytes
        assert row.raw.nbytes <= shard_bytes * (row.raw.samples // sum(SIZES) + 1)  # whole epochs, and a part
        assert row.verdict.split(":")[0] in ("storage-bound", "CPU-bound", "hand-off-bound")


def test_bench_over_http(make_shards, serve_dataset, http_server):
    manifest = make_shards(SIZES, payload_bytes=PAYLOAD)
    url = serve_dataset(manifest)
    rows = bench_dataset(url, workers=[0, 1], seconds=0.5, batch_size=8)
    _check(rows, sum(s.num_bytes for s in manifest.shards))
    sent = sum(n for path, n in http_server.sent.items() if path.endswith(".tar"))
    assert sent >= sum(r.ceiling.nbytes + r.raw.nbytes for r in rows)  # no byte reported that the server did not send


def test_bench_over_s3(make_shards, s3_bucket, s3_options):
    client, bucket = s3_bucket
    manifest = make_shards(SIZES, payload_bytes=PAYLOAD)
    for name in sorted(os.listdir(manifest.location)):
        with open(os.path.join(manifest.location, name), "rb") as f:
            client.put_object(Bucket=bucket, Key=f"ds/{name}", Body=f.read())
    rows = bench_dataset(f"s3://{bucket}/ds/", workers=[0, 1], seconds=0.5, batch_size=8,
                         dataset_kwargs={"source_options": s3_options})  # fmt: skip
    _check(rows, sum(s.num_bytes for s in manifest.shards))
