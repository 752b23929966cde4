"""Source detection never guesses wrong: one format fits, or the folder is
refused naming the formats that would apply and ``--format``."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

import shardkit
from shardkit.cli import main
from shardkit.errors import SourceError
from shardkit.format.manifest import load_manifest
from shardkit.write.sources.detect import detect_format
from tests.conftest import sample_payload

NUM_SHARDS = 10
PER_SHARD = 42


def img2dataset_folder(root) -> set[str]:
    """img2dataset's webdataset output: ``00000.tar`` (keys ``000000000``...,
    members jpg/txt/json) + ``00000.parquet`` + ``00000_stats.json`` per
    shard. Returns the sample keys."""
    root.mkdir(parents=True)
    keys = set()
    for shard in range(NUM_SHARDS):
        with tarfile.open(root / f"{shard:05d}.tar", "w") as tar:
            for i in range(PER_SHARD):
                key = f"{shard:05d}{i:04d}"
                keys.add(key)
                for ext, data in (
                    ("jpg", sample_payload(key, 500)),
                    ("txt", f"caption {key}".encode()),
                    ("json", json.dumps({"key": key, "status": "success"}).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (root / f"{shard:05d}.parquet").write_bytes(b"PAR1" + bytes(64) + b"PAR1")
        (root / f"{shard:05d}_stats.json").write_text(json.dumps({"count": PER_SHARD, "successes": PER_SHARD}))
    return keys


def test_img2dataset_output_is_tar_input_and_writes_every_real_sample(tmp_path):
    keys = img2dataset_folder(tmp_path / "laion")
    assert detect_format(str(tmp_path / "laion")) == "tar"
    assert main(["write", str(tmp_path / "laion"), str(tmp_path / "out"), "--quiet"]) == 0
    samples = list(shardkit.ShardDataset(str(tmp_path / "out"), mode="exact", shuffle=False))
    assert len(samples) == NUM_SHARDS * PER_SHARD == 420
    assert {s["__key__"] for s in samples} == keys and all(set(s) == {"__key__", "jpg", "txt", "json"} for s in samples)


def test_a_shardkit_dataset_and_a_bare_folder_of_shards_are_tar_input(tmp_path):
    img2dataset_folder(tmp_path / "shards")
    for name in ("README.md", "LICENSE"):
        (tmp_path / "shards" / name).write_text("about")
    assert detect_format(str(tmp_path / "shards")) == "tar"


def test_shards_beside_other_files_are_refused_naming_both_formats(tmp_path, capsys):
    img2dataset_folder(tmp_path / "mixed")
    (tmp_path / "mixed" / "cat.jpg").write_bytes(b"jpeg")
    with pytest.raises(SourceError) as info:
        detect_format(str(tmp_path / "mixed"))
    message = str(info.value)
    assert "cat.jpg" in message and "00000.tar" in message
    assert "`--format tar`" in message and "`--format directory`" in message
    assert main(["write", str(tmp_path / "mixed"), str(tmp_path / "out"), "--quiet"]) == 2
    assert "--format tar" in capsys.readouterr().err
    assert not (tmp_path / "out" / "manifest.json").exists()
    # The user's choice settles it: the shards' samples, or every file packed.
    assert main(["write", str(tmp_path / "mixed"), str(tmp_path / "out"), "--quiet", "--format", "tar"]) == 0
    assert load_manifest(str(tmp_path / "out")).num_samples == 420


@pytest.mark.parametrize("where", ["nested", "jsonl"])
def test_tars_or_jsonl_are_never_packed_as_fields_without_format_directory(tmp_path, where):
    src = tmp_path / "src"
    if where == "nested":
        img2dataset_folder(src / "part1")
        (src / "notes").mkdir()
        (src / "notes" / "a.txt").write_text("a")
    else:
        src.mkdir()
        (src / "a.jpg").write_bytes(b"jpeg")
        (src / "rows.jsonl").write_text('{"__key__": "a", "jpg": "a.jpg"}\n')
    with pytest.raises(SourceError, match=r"`--format directory` \(format='directory'\) to pack every file") as info:
        detect_format(str(src))
    assert ("--format tar" in str(info.value)) == (where == "nested")
    assert "--format jsonl" in str(info.value) or where == "nested"
    assert main(["write", str(src), str(tmp_path / "out"), "--quiet", "--format", "directory"]) == 0


def test_plain_folders_keep_their_formats(tmp_path):
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("t")
    assert detect_format(str(tmp_path / "files")) == "directory"
    (tmp_path / "classes" / "cat").mkdir(parents=True)
    (tmp_path / "classes" / "cat" / "1.jpg").write_bytes(b"j")
    assert detect_format(str(tmp_path / "classes")) == "imagefolder"


def test_class_folders_of_images_with_stray_files_are_not_guessed(tmp_path, capsys):
    # Read as a plain tree, they would lose their labels without a word.
    src = tmp_path / "classes"
    for label in ("cat", "dog"):
        (src / label).mkdir(parents=True)
        for i in range(3):
            (src / label / f"{label}{i}.jpg").write_bytes(b"jpeg %d" % i)
    (src / "dog" / "notes.txt").write_text("collected in 2019")
    with pytest.raises(SourceError, match=r"images and 1 other file\(s\) \(e\.g\. .*dog/notes\.txt\)") as info:
        detect_format(str(src))
    assert "`--format imagefolder`" in str(info.value) and "`--format directory`" in str(info.value)
    assert main(["write", str(src), str(tmp_path / "guess"), "-q"]) == 2
    assert "cannot tell the source format" in capsys.readouterr().err
    assert main(["write", str(src), str(tmp_path / "out"), "-q", "--format", "imagefolder"]) == 0
    labels = {s["__key__"]: s["cls"] for s in shardkit.ShardDataset(str(tmp_path / "out"), shuffle=False)}
    assert labels == {f"{c}/{c}{i}": str(n).encode() for n, c in enumerate(("cat", "dog")) for i in range(3)}


@pytest.mark.parametrize("layout", ["kind_folders", "fields_beside"])
def test_trees_whose_files_group_by_name_are_still_directories(tmp_path, layout):
    src = tmp_path / "tree"
    if layout == "kind_folders":  # imgs/a1.jpg + labels/a1.cls: a folder without images
        (src / "imgs").mkdir(parents=True)
        (src / "labels").mkdir()
        (src / "imgs" / "a1.jpg").write_bytes(b"j")
        (src / "labels" / "a1.cls").write_text("3")
    else:  # part0/a1.jpg beside part0/a1.cls
        (src / "part0").mkdir(parents=True)
        (src / "part0" / "a1.jpg").write_bytes(b"j")
        (src / "part0" / "a1.cls").write_text("3")
    assert detect_format(str(src)) == "directory"
