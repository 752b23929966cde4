"""Resharding input shards compressed whole: unpacked once to a temporary
plain tar, read by byte range from there, and resumable."""

from __future__ import annotations

import gzip
import os
import tempfile

from shardkit.write.inputs import scan_source
from shardkit.write.parallel import WriteOptions, write_dataset
from tests.conftest import build_dataset


def _gzip_shards(tmp_path) -> str:
    plain = build_dataset(str(tmp_path / "plain"), [7, 5], payload_bytes=3000)
    packed = tmp_path / "packed"
    packed.mkdir()
    for entry in plain.shards:
        with open(plain.resolve(entry.path), "rb") as f:
            data = f.read()
        (packed / (entry.path[: -len(".tar")] + ".tar.gz")).write_bytes(gzip.compress(data, mtime=0))
    return str(packed)


def test_compressed_inputs_are_read_by_range_from_an_unpacked_copy(tmp_path):
    packed = _gzip_shards(tmp_path)
    with tempfile.TemporaryDirectory() as unpack_dir:
        scanned = scan_source(packed, unpack_dir=unpack_dir)
        assert len(scanned.samples) == 12
        for sample in scanned.samples:
            # No bytes held in memory: every field is read later by byte range.
            assert all(f.data is None for f in sample.fields)
            path, start, end = sample.tar_range
            assert os.path.dirname(path) == unpack_dir and 0 <= start < end
            assert sample.tar_origin.startswith(packed) and sample.tar_origin.endswith(".tar.gz")
            assert sample.origin.startswith(sample.tar_origin)


def test_resume_from_compressed_inputs_reuses_every_shard(tmp_path):
    packed = _gzip_shards(tmp_path)
    dest = str(tmp_path / "out")
    before = _unpack_dirs()
    options = WriteOptions(max_samples=4, workers=1)
    first = write_dataset(packed, dest, options=options)
    again = write_dataset(packed, dest, options=WriteOptions(max_samples=4, workers=1, resume=True))
    assert again.num_written == 0 and again.num_reused == first.manifest.num_shards == 3
    assert again.manifest.to_json() == first.manifest.to_json()
    assert _unpack_dirs() == before, "the unpacked copies outlived the write"


def _unpack_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("shardkit-unpack-")}
