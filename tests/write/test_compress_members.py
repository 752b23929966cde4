"""``shardkit write --compress-members``: compressed text-like members."""

from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pytest

from shardkit import ShardDataset
from shardkit.cli import main
from shardkit.config import load_options
from shardkit.errors import UsageError, VerifyError
from shardkit.format.compression import decompress
from shardkit.format.index import encode_index, load_index
from shardkit.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.verify import verify_dataset
from shardkit.write.parallel import WriteOptions, write_dataset

NUM = 12


@pytest.fixture
def source(tmp_path) -> tuple[str, dict[str, dict[str, bytes]]]:
    """A plain directory source with text, JSON, npy and (incompressible) jpg members."""
    root = tmp_path / "src"
    root.mkdir()
    expected: dict[str, dict[str, bytes]] = {}
    rng = np.random.default_rng(0)
    for i in range(NUM):
        key = f"k{i:03d}"
        buf = io.BytesIO()
        np.save(buf, np.arange(200, dtype=np.int32) * i)
        fields = {
            "txt": f"a caption for sample {i}, repeated. ".encode() * 20,
            "json": json.dumps({"i": i, "words": ["w"] * 50}).encode(),
            "npy": buf.getvalue(),
            "jpg": rng.bytes(700),
        }
        for ext, data in fields.items():
            (root / f"{key}.{ext}").write_bytes(data)
        expected[key] = fields
    return str(root), expected


def _read(dest: str) -> dict[str, dict[str, bytes]]:
    return {
        s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")}
        for s in ShardDataset(dest, mode="exact")
    }


@pytest.mark.parametrize("kind,suffix", [("gzip", "gz"), ("zstd", "zst")])
def test_members_are_compressed_renamed_and_recorded(tmp_path, source, kind, suffix):
    src, expected = source
    dest = str(tmp_path / "out")
    report = write_dataset(src, dest, options=WriteOptions(max_samples=5, workers=1, compress_members=kind))
    manifest = load_manifest(dest)
    assert manifest.member_compression == kind
    assert manifest.options["compress_members"] == kind
    assert manifest.extensions == ("jpg", f"json.{suffix}", f"npy.{suffix}", f"txt.{suffix}")
    assert report.manifest.member_compression == kind
    got = _read(dest)  # through the offset index: shards stay indexable
    assert len(ShardDataset(dest, mode="exact", shuffle=False)) == NUM
    assert sorted(got) == sorted(expected)
    for key, fields in got.items():
        assert fields["jpg"] == expected[key]["jpg"]  # media are never compressed
        for ext in ("txt", "json", "npy"):
            stored = fields[f"{ext}.{suffix}"]
            assert len(stored) < len(expected[key][ext])
            assert decompress(stored, kind) == expected[key][ext]


def test_compressed_members_are_byte_reproducible(tmp_path, source):
    src, _ = source
    for name, workers in (("a", 1), ("b", 2)):
        write_dataset(
            src, str(tmp_path / name), options=WriteOptions(max_samples=5, workers=workers, compress_members="gzip")
        )
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(tmp_path / "b"))
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_webdataset_decodes_gzip_members(tmp_path, source):
    webdataset = pytest.importorskip("webdataset")
    src, expected = source
    dest = tmp_path / "out"
    write_dataset(src, str(dest), options=WriteOptions(max_samples=NUM, workers=1, compress_members="gzip"))
    shard = str(dest / "shard-000000.tar")
    samples = list(webdataset.WebDataset(shard, shardshuffle=False).decode())
    assert len(samples) == NUM
    for sample in samples:
        assert sample["txt.gz"] == expected[sample["__key__"]]["txt"].decode()
        assert sample["json.gz"] == json.loads(expected[sample["__key__"]]["json"])


def test_cli_flag_and_yaml_key(tmp_path, source):
    src, _ = source
    assert main(["write", src, str(tmp_path / "cli"), "--compress-members", "zstd", "--workers", "1", "-q"]) == 0
    assert load_manifest(str(tmp_path / "cli")).member_compression == "zstd"
    config = tmp_path / "c.yaml"
    config.write_text("write:\n  compress_members: gzip\n")
    assert load_options(WriteOptions, str(config), section="write").compress_members == "gzip"
    assert main(["write", src, str(tmp_path / "yaml"), "--config", str(config), "--workers", "1", "-q"]) == 0
    assert load_manifest(str(tmp_path / "yaml")).member_compression == "gzip"
    assert main(["verify", str(tmp_path / "yaml"), "-q"]) == 0
    config.write_text("write:\n  compress_members: brotli\n")
    with pytest.raises(UsageError, match="compress_members"):
        load_options(WriteOptions, str(config), section="write")


def test_manifest_without_the_field_loads_and_plain_writes_omit_it(tmp_path, source):
    src, _ = source
    dest = tmp_path / "plain"
    write_dataset(src, str(dest), options=WriteOptions(workers=1))
    text = (dest / MANIFEST_NAME).read_text()
    assert "compress" not in text  # plain datasets' manifests are unchanged
    assert Manifest.from_json(text, location=str(dest)).member_compression is None
    data = json.loads(text)
    data["member_compression"] = "zstd"
    assert Manifest.from_json(json.dumps(data), location=str(dest)).member_compression == "zstd"


def test_verify_finds_a_compressed_member_that_does_not_decompress(tmp_path, source):
    src, _ = source
    dest = tmp_path / "out"
    manifest = write_dataset(
        src, str(dest), options=WriteOptions(max_samples=NUM, workers=1, compress_members="gzip")
    ).manifest
    assert verify_dataset(str(dest)).num_samples_checked == NUM
    shard = dest / manifest.shards[0].path
    start = int(load_index(str(dest / manifest.shards[0].index))[2])
    data = bytearray(shard.read_bytes())
    member = data.find(b"\x1f\x8b", start)  # the sample's first gzip member
    data[member + 12 : member + 20] = b"\xff" * 8
    shard.write_bytes(bytes(data))
    # Keep the recorded checksums right (the shard's; the samples' are dropped
    # from the index), so that only the member is wrong.
    index_path = str(dest / manifest.shards[0].index)
    bounds = np.array(load_index(index_path))
    with open(index_path, "wb") as f:
        f.write(encode_index(bounds))
    text = json.loads(manifest.to_format1_json())  # format 1: the checksums are in the JSON
    text["shards"][0]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (dest / MANIFEST_NAME).write_text(json.dumps(text))
    with pytest.raises(VerifyError, match=r"does not decompress"):
        verify_dataset(str(dest))
