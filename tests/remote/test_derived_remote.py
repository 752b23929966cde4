"""Views and extensions published on a web server and in an S3 bucket (issue #54):
read as one dataset through the same relative parent names, their rows tables
fetched through the table cache; a parent on another origin needs the opt-in."""

from __future__ import annotations

import os

import pytest

import shardkit
from shardkit import IndexedDataset, ShardDataset
from shardkit.errors import ManifestError
from shardkit.io.base import SourceOptions
from tests.conftest import build_dataset
from tests.revise import derived_maps


def _tree(tmp_path):
    """A pool, an extension of it and a view of the extension, side by side."""
    pool = str(tmp_path / "tree" / "pool")
    build_dataset(pool, (7, 0, 9, 5))
    shardkit.extend(pool, tmp_path / "tree" / "ext", map=derived_maps.embedding, workers=1)
    shardkit.view(tmp_path / "tree" / "ext", tmp_path / "tree" / "view", where="json.i < 5", workers=1)
    expected = {s["__key__"]: s["emb.npy"] if "emb.npy" in s else None for s in ShardDataset(tmp_path / "tree" / "view")}
    return str(tmp_path / "tree"), expected


def _files(root):
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            yield os.path.relpath(path, root).replace(os.sep, "/"), path


def _read(url, options):
    return {s["__key__"]: s.get("emb.npy") for s in ShardDataset(url, source_options=options)}


def test_a_view_of_an_extension_reads_over_http(tmp_path, http_server):
    root, expected = _tree(tmp_path)
    for relative, path in _files(root):
        with open(path, "rb") as f:
            http_server.add(f"/tree/{relative}", f.read())
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), retry_deadline_s=3.0)
    url = http_server.base_url + "/tree/view"
    assert _read(url, options) == expected
    indexed = IndexedDataset(url, source_options=options, fields=["emb.npy"])
    assert sorted(indexed[i]["__key__"] for i in range(len(indexed))) == sorted(expected)
    # The same view, local, naming its parent by URL: another origin, refused unless allowed.
    local = tmp_path / "local-view"
    with pytest.raises(ManifestError, match="allowed_prefixes"):
        shardkit.view([http_server.base_url + "/tree/ext"], local, where="json.i < 5", workers=1,
                      source_options=options)
        ShardDataset(local, source_options=options)
    allowed = SourceOptions(cache_dir=str(tmp_path / "cache"), allowed_prefixes=[http_server.base_url + "/tree/"])
    assert _read(local, allowed) == expected


def test_a_view_of_an_extension_reads_from_s3(tmp_path, s3_bucket, s3_options):
    client, bucket = s3_bucket
    root, expected = _tree(tmp_path)
    for relative, path in _files(root):
        client.upload_file(path, bucket, f"tree/{relative}")
    assert _read(f"s3://{bucket}/tree/view", s3_options) == expected


def test_a_takedown_on_a_remote_parent_reaches_a_view_read_through_a_warm_cache(tmp_path, http_server):
    """The shards and tables a view read before are in the cache; the parent's manifest is not cached, so its
    new revision (a takedown) is seen by the next open, and the removed samples are never yielded again."""
    from shardkit.revise.remove import remove_samples

    root, expected = _tree(tmp_path)

    def publish() -> None:
        for relative, path in _files(root):
            with open(path, "rb") as f:
                http_server.add(f"/tree/{relative}", f.read())

    publish()
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), retry_deadline_s=3.0)
    url = http_server.base_url + "/tree/view"
    assert _read(url, options) == expected
    gone = sorted(expected)[:2]
    remove_samples(os.path.join(root, "pool"), gone)
    publish()  # the pool's new manifest and table on the server; the view's files unchanged
    again = _read(url, options)
    assert again == {k: v for k, v in expected.items() if k not in gone}
    assert len(ShardDataset(url, source_options=options)) == len(again)
