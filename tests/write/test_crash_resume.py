"""A writer killed with SIGKILL leaves no incomplete file under a final name,
and `--resume` finishes it to the same bytes as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from shardkit.cli import main
from shardkit.format.index import load_index
from shardkit.format.tar import SampleParser
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
