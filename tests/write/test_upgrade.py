"""``shardkit upgrade``: format 1 to the current format in place, atomically and idempotently."""

from __future__ import annotations

import json
import os

import pytest

from shardkit.cli import main
from shardkit.errors import UsageError
from shardkit.format.manifest import MANIFEST_NAME, load_manifest
from shardkit.read.catalog import resolve_catalog
from shardkit.io.base import SourceOptions
from shardkit.write.publish import upgrade_dataset


def _format1(manifest) -> dict[str, bytes]:
    """Turn a written dataset into what shardkit wrote before the table; returns its files."""
    with open(os.path.join(manifest.location, MANIFEST_NAME), "w") as f:
        f.write(manifest.to_format1_json())
    for name in os.listdir(manifest.location):
        if name.endswith(".table"):
            os.unlink(os.path.join(manifest.location, name))
    return _files(manifest.location)


def _files(folder: str) -> dict[str, bytes]:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


def test_upgrade_rewrites_the_manifest_only_and_a_second_run_changes_nothing(make_shards, capsys):
    manifest = make_shards([3, 0, 4])
    before = _format1(manifest)
    old_fingerprint = resolve_catalog(manifest.location, options=SourceOptions()).fingerprint

    assert main(["upgrade", manifest.location]) == 0
    out = capsys.readouterr().out
    assert "from format 1 to 2: 3 shards" in out and "shards untouched" in out
    after = _files(manifest.location)
    assert {n: b for n, b in after.items() if n.startswith("shard-")} == {
        n: b for n, b in before.items() if n.startswith("shard-")
    }
    assert json.loads(after[MANIFEST_NAME])["format_version"] == 2
    upgraded = load_manifest(manifest.location)
    assert upgraded.loaded_version == 2 and upgraded == manifest
    # a reader state saved on format 1 carries the same fingerprint: it still resumes
    assert resolve_catalog(manifest.location, options=SourceOptions()).fingerprint == old_fingerprint

    assert main(["upgrade", manifest.location]) == 0
    assert "already in format 2; nothing to do" in capsys.readouterr().out
    assert _files(manifest.location) == after


def test_upgrade_is_the_same_bytes_as_writing_format_2(make_shards):
    manifest = make_shards([2, 2])
    written = _files(manifest.location)
    _format1(manifest)
    report = upgrade_dataset(manifest.location)
    assert report.upgraded and report.num_shards == 2 and report.table_bytes == len(written[report.table_name])
    assert _files(manifest.location) == written


def test_interrupted_upgrade_leaves_the_old_format_and_a_rerun_completes(make_shards):
    manifest = make_shards([5, 1])
    written = _files(manifest.location)
    _format1(manifest)
    # killed after writing the table, before replacing manifest.json
    table = next(n for n in written if n.endswith(".table"))
    with open(os.path.join(manifest.location, table), "wb") as f:
        f.write(written[table])
    with open(os.path.join(manifest.location, "shards-00000000deadbeef.table.tmp"), "wb") as f:
        f.write(b"half")
    still_old = load_manifest(manifest.location)
    assert still_old.loaded_version == 1 and still_old == manifest
    assert upgrade_dataset(manifest.location).upgraded
    assert _files(manifest.location) == written  # the stray temporary is gone too


def test_stray_table_beside_a_current_manifest_is_ignored_then_removed(make_shards):
    manifest = make_shards([5, 1])
    written = _files(manifest.location)
    stray = os.path.join(manifest.location, "shards-0123456789abcdef.table")
    with open(stray, "wb") as f:
        f.write(b"left by a killed upgrade")
    assert load_manifest(manifest.location) == manifest
    report = upgrade_dataset(manifest.location)
    assert not report.upgraded and report.removed == ("shards-0123456789abcdef.table",)
    assert _files(manifest.location) == written


def test_upgrade_refuses_http():
    with pytest.raises(UsageError, match="read-only; upgrade the dataset where it is stored"):
        upgrade_dataset("https://example.invalid/ds")


def test_upgrade_does_not_advise_running_itself_but_a_reader_does(make_shards, caplog):
    manifest = make_shards([2, 1])
    _format1(manifest)
    hint = "run `shardkit upgrade"
    with caplog.at_level("WARNING"):
        upgrade_dataset(manifest.location)
    assert not [r for r in caplog.records if hint in r.getMessage()]
    other = make_shards([1], name="other")
    _format1(other)
    with caplog.at_level("WARNING"):
        resolve_catalog(other.location, options=SourceOptions())
    assert len([r for r in caplog.records if hint in r.getMessage()]) == 1


def _renamed_format1(manifest, name) -> None:
    """Rename a written dataset's shards and indexes by ``name(i)`` (a stem)
    and leave it in format 1, listing them under those names."""
    data = json.loads(manifest.to_format1_json())
    _format1(manifest)
    for i, entry in enumerate(data["shards"]):
        for key, suffix in (("path", ".tar"), ("index", ".idx")):
            os.makedirs(os.path.dirname(os.path.join(manifest.location, name(i))), exist_ok=True)
            os.replace(os.path.join(manifest.location, entry[key]), os.path.join(manifest.location, name(i) + suffix))
            entry[key] = name(i) + suffix
    with open(os.path.join(manifest.location, MANIFEST_NAME), "w") as f:
        json.dump(data, f)


def test_upgrade_of_names_numbered_otherwise_than_the_writer_records_their_pattern(make_shards):
    """Issue #42: `shard-0000000.tar` (7 digits) is one naming pattern, as
    `shardkit index` finds it; the table stores no path per shard."""
    manifest = make_shards([3, 0, 4])
    _renamed_format1(manifest, lambda i: f"train-{i:07d}")
    old_fingerprint = load_manifest(manifest.location).fingerprint
    assert upgrade_dataset(manifest.location).upgraded
    data = json.loads(open(os.path.join(manifest.location, MANIFEST_NAME)).read())
    assert data["naming"] == {"shard": "train-{:07d}.tar", "index": "train-{:07d}.idx"}
    upgraded = load_manifest(manifest.location)
    assert upgraded.table.path_columns() is None and upgraded.fingerprint == old_fingerprint
    assert [s.path for s in upgraded.shards] == [f"train-{i:07d}.tar" for i in range(3)]
    catalog = resolve_catalog(manifest.location, options=SourceOptions())
    assert catalog.url(2) == os.path.join(manifest.location, "train-0000002.tar") and catalog.num_samples == 7


@pytest.mark.parametrize(
    "name",
    [lambda i: f"train-{i + 1:07d}", lambda i: f"sub/shard-{i:06d}", lambda i: f"s{i:06d}" if i != 1 else "x000001"],
    ids=["from-one", "subfolder", "one-off"],
)
def test_upgrade_of_names_without_one_pattern_stores_every_path(make_shards, name):
    manifest = make_shards([3, 0, 4])
    _renamed_format1(manifest, name)
    assert upgrade_dataset(manifest.location).upgraded
    data = json.loads(open(os.path.join(manifest.location, MANIFEST_NAME)).read())
    assert "naming" not in data
    upgraded = load_manifest(manifest.location)
    assert [s.path for s in upgraded.shards] == [name(i) + ".tar" for i in range(3)]
    assert [s.index for s in upgraded.shards] == [name(i) + ".idx" for i in range(3)]
