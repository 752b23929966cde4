"""Resharding input shards compressed whole: unpacked once to a temporary
plain tar in DEST's work folder, read by byte range from there, and resumable."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest

from shardkit.cli import main
from shardkit.errors import SourceError, UsageError
from shardkit.write.scan import scan_dataset
from shardkit.write.sources import SourceSettings
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
    with tempfile.TemporaryDirectory() as unpack_dir, tempfile.TemporaryDirectory() as spill_dir:
        scanned = scan_dataset(packed, spill_dir=spill_dir, settings=SourceSettings(unpack_dir=unpack_dir), workers=2)
        assert scanned.num_samples == 12
        for part, summary in zip(scanned.partitions, scanned.summaries):
            # No bytes held in memory: every sample is read later by byte range from the copy.
            assert os.path.dirname(summary["read_path"]) == unpack_dir
            assert part.path.startswith(packed) and part.path.endswith(".tar.gz")
            records = scanned.reader(part.index).records
            assert (records["length"] > 0).all()
            assert (records["offset"] + records["length"] <= os.path.getsize(summary["read_path"])).all()


def _unpacked(dest) -> list[str]:
    folder = os.path.join(dest, ".shardkit-journal", "unpack")
    return os.listdir(folder) if os.path.isdir(folder) else []


def test_resume_from_compressed_inputs_reuses_every_shard(tmp_path, own_tmp):
    packed = _gzip_shards(tmp_path)
    dest = str(tmp_path / "out")
    options = WriteOptions(max_samples=4, workers=1)
    first = write_dataset(packed, dest, options=options)
    again = write_dataset(packed, dest, options=WriteOptions(max_samples=4, workers=1, resume=True))
    assert again.num_written == 0 and again.num_reused == first.manifest.num_shards == 3
    assert again.manifest.to_json() == first.manifest.to_json()
    assert not os.path.exists(os.path.join(dest, ".shardkit-journal")), "the unpacked copies outlived the write"
    assert list(own_tmp.iterdir()) == [], "the write put something outside DEST"


# Writes compressed inputs with TMPDIR set, and SIGKILLs itself (the whole
# process group) once the first shard is done: its unpack folder is left.
KILL_AFTER_ONE_SHARD = textwrap.dedent(
    """
    import os, signal, sys
    from shardkit.write.parallel import WriteOptions, write_dataset
    def on_progress(event):
        os.killpg(0, signal.SIGKILL)
    write_dataset(sys.argv[1], sys.argv[2], options=WriteOptions(max_samples=4, workers=1), progress=on_progress)
    """
)


def test_the_unpacked_copies_of_a_killed_write_stay_in_its_dest_and_go_with_the_next_write(tmp_path):
    packed = _gzip_shards(tmp_path)
    dest, temp = tmp_path / "out", tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_ONE_SHARD, packed, str(dest)], env=env, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL
    assert os.listdir(temp) == [], "a killed write left something in TMPDIR"
    assert len(_unpacked(dest)) == 2  # the killed write's copies, ~16 KB here, up to max_unpack_bytes in use
    resumed = subprocess.run(
        [sys.executable, "-m", "shardkit", "write", packed, str(dest), "--max-samples", "4", "--workers", "1", "--resume", "-q"],
        env=env, capture_output=True, text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert os.listdir(temp) == [] and _unpacked(dest) == [], "the killed write's copies outlived the next write"
    assert sorted(n for n in os.listdir(dest) if n.endswith(".tar")) == [f"shard-00000{i}.tar" for i in range(3)]


def test_compressed_inputs_reshard_to_the_same_bytes_as_their_plain_form(tmp_path, own_tmp):
    packed = _gzip_shards(tmp_path)
    options = WriteOptions(max_samples=4, workers=1, seed=3)
    from_plain = write_dataset(str(tmp_path / "plain"), str(tmp_path / "a"), options=options).manifest
    from_packed = write_dataset(packed, str(tmp_path / "b"), options=options).manifest
    assert [(e.path, e.num_bytes, e.sha256) for e in from_packed.shards] == [
        (e.path, e.num_bytes, e.sha256) for e in from_plain.shards
    ]
    for entry in from_packed.shards:
        assert (tmp_path / "b" / entry.path).read_bytes() == (tmp_path / "a" / entry.path).read_bytes()
    assert list(own_tmp.iterdir()) == [] and _unpacked(tmp_path / "b") == [], "the unpacked copies outlived the write"
    plain = write_dataset(str(tmp_path / "plain"), str(tmp_path / "c"), options=options)
    assert plain.manifest.num_samples == 12 and not (tmp_path / "c" / ".shardkit-journal").exists()


def test_a_compressed_input_past_max_unpack_bytes_stops_the_write_naming_it_and_the_limit(tmp_path, own_tmp):
    packed = _gzip_shards(tmp_path)
    first, second = sorted(os.path.join(packed, n) for n in os.listdir(packed))
    limit = os.path.getsize(os.path.join(tmp_path, "plain", "shard-000000.tar")) + 1000  # the first fits, not both
    dest = tmp_path / "out"
    with pytest.raises(SourceError) as caught:
        write_dataset(packed, str(dest), options=WriteOptions(max_samples=4, workers=1, max_unpack_bytes=limit))
    message = str(caught.value)
    assert caught.value.path == second and message.startswith(f"{second}: ")
    assert f"max_unpack_bytes={limit}" in message and "--max-unpack-bytes" in message and "a DEST with more room" in message
    assert not dest.exists() or not [n for n in os.listdir(dest) if n.endswith((".tar", ".idx", ".json"))]
    assert list(own_tmp.iterdir()) == [] and _unpacked(dest) == [], "the unpacked copies outlived the failed write"
    # The command line says the same in one line, and exits 2.
    assert main(["write", packed, str(dest), "-q", "--workers", "1", "--max-unpack-bytes", str(limit)]) == 2
    # Raised, it goes through; scanned with a folder of the caller's, nothing partial is left in it.
    assert write_dataset(packed, str(dest), options=WriteOptions(max_samples=4, workers=1)).manifest.num_samples == 12
    with tempfile.TemporaryDirectory() as unpack_dir, tempfile.TemporaryDirectory() as spill_dir:
        with pytest.raises(SourceError, match="max_unpack_bytes=100 "):
            scan_dataset(first, spill_dir=spill_dir, settings=SourceSettings(unpack_dir=unpack_dir, max_unpack_bytes=100))
        assert os.listdir(unpack_dir) == []


def test_max_unpack_bytes_must_be_a_positive_size():
    with pytest.raises(UsageError, match="max_unpack_bytes"):
        WriteOptions(max_unpack_bytes=0)
    assert WriteOptions(max_unpack_bytes=None).max_unpack_bytes is None


def test_unpacking_stops_before_it_fills_the_disk(tmp_path, own_tmp, monkeypatch):
    """No disk to fill here: the file system is made to report 10 GB with
    300 MB free, under the 500 MB (5%) that must stay free."""
    import collections
    import shutil

    packed = _gzip_shards(tmp_path)
    usage = collections.namedtuple("usage", "total used free")(10**10, 10**10 - 3 * 10**8, 3 * 10**8)
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage)
    with pytest.raises(SourceError, match="300,000,000 bytes are free, 500,000,000 must stay so") as caught:
        write_dataset(packed, str(tmp_path / "out"), options=WriteOptions(max_unpack_bytes=None, workers=1))
    assert caught.value.path.endswith("shard-000000.tar.gz") and "a DEST with more room" in str(caught.value)
    assert list(own_tmp.iterdir()) == []
