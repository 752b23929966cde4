"""A table column of local file paths is read as a JSONL row's paths are:
resolved against the table's folder, confined to ``files_root``, sized when
scanned and read while the shard is written."""

from __future__ import annotations

import csv
import os

import pytest

import shardkit
from shardkit.cli import main
from shardkit.errors import InputFileError, SourceError
from shardkit.format.manifest import load_manifest
from shardkit.write.parallel import WriteOptions, write_dataset
from tests.write.url_servers import photo_jpeg

ROWS = 30


def local_image_table(root) -> dict[str, bytes]:
    """``root/meta.csv`` naming ``raw/img_NN.jpg`` (real JPEGs) per row;
    returns the sample keys' image bytes."""
    (root / "raw").mkdir(parents=True)
    images = {}
    with open(root / "meta.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "caption"])
        for i in range(ROWS):
            data = photo_jpeg(64 + i, 48, seed=i)
            (root / "raw" / f"img_{i:02d}.jpg").write_bytes(data)
            writer.writerow([f"raw/img_{i:02d}.jpg", f"photo {i}"])
            images[f"{i:09d}"] = data
    return images


def stored(folder) -> dict[str, dict[str, bytes]]:
    return {
        s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
        for s in shardkit.ShardDataset(str(folder), shuffle=False)
    }


def test_a_csv_of_local_image_paths_writes_every_row_with_the_files_bytes(tmp_path):
    images = local_image_table(tmp_path)
    dest = tmp_path / "out"
    args = ["--field", "jpg=file", "--field", "txt=caption", "--files-root", str(tmp_path / "raw"), "-q"]
    assert main(["write", str(tmp_path / "meta.csv"), str(dest), *args]) == 0
    manifest = load_manifest(str(dest))
    assert manifest.num_samples == ROWS and manifest.num_skipped == 0
    samples = stored(dest)
    assert {key: s["jpg"] for key, s in samples.items()} == images
    assert samples["000000007"]["txt"] == b"photo 7"


def test_local_files_are_sized_when_scanned_so_max_bytes_cuts_the_shards(tmp_path):
    images = local_image_table(tmp_path)
    max_bytes = 4 * max(len(data) for data in images.values())
    options = WriteOptions(fields=("jpg=file",), max_bytes=max_bytes, shuffle=False, workers=1)
    manifest = write_dataset(str(tmp_path / "meta.csv"), str(tmp_path / "out"), options=options).manifest
    assert manifest.num_samples == ROWS and manifest.num_shards > 1
    assert all(entry.num_bytes <= max_bytes for entry in manifest.shards)
    assert manifest.shards[0].num_bytes > max_bytes // 2  # cut by bytes, not at a default count


def test_a_row_naming_a_file_outside_the_files_root_is_refused(tmp_path):
    (tmp_path / "secret").write_text("key")
    (tmp_path / "data").mkdir()
    for value in ("../secret", str(tmp_path / "secret")):
        with open(tmp_path / "data" / "meta.csv", "w", newline="") as f:
            csv.writer(f).writerows([["file"], [value]])
        with pytest.raises(SourceError) as caught:
            write_dataset(str(tmp_path / "data" / "meta.csv"), str(tmp_path / "out"),
                          options=WriteOptions(fields=("jpg=file",)))  # fmt: skip
        message = str(caught.value)
        assert message.startswith(f"{tmp_path / 'data' / 'meta.csv'}: row 0: field 'jpg' refers to ")
        assert f"outside {tmp_path / 'data'}, the folder row paths must stay in" in message
        assert "pass --files-root with a folder that holds the files" in message
        assert not (tmp_path / "out").exists()


def test_a_missing_file_fails_naming_its_row_or_is_recorded_under_skip(tmp_path):
    local_image_table(tmp_path)
    os.remove(tmp_path / "raw" / "img_04.jpg")
    source, options = str(tmp_path / "meta.csv"), WriteOptions(fields=("jpg=file",), workers=1)
    with pytest.raises(SourceError, match=r"meta\.csv: row 4: field 'jpg' refers to .*img_04\.jpg: cannot read input file"):
        write_dataset(source, str(tmp_path / "a"), options=options)
    skip = WriteOptions(fields=("jpg=file",), workers=1, on_error="skip")
    manifest = write_dataset(source, str(tmp_path / "b"), options=skip).manifest
    assert manifest.num_samples == ROWS - 1 and [s.path for s in manifest.skipped] == [f"{source}#row=4"]
    assert "img_04.jpg" in manifest.skipped[0].reason


def test_a_file_gone_after_the_scan_fails_the_shard_naming_the_row(tmp_path, monkeypatch):
    local_image_table(tmp_path)
    from shardkit.write.sources import table

    real = table.table_rows

    def remove_then_write(*args, **kwargs):
        os.remove(tmp_path / "raw" / "img_09.jpg")  # between the scan and the shard
        return real(*args, **kwargs)

    monkeypatch.setattr("shardkit.write.shard_task.table_rows", remove_then_write)
    options = WriteOptions(fields=("jpg=file",), workers=1)
    with pytest.raises(InputFileError, match=r"meta\.csv: row 9 \(key 000000009\): field 'jpg': .*img_09\.jpg"):
        write_dataset(str(tmp_path / "meta.csv"), str(tmp_path / "out"), options=options)
