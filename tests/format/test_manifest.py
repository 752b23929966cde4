"""The manifest round-trips, and bad manifests are refused with the reason."""

from __future__ import annotations

import json

import pytest

from shardkit.errors import ManifestError
from shardkit.format.manifest import Manifest, load_manifest


def test_manifest_roundtrip_is_byte_stable(make_shards):
    manifest = make_shards([3, 0, 2])
    text = manifest.to_json()
    again = Manifest.from_json(text, location=manifest.location)
    assert again == manifest and again.to_json() == text
    assert again.num_samples == 5 and again.num_shards == 3


def test_load_from_directory_resolves_shards(make_shards):
    manifest = make_shards([2])
    loaded = load_manifest(manifest.location)
    assert loaded.resolve(loaded.shards[0].path).startswith(manifest.location)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format_version": 99}, "format_version 99"),
        ({"format": "other"}, "not a shardkit manifest"),
        ({"num_samples": 1234}, "num_samples=4 but .* says 1234"),
    ],
)
def test_bad_manifest_is_refused_with_reason(make_shards, tmp_path, change, message):
    manifest = make_shards([2, 2])
    data = json.loads(manifest.to_json())
    data.update(change)
    path = tmp_path / "ds" / "bad.json"  # beside its shard table
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=message):
        load_manifest(str(path))


def test_missing_manifest_says_what_to_do(tmp_path):
    with pytest.raises(ManifestError, match="no manifest here"):
        load_manifest(str(tmp_path))


def test_a_path_that_does_not_exist_is_named_as_such(tmp_path):
    for path in (tmp_path / "nothere", tmp_path / "nothere" / "manifest.json"):
        with pytest.raises(ManifestError, match="no such dataset"):
            load_manifest(str(path))
