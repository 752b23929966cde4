"""``--resume`` continues only the interrupted write it belongs to (issue #53).

Every pairing of what DEST holds (a finished dataset, an interrupted write
of another source, an interrupted write of the same source with other
options, an index) with every local writer (``write --resume``,
``ShardWriter(resume=True)``, ``index --out``): each either continues the
right write or refuses, and no byte in DEST changes when it refuses. The
Ray engine and ``shardkit.ray.write_shards``: tests/ray/test_resume_guard.py.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from shardkit import ShardWriter, load_manifest
from shardkit.cli import main
from shardkit.errors import DestinationError
from shardkit.write.options import WriteOptions
from shardkit.write.parallel import write_dataset


class Stop(Exception):
    """Ends a write from its progress callback, as a kill would: the journal stays."""


def make_texts(root: str, prefix: str, count: int) -> str:
    os.makedirs(root, exist_ok=True)
    for i in range(count):
        with open(os.path.join(root, f"{prefix}{i:03d}.txt"), "w") as f:
            f.write(f"{prefix} sample {i}\n" * (1 + i % 3))
    return root


def tree_digest(root: str) -> dict[str, str]:
    """Every file under ``root`` (the journal included), by relative path, with its SHA-256."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def interrupted_write(source: str, dest: str, *, max_samples: int, after: int = 2) -> None:
    """A write of ``source`` stopped once ``after`` shards are done (one
    writer process: shards finish in order), its journal left in ``dest``."""

    def progress(event):
        if progress.done == after:
            raise Stop
        progress.done += 1

    progress.done = 0
    with pytest.raises(Stop):
        write_dataset(source, dest, options=WriteOptions(max_samples=max_samples, workers=1, seed=3), progress=progress)
    assert not os.path.exists(os.path.join(dest, "manifest.json"))
    assert os.path.isdir(os.path.join(dest, ".shardkit-journal"))


@pytest.fixture
def sources(tmp_path):
    return make_texts(str(tmp_path / "a"), "a", 40), make_texts(str(tmp_path / "b"), "b", 30)


OCCUPANTS = ("finished", "interrupted_other_source", "interrupted_other_options", "index")


def occupy(kind: str, dest: str, sources: tuple[str, str], tmp_path) -> str:
    """Fill ``dest`` as ``kind`` says; returns the words the refusal names it by."""
    a, b = sources
    if kind == "finished":
        assert main(["write", b, dest, "--max-samples", "10", "--seed", "3", "-q"]) == 0
        return "a finished dataset of"
    if kind == "interrupted_other_source":
        interrupted_write(b, dest, max_samples=10)
        return "an interrupted `shardkit write` of"
    if kind == "interrupted_other_options":
        interrupted_write(a, dest, max_samples=4)
        return "an interrupted `shardkit write` of"
    shards = str(tmp_path / "shards")
    assert main(["write", b, shards, "--max-samples", "10", "-q"]) == 0
    assert main(["index", shards, "--out", dest, "-q"]) == 0
    return "an index of"


