"""Writer I/O failures on real small file systems: one line naming the file and
what to do, exit code 2, and no temporary files left behind.

The file systems are tmpfs mounts made for each test (size- or inode-limited,
or remounted read-only); the tests skip when mounting is not allowed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from shardkit.cli import main
from shardkit.errors import DestinationError, InputFileError
from shardkit.write import parallel
from shardkit.write.parallel import WriteOptions, write_dataset
from tests.write.conftest import make_imagefolder


def _mount_tmpfs(path: str, options: str) -> None:
    os.makedirs(path, exist_ok=True)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command on this machine")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")


@pytest.fixture
def small_fs(tmp_path):
    """Mount tmpfs file systems under tmp_path; unmounted at teardown."""
    mounted: list[str] = []

    def mount(name: str, options: str) -> str:
        path = str(tmp_path / name)
        _mount_tmpfs(path, options)
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", path], capture_output=True)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def temporaries(folder: str) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names if n.endswith(".tmp")]


def test_plan_larger_than_free_space_is_refused_with_both_numbers(small_fs, tmp_path, capsys):
    root = str(tmp_path / "images")
    make_imagefolder(root, per_class=6, size=120_000)  # about 2.2 MB of images
    dest = os.path.join(small_fs("fs", "size=1m"), "out")
    code, _, err = run(capsys, "write", root, dest, "-q")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{dest}: not enough free space" in err
    needed, free = [int(word) for word in err.replace("(", " ").split() if word.isdigit()][:2]
    assert needed > 2_000_000 and 0 < free <= 1 << 20
    assert os.listdir(dest) == []


@pytest.mark.parametrize("workers", ["1", "2"])
def test_disk_full_mid_write_is_one_line_and_leaves_no_temporaries(small_fs, imagefolder, workers, capsys):
    root, _ = imagefolder
    # Plenty of bytes but few inodes: creating files runs out of space (ENOSPC)
    # after the first shards, while the free-space check (bytes) passes. The
    # scan's spills and the plan take about 20 of them (3 partitions).
    dest = os.path.join(small_fs("fs", "size=64m,nr_inodes=30"), "out")
    code, _, err = run(capsys, "write", root, dest, "--max-samples", "2", "--workers", workers, "-q")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # Which file meets the full disk first (a shard, its index, its journal
    # record) depends on timing; the message names it, never its temporary.
    assert re.search(rf"error: {re.escape(dest)}/(\.shardkit-journal/)?shard-\d{{6}}\.(tar|idx|tar\.json): ", err)
    assert ".tmp" not in err
    assert "no space left on the device; free space, then rerun with --resume" in err
    assert temporaries(dest) == []
    assert not os.path.exists(os.path.join(dest, "manifest.json"))


def test_disk_full_then_resume_after_freeing_space_gives_the_same_dataset(small_fs, tmp_path):
    root = str(tmp_path / "images")
    make_imagefolder(root, per_class=4, size=20_000)  # 12 samples, about 250 KB
    options = WriteOptions(max_samples=1, workers=1)
    clean = write_dataset(root, str(tmp_path / "clean"), options=options).manifest
    fs = small_fs("fs", "size=1m")
    dest = os.path.join(fs, "out")
    filler = os.path.join(fs, "filler")

    def fill_the_disk(event) -> None:
        if not os.path.exists(filler):
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(bytes(64 << 10))
                        f.flush()
                except OSError:
                    pass

    with pytest.raises(DestinationError, match=r"no space left on the device; free space, then rerun with --resume") as info:
        write_dataset(root, dest, options=options, progress=fill_the_disk)
    assert info.value.path.startswith(dest + "/")
    assert isinstance(info.value.__cause__, OSError)  # the system's error is kept as the cause
    assert temporaries(dest) == []
    os.unlink(filler)
    resumed = write_dataset(root, dest, options=WriteOptions(max_samples=1, workers=1, resume=True))
    assert resumed.num_reused >= 1 and resumed.manifest.shards == clean.shards


@pytest.mark.parametrize("exists", [True, False])
def test_read_only_destination_is_one_line_naming_it(small_fs, imagefolder, exists, capsys):
    root, _ = imagefolder
    fs = small_fs("fs", "size=8m")
    dest = os.path.join(fs, "out")
    if exists:
        os.mkdir(dest)
    proc = subprocess.run(["mount", "-o", "remount,ro", fs], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot remount read-only: {proc.stderr.strip()}")
    code, _, err = run(capsys, "write", root, dest, "--workers", "2", "-q")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert dest in err and "read-only; remount it read-write or choose another DEST" in err
    assert not exists or os.listdir(dest) == []


@pytest.mark.parametrize("workers", ["1", "2"])
def test_input_vanishing_mid_run_is_one_line_naming_it(imagefolder, tmp_path, monkeypatch, workers, capsys):
    root, _ = imagefolder
    dest = str(tmp_path / "out")
    argv = ["write", root, dest, "--max-samples", "4", "--no-shuffle", "--workers", workers, "-q"]
    assert run(capsys, *argv)[0] == 0
    # Shard 0 must be written again; the others are reused and reported
    # (before any shard is written), and at that point an input of shard 0 goes.
    os.unlink(os.path.join(dest, "shard-000000.tar"))
    victim = os.path.join(root, "cat", "img_002.jpg")
    report = parallel._report

    def report_then_delete(*args):
        if os.path.exists(victim):
            os.unlink(victim)
        report(*args)

    monkeypatch.setattr(parallel, "_report", report_then_delete)
    code, _, err = run(capsys, *argv, "--resume")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{victim}: cannot read input file" in err and "--on-error skip" in err
    assert temporaries(dest) == []
    assert not os.path.exists(os.path.join(dest, "manifest.json"))


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_shows_the_traceback(small_fs, imagefolder, capsys, where):
    root, _ = imagefolder
    fs = small_fs("fs", "size=8m")
    proc = subprocess.run(["mount", "-o", "remount,ro", fs], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot remount read-only: {proc.stderr.strip()}")
    argv = ["write", root, os.path.join(fs, "out"), "-q"]
    code, _, err = run(capsys, *(["-v", *argv] if where == "before" else [*argv, "--verbose"]))
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("shardkit: error: ")


def test_input_vanishing_library_error_keeps_the_cause(imagefolder, tmp_path):
    root, _ = imagefolder
    dest = str(tmp_path / "out")
    write_dataset(root, dest, options=WriteOptions(max_samples=4, shuffle=False, workers=1))
    os.unlink(os.path.join(dest, "shard-000000.tar"))
    victim = os.path.join(root, "cat", "img_001.jpg")

    def delete(event) -> None:
        if os.path.exists(victim):
            os.unlink(victim)

    with pytest.raises(InputFileError) as info:
        write_dataset(root, dest, options=WriteOptions(max_samples=4, shuffle=False, workers=1, resume=True), progress=delete)
    assert info.value.path == victim and isinstance(info.value.__cause__, FileNotFoundError)
    assert temporaries(dest) == []
    journal = os.path.join(dest, ".shardkit-journal")
    records = [n for n in os.listdir(journal) if n.endswith(".json")] if os.path.isdir(journal) else []
    assert all(json.load(open(os.path.join(journal, n))) for n in records)


def test_spill_space_running_out_is_one_line_naming_the_input_and_leaves_nothing(small_fs, tmp_path, capsys):
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"__key__": f"row{i:08d}", "txt": "x"}) + "\n" for i in range(20_000)))
    dest = os.path.join(small_fs("fs", "size=256k"), "out")  # the spill needs about 1.5 MB
    code, _, err = run(capsys, "write", str(source), dest, "-q")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{dest}/.shardkit-journal/scan: cannot write the scan's spill while scanning {source}" in err
    assert "no space left" in err and "free space where DEST is" in err
    assert not os.path.exists(dest)
