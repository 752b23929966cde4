"""The shard table beside a format-2 manifest: round trips, format 1 still
loading, and every way a table can disagree with its manifest."""

from __future__ import annotations

import json
import logging
import os
import pickle

import numpy as np
import pytest

from shardkit.errors import ManifestError
from shardkit.format.manifest import MANIFEST_NAME, Manifest, ShardEntry, load_manifest
from shardkit.format.table import WRITER_NAMING, build_table, decode_table, open_table, table_name


def _table_path(manifest: Manifest) -> str:
    return os.path.join(manifest.location, json.loads(manifest.to_json())["table"]["path"])


def _edit_json(location: str, **changes) -> None:
    file = os.path.join(location, MANIFEST_NAME)
    data = json.loads(open(file).read())
    data.update(changes)
    with open(file, "w") as f:
        json.dump(data, f)


def test_written_dataset_has_a_small_manifest_and_a_table_named_by_content(make_shards):
    manifest = make_shards([3, 0, 2])
    data = json.loads(open(os.path.join(manifest.location, MANIFEST_NAME)).read())
    assert data["format_version"] == 2 and "shards" not in data
    assert data["naming"] == {"shard": "shard-{:06d}.tar", "index": "shard-{:06d}.idx"}
    assert data["table"]["path"] == table_name(data["table"]["sha256"])
    loaded = load_manifest(manifest.location)
    assert loaded == manifest and loaded.fingerprint == manifest.fingerprint
    assert loaded.table.file == _table_path(manifest)
    assert list(loaded.table.starts) == [0, 3, 3, 5]
    assert not loaded.table.counts.flags.writeable


def test_paths_off_the_naming_are_stored_as_strings(tmp_path):
    entries = [ShardEntry(f"sub/ü-{i}.tar", i + 1, 10 * i, f"{i:02x}" * 32, f"sub/ü-{i}.idx") for i in range(4)]
    manifest = Manifest(shards=entries)
    assert manifest.table.naming is None
    again = decode_table(manifest.table.encode(), None)
    assert [again.entry(i) for i in range(4)] == entries
    assert manifest.shards[1:3] == tuple(entries[1:3]) and list(manifest.shards) == entries


def test_format1_manifest_loads_logs_once_and_keeps_its_fingerprint(make_shards, caplog):
    manifest = make_shards([2, 5])
    fingerprint = manifest.fingerprint
    with open(os.path.join(manifest.location, MANIFEST_NAME), "w") as f:
        f.write(manifest.to_format1_json())
    with caplog.at_level(logging.WARNING, logger="shardkit.format.manifest"):
        first = load_manifest(manifest.location)
        load_manifest(manifest.location)
    assert first.loaded_version == 1 and first == manifest and first.fingerprint == fingerprint
    lines = [r.getMessage() for r in caplog.records if "shardkit upgrade" in r.getMessage()]
    assert len(lines) == 1 and manifest.location in lines[0]


def test_manifest_pickles_as_where_its_table_is(make_shards):
    loaded = load_manifest(make_shards([4] * 50).location)
    data = pickle.dumps(loaded)
    assert len(data) < 2000 and b"shard-000049" not in data
    again = pickle.loads(data)
    assert again == loaded and again.table.file == loaded.table.file


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_samples": 11}, r"adds up to num_samples=10 but .* says 11"),
        ({"num_bytes": 5}, r"adds up to num_bytes=\d+ but .* says 5"),
        ({"num_shards": 3}, r"adds up to num_shards=2 but .* says 3"),
    ],
)
def test_table_that_disagrees_with_the_manifest_is_refused(make_shards, change, message):
    manifest = make_shards([4, 6])
    _edit_json(manifest.location, **change)
    with pytest.raises(ManifestError, match=message) as info:
        load_manifest(manifest.location)
    assert _table_path(manifest) in str(info.value) and "shardkit verify" in str(info.value)


