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


_KILLED_INDEX = """
import os, signal, sys
from shardkit import IndexOptions, SourceOptions, index_dataset
done = []
def progress(result):
    done.append(result)
    if len(done) == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup runs: as the OOM killer leaves it
options = IndexOptions(workers=1, source=SourceOptions(cache_dir=sys.argv[3]))
index_dataset(sys.argv[1], out=sys.argv[2], options=options, progress=progress)
"""


def test_a_killed_index_into_s3_is_gone_on_from_by_its_rerun(tmp_path, s3_bucket, s3_options):
    """An s3:// --out keeps its journal on this machine (under cache_dir): the
    rerun reads only the shards the killed run had not, and cleans it up."""
    import dataclasses
    import subprocess
    import sys

    client, bucket = s3_bucket
    shards = write_wds(tmp_path / "src", num=24, per_shard=4)  # 6 shards
    for path in shards:
        client.upload_file(path, bucket, "pub/" + os.path.basename(path))
    source, out, cache = f"s3://{bucket}/pub/", f"s3://{bucket}/idx", tmp_path / "cache"
    killed = subprocess.run([sys.executable, "-c", _KILLED_INDEX, source, out, str(cache)], timeout=120)
    assert killed.returncode == -9
    (journal,) = (cache / "index-journals").iterdir()
    assert "results" in os.listdir(journal)

    options = IndexOptions(workers=1, source=dataclasses.replace(s3_options, cache_dir=str(cache)))
    report = index_dataset(source, out=out, options=options)
    assert (report.num_resumed, report.num_indexed) == (3, 3)
    assert list((cache / "index-journals").iterdir()) == []  # published: the journal is gone
    got = as_dict(ShardDataset(out + "/", mode="exact", shuffle=False, source_options=s3_options))
    assert got == wds_samples(shards)
