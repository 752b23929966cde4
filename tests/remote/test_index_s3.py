"""`shardkit index s3://bucket/prefix/`: listed with ETags, read once, indexed into a local or s3:// --out."""

from __future__ import annotations

import os
import tarfile

from shardkit import IndexOptions, ShardDataset, index_dataset
from tests.index.test_index import as_dict, wds_samples, write_wds


def test_s3_folder_indexed_into_local_and_s3_out_and_reindexed_by_etag(tmp_path, s3_bucket, s3_options):
    client, bucket = s3_bucket
    shards = write_wds(tmp_path / "src", num=14, per_shard=4)
    for path in shards + [str(tmp_path / "src" / "00000.parquet")]:
        client.upload_file(path, bucket, "pub/" + os.path.basename(path))
    options = IndexOptions(workers=1, source=s3_options)
    out = str(tmp_path / "idx")
    report = index_dataset(f"s3://{bucket}/pub/", out=out, options=options)
    assert report.num_indexed == 4 and report.manifest.shards_base == f"s3://{bucket}/pub"
    expected = wds_samples(shards)
    assert as_dict(ShardDataset(out, mode="exact", shuffle=False, source_options=s3_options)) == expected
    assert index_dataset(f"s3://{bucket}/pub/", out=out, options=options).num_unchanged == 4
    # same size, other bytes: a new ETag, so read again
    with tarfile.open(shards[2]) as tar:
        at = next(m for m in tar.getmembers() if m.name.endswith(".jpg")).offset_data
    data = bytearray(open(shards[2], "rb").read())
    data[at] ^= 1
    client.put_object(Bucket=bucket, Key="pub/" + os.path.basename(shards[2]), Body=bytes(data))
    again = index_dataset(f"s3://{bucket}/pub/", out=out, options=options)
    assert (again.num_indexed, again.num_unchanged) == (1, 3)
    # the index itself on s3: the manifest there declares the s3 base
    remote_out = f"s3://{bucket}/idx"
    index_dataset(f"s3://{bucket}/pub/", out=remote_out, options=options)
    got = as_dict(ShardDataset(remote_out + "/", mode="exact", shuffle=False, source_options=s3_options))
    assert set(got) == set(expected)
