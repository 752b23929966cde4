"""bench_remote.py's s3:// form: what webdataset is given, and what shardkit is compared with."""

from __future__ import annotations

from bench import bench_remote


def test_webdataset_reads_s3_through_the_aws_cli_or_as_s3_urls_for_its_boto3_opener():
    paths = ["shard-000000.tar", "shard-000001.tar"]
    assert bench_remote.webdataset_urls("s3", "s3://data", paths, "http://10.211.0.2:8089") == [
        f"pipe:aws s3 cp --endpoint-url http://10.211.0.2:8089 --quiet s3://data/{p} -" for p in paths
    ]
    assert bench_remote.webdataset_urls("s3", "s3://data", paths, None) == [f"s3://data/{p}" for p in paths]
    assert bench_remote.webdataset_urls("http", "http://h:1", paths, None) == [f"http://h:1/{p}" for p in paths]
    # Throwaway credentials only, and no instance-metadata lookups from the bench.
    assert bench_remote.EMULATION_AWS_ENV["AWS_ACCESS_KEY_ID"] == "shardkit-bench"
    assert bench_remote.EMULATION_AWS_ENV["AWS_EC2_METADATA_DISABLED"] == "true"


def test_shardkit_is_compared_with_webdatasets_best_form_at_each_worker_count():
    def row(tool, workers, mbps, first):
        return {"tool": tool, "workers": workers, "MB_per_s": mbps, "first_batch_s": first}

    rows = [
        row("shardkit", 1, 140.0, 0.2),
        row("webdataset", 1, 20.0, 1.0),  # the CLI pipe: slower, later
        row("webdataset_boto3", 1, 28.0, 0.5),
        row("shardkit", 8, 150.0, 0.4),
        row("webdataset", 8, 60.0, 0.8),  # faster here, but later than the opener
        row("webdataset_boto3", 8, 50.0, 0.5),
    ]
    bench_remote.compare_with_webdataset(rows)
    by = {(r["tool"], r["workers"]): r for r in rows}
    assert by["shardkit", 1]["vs_webdataset"] == 5.0 and by["shardkit", 1]["first_batch_vs_webdataset"] == 0.4
    assert by["shardkit", 8]["vs_webdataset"] == 2.5 and by["shardkit", 8]["first_batch_vs_webdataset"] == 0.8
    assert by["webdataset", 1]["vs_webdataset"] == round(20 / 28, 2)
    lone = [row("shardkit", 2, 100.0, 0.3)]
    bench_remote.compare_with_webdataset(lone)
    assert lone[0]["vs_webdataset"] is None and lone[0]["first_batch_vs_webdataset"] is None
