"""The dataset card `shardkit write` leaves beside manifest.json, read by the
real Hugging Face ``datasets`` library."""

from __future__ import annotations

import pytest

from shardkit.cli import main
from shardkit.format.manifest import Manifest
from shardkit.format.table import ShardEntry
from shardkit.write.publish import CARD_MARKER, CARD_NAME, card_data_files
from tests.conftest import sample_payload

SIZES = (5, 0, 7)


def test_datasets_loads_a_written_folder_as_webdataset(make_shards, tmp_path):
    datasets = pytest.importorskip("datasets")
    source = make_shards(SIZES, name="src")
    dest = tmp_path / "dest"
    assert main(["write", source.location, str(dest), "--max-samples", "4"]) == 0
    card = (dest / CARD_NAME).read_text()
    assert card.startswith("---\nconfigs:\n") and CARD_MARKER in card

    rows = datasets.load_dataset(str(dest), split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert rows.num_rows == sum(SIZES)
    assert set(rows.column_names) == {"__key__", "__url__", "bin", "cls", "json"}
    for row in rows:
        shard, i = (int(part) for part in row["__key__"][1:].split("_"))
        assert row["bin"] == sample_payload(row["__key__"], 100)
        assert row["json"] == {"shard": shard, "i": i}
        assert row["cls"] == (shard * 7 + i) % 10
    assert sorted(rows["__key__"]) == sorted(f"s{s:03d}_{i:05d}" for s, n in enumerate(SIZES) for i in range(n))


def test_a_readme_the_user_wrote_is_never_replaced(make_shards, tmp_path):
    source = make_shards(SIZES, name="src")
    dest = tmp_path / "dest"
    assert main(["write", source.location, str(dest), "--max-samples", "4"]) == 0
    assert "12 samples in 3 WebDataset-format tar shards" in (dest / CARD_NAME).read_text()
    # shardkit's own card is rewritten with the dataset ...
    assert main(["write", source.location, str(dest), "--max-samples", "6", "--overwrite"]) == 0
    ours = (dest / CARD_NAME).read_text()
    assert "12 samples in 2 WebDataset-format tar shards" in ours
    # ... but once the marker line is gone the file is the user's: kept by --overwrite and by publishing.
    (dest / CARD_NAME).write_text(ours.replace(CARD_MARKER, "My notes."))
    assert main(["write", source.location, str(dest), "--max-samples", "4", "--overwrite"]) == 0
    assert (dest / CARD_NAME).read_text() == ours.replace(CARD_MARKER, "My notes.")
    assert len(list(dest.glob("*.tar"))) == 3


def test_data_files_name_only_plain_tar_shards_by_folder():
    def entry(path: str) -> ShardEntry:
        return ShardEntry(path=path, num_samples=1, num_bytes=1024, sha256="0" * 64, index=path + ".idx")

    manifest = Manifest(shards=(entry("a/x.tar"), entry("b/y.tar"), entry("a/z.tar"), entry("c.tar.gz"), entry("d.tar")))
    assert card_data_files(manifest) == ["a/*.tar", "b/*.tar", "*.tar"]
