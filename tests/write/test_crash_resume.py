"""A writer killed with SIGKILL leaves no incomplete file under a final name,
and `--resume` finishes it to the same bytes as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shardkit.cli import main
from shardkit.format.index import load_index
from shardkit.format.tar import SampleParser
from tests.conftest import paused_run
from tests.write.conftest import make_imagefolder

# Runs write_dataset with 2 processes and SIGKILLs the whole process group
# (driver and writer processes) as soon as 2 shards are done, i.e. while the
# pool is in the middle of writing the rest.
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from shardkit.write.parallel import WriteOptions, write_dataset
    done = []
    def on_progress(event):
        done.append(event)
        if len(done) == 2:
            os.killpg(0, signal.SIGKILL)
    write_dataset(sys.argv[1], sys.argv[2], options=WriteOptions(max_samples=2, workers=2, seed=5),
                  progress=on_progress)
    """
)


# The same, but only the driver is killed (`kill -9 PID`, the OOM killer):
# its writer processes are told the pids first, in a file.
DRIVER_KILLER = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys
    from shardkit.write.parallel import WriteOptions, write_dataset
    done = []
    def on_progress(event):
        done.append(event)
        if len(done) == 2:
            with open(sys.argv[3], "w") as f:
                f.write(" ".join(str(p.pid) for p in multiprocessing.active_children()))
            os.kill(os.getpid(), signal.SIGKILL)
    write_dataset(sys.argv[1], sys.argv[2], options=WriteOptions(max_samples=2, workers=2, seed=5),
                  progress=on_progress)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def complete_tar(path: str) -> int:
    """Parse a whole shard (end marker required); return its sample count."""
    parser = SampleParser(path=path)
    with open(path, "rb") as f:
        samples = parser.feed(f.read())
    return len(samples + parser.finish())


def test_sigkilled_writer_resumes_to_identical_bytes(tmp_path, capsys):
    root = str(tmp_path / "images")
    make_imagefolder(root, per_class=60, size=4000)  # 180 samples -> 90 shards
    dest = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", KILLER, root, str(dest)], start_new_session=True)
    assert proc.returncode == -signal.SIGKILL
    assert not (dest / "manifest.json").exists()
    finals = sorted(n for n in os.listdir(dest) if n.endswith(".tar"))
    assert 2 <= len(finals) < 90
    for name in finals:  # everything under a final name is whole and indexed
        count = complete_tar(str(dest / name))
        assert len(load_index(str(dest / name).replace(".tar", ".idx"))) == count + 1

    assert main(["write", root, str(dest), "--max-samples", "2", "--seed", "5", "--resume", "-q"]) == 0
    assert main(["write", root, str(tmp_path / "clean"), "--max-samples", "2", "--seed", "5", "-q"]) == 0
    resumed = {n: (dest / n).read_bytes() for n in os.listdir(dest)}
    clean = {n: (tmp_path / "clean" / n).read_bytes() for n in os.listdir(tmp_path / "clean")}
    assert resumed.keys() == clean.keys()
    for name in clean:  # the manifest too: it records no time or destination
        assert resumed[name] == clean[name], name


