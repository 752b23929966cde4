"""open_destination: one registry maps a URL scheme to its writing backend."""

from __future__ import annotations

import pytest

from shardkit.errors import UsageError
from shardkit.io.fsspec import FsspecDestination
from shardkit.io.local import LocalDestination
from shardkit.io.registry import open_destination


def test_local_paths_and_file_urls_are_local_destinations(tmp_path):
    for url in (str(tmp_path), f"file://{tmp_path}"):
        dest = open_destination(url)
        assert isinstance(dest, LocalDestination) and dest.local_dir == str(tmp_path)


def test_other_schemes_go_to_fsspec_without_a_local_dir():
    dest = open_destination("memory://registry-test/ds/")
    assert isinstance(dest, FsspecDestination) and dest.local_dir is None
    assert dest.url == "memory://registry-test/ds" and dest.atomic_put is False


def test_s3_urls_are_s3_destinations(monkeypatch):
    pytest.importorskip("boto3")
    from shardkit.io.s3 import S3Destination

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    dest = open_destination("s3://bucket/prefix/ds")
    assert isinstance(dest, S3Destination) and (dest.bucket, dest.prefix) == ("bucket", "prefix/ds/")
    assert dest.object_url("manifest.json") == "s3://bucket/prefix/ds/manifest.json"


@pytest.mark.parametrize("url", ["https://user:secret@host/ds?sig=abc", "pipe:cat x", "http://host/ds"])
def test_unwritable_schemes_are_refused_without_secrets(url):
    with pytest.raises(UsageError, match="cannot write to") as info:
        open_destination(url)
    assert "secret" not in str(info.value) and "sig=" not in str(info.value)
