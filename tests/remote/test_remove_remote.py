"""Removing samples from a local index of shards in an S3-compatible store
(issue #41): ``shardkit index s3://... --out DIR``, then ``remove_samples(DIR,
keys)`` reads the shards from the bucket, leaves them as they are, and every
reader of DIR leaves the samples out; indexing into DIR again is refused."""

from __future__ import annotations

import os

import pytest
import torch

from shardkit import IndexedDataset, IndexOptions, ShardDataset, index_dataset, make_loader, remove_samples
from shardkit.errors import DestinationError
from tests.index.test_index import as_dict, wds_samples, write_wds


def test_a_local_index_of_remote_shards_drops_the_removed_samples_everywhere(tmp_path, s3_bucket, s3_options):
    client, bucket = s3_bucket
    shards = write_wds(tmp_path / "src", num=14, per_shard=4)
    for path in shards:
        client.upload_file(path, bucket, "pub/" + os.path.basename(path))
    etags = [client.head_object(Bucket=bucket, Key="pub/" + os.path.basename(p))["ETag"] for p in shards]
    out = str(tmp_path / "idx")
    index_dataset(f"s3://{bucket}/pub/", out=out, options=IndexOptions(workers=1, source=s3_options))
    gone = ["k0000", "k0005", "k0006", "k0013"]
    report = remove_samples(out, [*gone, "k9999"], options=s3_options, workers=2)
    assert report.num_removed == 4 and report.missing == ("k9999",)
    assert [client.head_object(Bucket=bucket, Key="pub/" + os.path.basename(p))["ETag"] for p in shards] == etags
    expected = {k: v for k, v in wds_samples(shards).items() if k not in gone}
    ds = ShardDataset(out, mode="exact", seed=3, source_options=s3_options)
    assert len(ds) == 10
    assert as_dict(make_loader(ds, batch_size=None, num_workers=2)) == expected  # the same bytes, none removed
    indexed = IndexedDataset(out, source_options=s3_options)
    assert sorted(indexed[i]["__key__"] for i in range(len(indexed))) == sorted(expected)
    loader = torch.utils.data.DataLoader(indexed, batch_size=None, num_workers=2, collate_fn=lambda s: s["__key__"])
    assert sorted(loader) == sorted(expected)
    with pytest.raises(DestinationError, match=r"4 samples were removed from this index.*Index into a new --out"):
        index_dataset(f"s3://{bucket}/pub/", out=out, options=IndexOptions(workers=1, source=s3_options))