def test_resume_rewrites_a_damaged_shard_and_keeps_good_ones(imagefolder, tmp_path, capsys):
    root, _ = imagefolder
    dest = str(tmp_path / "out")
    args = ["write", root, dest, "--max-samples", "5", "-q"]
    assert main(args) == 0
    original = {n: open(os.path.join(dest, n), "rb").read() for n in os.listdir(dest)}
    victim = os.path.join(dest, "shard-000002.tar")
    with open(victim, "r+b") as f:
        f.seek(600)
        f.write(b"XXXX")
    assert main(args[:-1] + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "1 written" in out and "4 reused" in out
    assert {n: open(os.path.join(dest, n), "rb").read() for n in os.listdir(dest)} == original


@pytest.mark.parametrize("flags", [["--resume", "--overwrite"]])
def test_resume_and_overwrite_exclude_each_other(imagefolder, tmp_path, capsys, flags):
    root, _ = imagefolder
    assert main(["write", root, str(tmp_path / "o"), *flags]) == 2
    assert "not allowed with" in capsys.readouterr().err


def test_resume_over_a_format1_manifest_reuses_its_shards_and_writes_format2(imagefolder, tmp_path, capsys):
    from shardkit.format.manifest import MANIFEST_NAME, load_manifest

    root, _ = imagefolder
    dest = str(tmp_path / "out")
    args = ["write", root, dest, "--max-samples", "5", "-q"]
    assert main(args) == 0
    original = {n: open(os.path.join(dest, n), "rb").read() for n in os.listdir(dest)}
    manifest = load_manifest(dest)
    for name in os.listdir(dest):
        if name.endswith(".table"):
            os.unlink(os.path.join(dest, name))
    with open(os.path.join(dest, MANIFEST_NAME), "w") as f:
        f.write(manifest.to_format1_json())
    os.unlink(os.path.join(dest, "shard-000002.tar"))
    assert main(args[:-1] + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "1 written" in out and "4 reused" in out
    assert {n: open(os.path.join(dest, n), "rb").read() for n in os.listdir(dest)} == original


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_writer_processes_die_with_a_sigkilled_driver_and_resume_gives_the_same_bytes(tmp_path):
    # Left running, they would go on writing shards under the names the
    # resumed run writes, each removing the other's temporary files.
    root = str(tmp_path / "images")
    make_imagefolder(root, per_class=60, size=4000)
    dest, pids = tmp_path / "killed", tmp_path / "pids"
    proc = subprocess.run([sys.executable, "-c", DRIVER_KILLER, root, str(dest), str(pids)])
    assert proc.returncode == -signal.SIGKILL
    workers = [int(p) for p in pids.read_text().split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in workers if _alive(pid)]
    for pid in survivors:  # leave no orphan behind the test, even when it fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "writer processes outlived their driver"

    assert main(["write", root, str(dest), "--max-samples", "2", "--seed", "5", "--resume", "-q"]) == 0
    assert main(["write", root, str(tmp_path / "clean"), "--max-samples", "2", "--seed", "5", "-q"]) == 0
    clean = sorted(os.listdir(tmp_path / "clean"))
    assert sorted(os.listdir(dest)) == clean
    assert all((dest / n).read_bytes() == (tmp_path / "clean" / n).read_bytes() for n in clean)


# A write that pauses after its first shard (see tests.conftest.paused_run).
PAUSED_WRITER = """
from shardkit.write.parallel import WriteOptions, write_dataset
write_dataset(sys.argv[1], sys.argv[2], options=WriteOptions(max_samples=2, workers=2, seed=5), progress=pause)
"""


def test_a_second_write_or_an_upgrade_of_a_folder_being_written_is_refused_and_the_first_completes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("shardkit.write.destination.LOCK_WAIT_S", 0.5)  # how long the second waits before it refuses
    root = str(tmp_path / "images")
    make_imagefolder(root, per_class=10, size=1000)
    dest, go = tmp_path / "out", tmp_path / "go"
    with paused_run(PAUSED_WRITER, root, str(dest), go=go):
        for flags in (["--resume"], ["--overwrite"]):  # a rerun's flags, while the first still runs
            assert main(["write", root, str(dest), "--max-samples", "2", "--seed", "5", "-q", *flags]) == 2
            err = capsys.readouterr().err
            assert f"{dest}: another shardkit write or index into this folder is running" in err and "--resume" in err
        # An upgrade would take the write's new table, not yet in manifest.json, for a stale one and remove it.
        assert main(["upgrade", str(dest)]) == 2
        assert "run the upgrade once it has ended" in capsys.readouterr().err
    assert main(["verify", str(dest), "-q"]) == 0  # the first write's dataset, whole
    assert main(["write", root, str(tmp_path / "clean"), "--max-samples", "2", "--seed", "5", "-q"]) == 0
    assert sorted(os.listdir(dest)) == sorted(os.listdir(tmp_path / "clean"))