@pytest.mark.parametrize("kind", OCCUPANTS)
def test_write_resume_refuses_what_is_not_its_own_write_and_changes_nothing(sources, tmp_path, capsys, kind):
    dest = str(tmp_path / "dest")
    held = occupy(kind, dest, sources, tmp_path)
    before = tree_digest(dest)
    capsys.readouterr()
    assert main(["write", sources[0], dest, "--max-samples", "10", "--seed", "3", "--resume", "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{dest}: holds {held}" in err and "--overwrite" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert tree_digest(dest) == before


@pytest.mark.parametrize("kind", OCCUPANTS)
def test_shard_writer_resume_refuses_a_dataset_a_write_or_an_index(sources, tmp_path, kind):
    dest = str(tmp_path / "dest")
    held = occupy(kind, dest, sources, tmp_path)
    before = tree_digest(dest)
    with pytest.raises(DestinationError, match=f"holds {held}"):
        ShardWriter(dest, resume=True)
    assert tree_digest(dest) == before


@pytest.mark.parametrize("kind", OCCUPANTS[:3])
def test_index_out_refuses_a_written_dataset_or_an_interrupted_write(sources, tmp_path, capsys, kind):
    dest = str(tmp_path / "dest")
    occupy(kind, dest, sources, tmp_path)
    shards = str(tmp_path / "other-shards")
    assert main(["write", sources[0], shards, "--max-samples", "10", "-q"]) == 0
    before = tree_digest(dest)
    capsys.readouterr()
    assert main(["index", shards, "--out", dest, "-q"]) != 0
    err = capsys.readouterr().err
    assert dest in err and ("another dataset" in err or "interrupted `shardkit write`" in err), err
    assert tree_digest(dest) == before


def test_index_refuses_an_index_of_other_shards_and_reruns_its_own_unchanged(sources, tmp_path, capsys):
    dest = str(tmp_path / "dest")
    occupy("index", dest, sources, tmp_path)
    before = tree_digest(dest)
    other = str(tmp_path / "other-shards")
    assert main(["write", sources[0], other, "--max-samples", "10", "-q"]) == 0
    capsys.readouterr()
    assert main(["index", other, "--out", dest, "-q"]) != 0
    assert "another dataset" in capsys.readouterr().err
    assert tree_digest(dest) == before
    assert main(["index", str(tmp_path / "shards"), "--out", dest, "-q"]) == 0  # its own shards again
    assert tree_digest(dest) == before


def test_in_place_index_refuses_a_folder_whose_write_was_interrupted(sources, tmp_path, capsys):
    dest = str(tmp_path / "dest")
    interrupted_write(sources[0], dest, max_samples=10)
    before = tree_digest(dest)
    assert main(["index", dest, "-q"]) != 0
    assert "interrupted `shardkit write`" in capsys.readouterr().err
    assert tree_digest(dest) == before


def test_index_out_refuses_an_interrupted_shard_writer(sources, tmp_path, capsys):
    dest = str(tmp_path / "dest")
    writer = ShardWriter(dest, max_samples=2)
    for i in range(5):
        writer.write({"__key__": f"k{i}", "txt": b"x"})
    del writer  # never closed: shards, no manifest
    shards = str(tmp_path / "shards")
    assert main(["write", sources[0], shards, "--max-samples", "10", "-q"]) == 0
    before = tree_digest(dest)
    assert main(["index", shards, "--out", dest, "-q"]) != 0
    assert "tar shards of its own" in capsys.readouterr().err
    assert tree_digest(dest) == before


def test_the_interrupted_write_itself_resumes_to_the_bytes_of_a_clean_write(sources, tmp_path, capsys):
    a = sources[0]
    clean, dest = str(tmp_path / "clean"), str(tmp_path / "dest")
    assert main(["write", a, clean, "--max-samples", "4", "--seed", "3", "-q"]) == 0
    interrupted_write(a, dest, max_samples=4)
    assert main(["write", a, dest, "--max-samples", "4", "--seed", "3", "--resume", "-q", "--workers", "2"]) == 0
    assert tree_digest(dest) == tree_digest(clean)


def test_resume_over_its_own_finished_write_changes_no_byte(sources, tmp_path):
    """Rerunning the same write with --resume checks the shards and finds
    nothing to do; from another folder, the source's real path is the same."""
    dest = str(tmp_path / "dest")
    args = ["write", sources[0], dest, "--max-samples", "10", "--seed", "3", "-q"]
    assert main(args) == 0
    before = tree_digest(dest)
    assert main([*args, "--resume"]) == 0
    assert tree_digest(dest) == before


def test_resume_refuses_a_finished_dataset_with_removed_samples(sources, tmp_path, capsys):
    """A rewrite would bring removed samples back: a takedown is never undone by --resume."""
    dest = str(tmp_path / "dest")
    args = ["write", sources[0], dest, "--max-samples", "10", "--seed", "3", "-q"]
    assert main(args) == 0
    keys = tmp_path / "keys.txt"
    keys.write_text("a007\n")
    assert main(["remove", dest, "--keys", str(keys), "-q"]) == 0
    before = tree_digest(dest)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    assert "removed" in capsys.readouterr().err
    assert tree_digest(dest) == before
    assert load_manifest(dest).num_removed == 1


def test_resume_refuses_a_finished_dataset_with_appended_data(sources, tmp_path, capsys):
    """A rewrite of the first source would drop the shards appended since."""
    dest = str(tmp_path / "dest")
    args = ["write", sources[0], dest, "--max-samples", "10", "--seed", "3", "-q"]
    assert main(args) == 0
    assert main(["append", dest, sources[1], "--max-samples", "10", "-q"]) == 0
    before = tree_digest(dest)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    assert "data was appended to it since" in capsys.readouterr().err
    assert tree_digest(dest) == before and load_manifest(dest).num_samples == 70


def test_a_refusal_without_resume_says_what_dest_holds(sources, tmp_path, capsys):
    dest = str(tmp_path / "dest")
    interrupted_write(sources[1], dest, max_samples=10)
    assert main(["write", sources[0], dest, "-q"]) == 2
    err = capsys.readouterr().err
    assert f"holds an interrupted `shardkit write` of {sources[1]} (3 shards finished)" in err
    assert "--resume to finish it" in err
    assert main(["write", sources[0], str(tmp_path / "dest2"), "-q"]) == 0
    assert main(["write", sources[1], str(tmp_path / "dest2"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished dataset of" in err and "--resume" not in err


def test_overwrite_still_replaces_a_finished_dataset(sources, tmp_path):
    dest = str(tmp_path / "dest")
    assert main(["write", sources[1], dest, "-q"]) == 0
    assert main(["write", sources[0], dest, "--overwrite", "-q"]) == 0
    assert load_manifest(dest).num_samples == 40
