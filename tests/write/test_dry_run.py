"""`shardkit write --dry-run`: the figures of a real write, and nothing written anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shardkit.cli import main
from shardkit.write.dry_run import SCRATCH_PREFIX
from shardkit.write.scratch import remove_orphans
from tests.write.test_reshard_compressed import _gzip_shards


def dry_run(capsys, *argv: str) -> dict[str, str]:
    """Run ``shardkit write ARGV --dry-run``; its summary lines as {name: value}."""
    assert main(["write", *argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dry run: scanned and planned in ")
    figures = {}
    for line in out.splitlines()[1:]:
        name, sep, value = line.strip().partition(":")
        if sep and name.isalpha():
            figures[name] = value.strip()
    return figures


def written(capsys, *argv: str) -> dict:
    assert main(["write", *argv, "-q"]) == 0
    capsys.readouterr()
    return json.loads(open(os.path.join(argv[1], "manifest.json")).read())


def test_dry_run_prints_what_the_write_then_gives_and_creates_nothing(imagefolder, tmp_path, capsys, own_tmp):
    root, files = imagefolder
    broken = os.path.join(root, "cat", "gone.jpg")
    os.symlink(os.path.join(root, "cat", "never-existed.jpg"), broken)
    dest = str(tmp_path / "out")
    flags = ("--max-samples", "5", "--seed", "3", "--on-error", "skip")

    figures = dry_run(capsys, root, dest, *flags)
    assert not os.path.exists(dest)
    assert os.listdir(own_tmp) == []
    manifest = written(capsys, root, dest, *flags)
    assert figures == {
        "inputs": f"{len(files)} files (imagefolder)",
        "samples": str(manifest["num_samples"]),
        "shards": str(manifest["num_shards"]),
        "bytes": f"{manifest['num_bytes']} ({manifest['num_bytes'] / 1000:.1f} KB)",
        "skipped": "1",
    }
    assert manifest["num_samples"] == len(files) and manifest["num_shards"] == 5
    assert [s["path"] for s in manifest["skipped"]] == [broken]


def test_dry_run_of_compressed_shards_leaves_no_unpacked_copy(tmp_path, capsys, own_tmp):
    packed = _gzip_shards(tmp_path)  # inputs a write unpacks to temporary plain tars first
    dest = str(tmp_path / "out")
    figures = dry_run(capsys, packed, dest, "--max-samples", "4", "-q")  # -q: the summary is the output
    assert os.listdir(own_tmp) == [] and not os.path.exists(dest)
    manifest = written(capsys, packed, dest, "--max-samples", "4")
    assert (figures["inputs"], figures["samples"], figures["shards"]) == ("2 files (tar)", "12", "3")
    assert figures["bytes"].split()[0] == str(manifest["num_bytes"])
    # The unpacking limit holds as in a write, and a refused dry run leaves nothing either.
    assert main(["write", packed, str(tmp_path / "other"), "--dry-run", "--max-unpack-bytes", "100"]) == 2
    assert "--max-unpack-bytes" in capsys.readouterr().err
    assert os.listdir(own_tmp) == [] and not os.path.exists(tmp_path / "other")


def test_dry_run_with_the_ray_engine_plans_here_without_a_cluster(tmp_path, capsys):
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"__key__": f"r{i}", "txt": "x" * i}) + "\n" for i in range(30)))
    dest = str(tmp_path / "out")
    # Port 1: no cluster listens there; a dry run does not try to reach one.
    assert main(["write", str(source), dest, "--dry-run", "--engine", "ray", "--ray-address", "127.0.0.1:1",
                 "--max-samples", "7"]) == 0
    out = capsys.readouterr().out
    assert "  engine:  ray; planned on this machine as a Ray write's driver plans, the cluster was not contacted" in out
    assert "  samples: 30\n  shards:  5\n" in out and "  inputs:  1 file (jsonl)\n" in out
    assert not os.path.exists(dest)


_HOLD_SCRATCH = """
import sys, time
from shardkit.write.dry_run import SCRATCH_PREFIX
from shardkit.write.scratch import scratch_folder
with scratch_folder(SCRATCH_PREFIX) as folder:
    print(folder, flush=True)
    time.sleep(120)
"""


def _holder(own_tmp) -> tuple[subprocess.Popen, str]:
    """A process inside a dry run's scratch folder (under ``own_tmp``), and the folder."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_SCRATCH], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(own_tmp)})
    folder = proc.stdout.readline().strip()
    assert folder.startswith(str(own_tmp)) and os.path.isdir(folder)
    return proc, folder


def _killed(own_tmp) -> str:
    proc, folder = _holder(own_tmp)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    assert os.path.isdir(folder)
    return folder


def test_a_killed_dry_runs_scratch_folder_is_removed_by_the_next_and_a_live_ones_is_not(tmp_path, capsys, own_tmp):
    _killed(own_tmp)
    live, running = _holder(own_tmp)  # removes the orphan on its way in
    try:
        assert os.listdir(own_tmp) == [os.path.basename(running)]
        orphan = _killed(own_tmp)  # leaves the live one alone
        assert sorted(os.listdir(own_tmp)) == sorted([os.path.basename(running), os.path.basename(orphan)])
        source = tmp_path / "rows.jsonl"
        source.write_text("".join(json.dumps({"__key__": f"r{i}", "txt": "x"}) + "\n" for i in range(10)))
        figures = dry_run(capsys, str(source), str(tmp_path / "out"), "-q")
        assert figures["samples"] == "10"
        # The killed run's folder is gone; the running one's is untouched, with its contents.
        assert os.listdir(own_tmp) == [os.path.basename(running)]
        assert os.listdir(running) == ["owner.lock"]
    finally:
        live.kill()
        live.wait()
    # A folder without a lock file (its owner between creating it and locking) is left alone.
    (own_tmp / "shardkit-dry-run-bare").mkdir()
    assert remove_orphans(SCRATCH_PREFIX, str(own_tmp)) == [running]
    assert os.listdir(own_tmp) == ["shardkit-dry-run-bare"]
