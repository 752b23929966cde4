"""Shards as people publish them read as webdataset reads them.

Shards written by ``webdataset.ShardWriter`` and by GNU ``tar`` (directory
entries, README and .DS_Store members, upper-case extensions, dotted keys),
indexed in place, give sample for sample what webdataset's own reader gives
(keys, field names, bytes): through the streaming reader with and without
the index, ``IndexedDataset``, ``shardkit verify`` (the skipped entries a
warning, not a failure) and ``shardkit write``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
import webdataset as wds

import shardkit
from shardkit.cli import main
from shardkit.format.index import encode_index
from shardkit.format.manifest import Manifest, ShardEntry
from shardkit.format.tar import SampleParser
from shardkit.verify import verify_dataset
from shardkit.write.publish import publish_manifest
from tests.conftest import sample_payload

META = ("__url__", "__local_path__", "__index__")


def index_in_place(root: str, names: list[str]) -> None:
    """Write an offset index per shard and a manifest beside them, from
    what the parser finds (what `shardkit index` does)."""
    entries, extensions = [], set()
    for name in names:
        path = os.path.join(root, name)
        data = open(path, "rb").read()
        parser = SampleParser(path=path)
        samples = parser.feed(data) + parser.finish()
        index = name.removesuffix(".tar") + ".idx"
        with open(os.path.join(root, index), "wb") as f:
            f.write(encode_index([0] + [s.end for s in samples], [s.checksum() for s in samples]))
        extensions.update(ext for s in samples for ext in s.fields)
        entries.append(
            ShardEntry(
                path=name, index=index, num_samples=len(samples), num_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )  # fmt: skip
        )
    publish_manifest(root, Manifest(shards=tuple(entries), extensions=tuple(sorted(extensions)), source={"format": "tar"}))


def plain(samples) -> list[dict]:
    return [{k: v for k, v in s.items() if k not in META} for s in samples]


def webdataset_reads(paths: list[str]) -> list[dict]:
    return plain(wds.WebDataset(paths, shardshuffle=False))


def gnu_tar_shards(root) -> list[str]:
    """Two shards made by GNU tar from a folder tree: directory entries,
    README and .DS_Store files (NOTES after the last sample), upper-case
    extensions, dots in folder names and in keys' extensions."""
    names = []
    for shard in range(2):
        tree = root / f"tree{shard}"
        for i in range(6):
            folder = tree / "train" / f"n0{i % 2}.v{shard}"
            folder.mkdir(parents=True, exist_ok=True)
            key = f"img{shard}_{i}"
            (folder / f"{key}.JPG").write_bytes(sample_payload(key, 300 + i))
            (folder / f"{key}.cls").write_text(str(i % 3))
            if i % 2:
                (folder / f"{key}.seg.PNG").write_bytes(sample_payload(key + "seg", 50))
        (tree / "README").write_text("how this was made")
        (tree / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
        (tree / "NOTES").write_text("after the last sample")
        name = f"gnu-{shard:02d}.tar"
        members = ["README", ".DS_Store", "train", "NOTES"]
        subprocess.run(["tar", "--sort=name", "-cf", str(root / "shards" / name), "-C", str(tree), *members], check=True)
        names.append(name)
    return names


def wds_writer_shards(root) -> list[str]:
    pattern = str(root / "shards" / "wds-%02d.tar")
    with wds.ShardWriter(pattern, maxcount=7, verbose=0) as sink:
        for i in range(17):
            key = f"dir/sub.{i % 3}/k{i:03d}"
            sink.write({"__key__": key, "JPG": sample_payload(key, 200 + i), "Txt": f"caption {i}", "meta.json": b"{}"})
    return sorted(n for n in os.listdir(root / "shards") if n.startswith("wds-"))


@pytest.fixture(params=["gnu_tar", "webdataset_writer"])
def published(tmp_path, request):
    (tmp_path / "shards").mkdir()
    names = gnu_tar_shards(tmp_path) if request.param == "gnu_tar" else wds_writer_shards(tmp_path)
    root = str(tmp_path / "shards")
    paths = [os.path.join(root, n) for n in names]
    expected = webdataset_reads(paths)
    assert len(expected) in (12, 17) and "jpg" in expected[0]  # upper-case JPG read as webdataset lower-cases it
    return root, names, paths, expected


def test_published_shards_read_as_webdataset_reads_them(published, caplog):
    root, names, paths, expected = published
    assert plain(shardkit.ShardDataset(paths, mode="exact", shuffle=False)) == expected
    index_in_place(root, names)
    for mode in ("exact", "balanced"):
        assert plain(shardkit.ShardDataset(root, mode=mode, shuffle=False, verify_checksums=True)) == expected
    indexed = shardkit.IndexedDataset(root, verify_checksums=True)
    assert plain(indexed[i] for i in range(len(indexed))) == expected
    ds = shardkit.ShardDataset(root, mode="exact", seed=3)  # shuffled, split into pieces: the same samples
    assert sorted(plain(ds), key=lambda s: s["__key__"]) == sorted(expected, key=lambda s: s["__key__"])
    report = verify_dataset(root)
    assert report.num_samples_checked == len(expected)
    if names[0].startswith("gnu"):
        assert report.num_entries_skipped > 0 and len(report.warnings) == len(names)
        assert "README" in report.warnings[0] and "gnu-00.tar" in report.warnings[0]
        assert "skipping tar entries that are no sample member" in caplog.text


def test_write_reshards_published_shards_as_webdataset_reads_them(published, tmp_path, capsys):
    root, names, paths, expected = published
    dest = str(tmp_path / "out")
    assert main(["write", root, dest, "--quiet", "--max-samples", "5"]) == 0

    def by_key(samples):
        return sorted(samples, key=lambda s: s["__key__"])

    assert by_key(plain(shardkit.ShardDataset(dest, mode="exact", shuffle=False))) == by_key(expected)
    out = sorted(os.path.join(dest, n) for n in os.listdir(dest) if n.endswith(".tar"))
    assert by_key(webdataset_reads(out)) == by_key(expected)


def test_verify_reports_skipped_entries_as_a_warning_not_a_failure(tmp_path, capsys):
    (tmp_path / "shards").mkdir()
    names = gnu_tar_shards(tmp_path)
    root = str(tmp_path / "shards")
    index_in_place(root, names)
    assert main(["verify", root, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("OK: 2 shards, 12 samples") and "entries that belong to no sample skipped in 2 shards" in out
    assert err.count("WARNING: ") == 2 and "gnu-00.tar" in err and "'README'" in err


def test_a_hidden_file_in_a_folder_is_skipped_where_webdataset_makes_it_a_sample(tmp_path):
    """The one documented difference: webdataset's pattern reads
    ``train/.DS_Store`` as field ``ds_store`` of a sample keyed ``train/``."""
    tree = tmp_path / "tree" / "train"
    tree.mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / ".DS_Store").write_bytes(b"junk")
    (tree / "b.txt").write_text("b")
    shard = str(tmp_path / "s.tar")
    subprocess.run(["tar", "--sort=name", "-cf", shard, "-C", str(tmp_path / "tree"), "train"], check=True)
    ours = plain(shardkit.ShardDataset([shard], mode="exact", shuffle=False))
    theirs = webdataset_reads([shard])
    assert ours == [{"__key__": "train/a", "txt": b"a"}, {"__key__": "train/b", "txt": b"b"}]
    assert theirs == [{"__key__": "train/", "ds_store": b"junk"}, *ours]


def test_shardkit_shards_with_upper_case_extensions_keep_their_checksums(tmp_path):
    """Indexes store checksums over the members as spelled (``KEY.JPG``):
    read back as field ``jpg``, every sample still matches its checksum."""
    dest = str(tmp_path / "upper")
    with shardkit.ShardWriter(dest, max_samples=3) as writer:
        for i in range(5):
            writer.write({"__key__": f"k{i}", "JPG": sample_payload(f"k{i}", 99), "cls": b"1"})
    got = plain(shardkit.ShardDataset(dest, mode="exact", shuffle=False, verify_checksums=True))
    assert got == [{"__key__": f"k{i}", "jpg": sample_payload(f"k{i}", 99), "cls": b"1"} for i in range(5)]
    indexed = shardkit.IndexedDataset(dest, verify_checksums=True)
    assert plain(indexed[i] for i in range(5)) == got
    assert verify_dataset(dest).num_samples_checked == 5