def test_table_of_other_counts_with_the_same_totals_is_refused_by_its_checksum(make_shards):
    manifest = make_shards([4, 6])
    other = build_table([6, 4], manifest.table.num_bytes, manifest.table.sha256)
    path = _table_path(manifest)
    with open(path, "wb") as f:
        f.write(other.encode())
    with pytest.raises(ManifestError, match=r"SHA-256 .* the manifest says") as info:
        load_manifest(manifest.location)
    assert path in str(info.value) and "shardkit upgrade" in str(info.value)


def test_truncated_table_is_refused(make_shards):
    manifest = make_shards([4, 6])
    path = _table_path(manifest)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ManifestError, match=r"bytes, the manifest says .*truncated"):
        load_manifest(manifest.location)
    # and without the manifest's size: the structure check finds it
    with pytest.raises(ManifestError, match="truncated|past the end|ends at byte"):
        open_table(path, naming=WRITER_NAMING)


def test_missing_table_is_refused_naming_it(make_shards):
    manifest = make_shards([1])
    os.unlink(_table_path(manifest))
    with pytest.raises(ManifestError, match="shard table missing") as info:
        load_manifest(manifest.location)
    assert _table_path(manifest) in str(info.value)


@pytest.mark.parametrize(
    "damage",
    [
        lambda a: a.__setitem__("starts", np.array([0, 5, 3], dtype=np.int64)),  # falls
        lambda a: a.__setitem__("counts", np.array([1, 1], dtype=np.int64)),  # disagrees with starts
        lambda a: a.__setitem__("num_bytes", np.array([1, 2, 3], dtype=np.int64)),  # wrong shard count
        lambda a: a.__setitem__("sha256", np.zeros((2, 31), dtype=np.uint8)),
        lambda a: a.__setitem__("num_bytes", np.array([1.0, 2.0])),  # wrong dtype
    ],
)
def test_hostile_table_columns_are_refused(tmp_path, damage):
    from shardkit.format.table import encode_columns

    arrays = {
        "starts": np.array([0, 2, 5], dtype=np.int64),
        "counts": np.array([2, 3], dtype=np.int64),
        "num_bytes": np.array([10, 20], dtype=np.int64),
        "sha256": np.zeros((2, 32), dtype=np.uint8),
    }
    damage(arrays)
    path = tmp_path / "shards-0000000000000000.table"
    path.write_bytes(encode_columns(list(arrays.values())))
    with pytest.raises(ManifestError, match="damaged shard table") as info:
        open_table(str(path), naming=WRITER_NAMING)
    assert str(path) in str(info.value)


def test_garbage_table_is_refused(tmp_path):
    path = tmp_path / "shards-0000000000000000.table"
    path.write_bytes(b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 100)
    with pytest.raises(ManifestError, match="damaged shard table"):
        open_table(str(path), naming=WRITER_NAMING)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"naming": {"shard": "../x-{:06d}.tar", "index": "x-{:06d}.idx"}}, "'naming' must be"),
        ({"naming": {"shard": "a/{:06d}.tar", "index": "x-{:06d}.idx"}}, "'naming' must be"),
        ({"naming": {"shard": "x-{:099999d}.tar", "index": "x-{:06d}.idx"}}, "'naming' must be"),
        ({"table": {"path": "../shards-0123456789abcdef.table", "num_bytes": 1, "sha256": "0" * 64}}, "'table' path"),
        ({"table": {"path": "shards-0123456789abcdef.table", "num_bytes": -1, "sha256": "0" * 64}}, "'table' num_bytes"),
        ({"fingerprint": None}, "'fingerprint' must be 64 hex digits"),
        ({"num_shards": "2"}, "'num_shards' must be"),
    ],
)
def test_hostile_format2_fields_are_refused(make_shards, change, message):
    manifest = make_shards([1, 1])
    _edit_json(manifest.location, **change)
    with pytest.raises(ManifestError, match=message):
        load_manifest(manifest.location)
