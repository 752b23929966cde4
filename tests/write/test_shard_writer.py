"""ShardWriter takes what a training script holds (Pillow images, numpy
arrays, tensors) as webdataset's writer does, and no writer stores a sample
that readers would refuse: two extensions that read as one field."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

import shardkit
from shardkit.cli import main
from shardkit import ShardDataset, ShardWriter
from shardkit.errors import DestinationError, UsageError


def test_images_arrays_and_tensors_are_stored_as_webdataset_stores_them(tmp_path):
    pixels = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    with shardkit.ShardWriter(str(tmp_path / "out")) as writer:
        writer.write({"__key__": "a", "jpg": Image.new("RGBA", (8, 6), (255, 0, 0, 0)), "cls": np.int64(3)})
        writer.write({"__key__": "b", "npy": array, "png": pixels})
        writer.write({"__key__": "c", "npy": torch.ones(2, 2), "cls": torch.tensor(7)})
    got = {s["__key__"]: s for s in shardkit.ShardDataset(str(tmp_path / "out"), shuffle=False, decode="pil")}
    assert got["a"]["cls"] == 3 and got["c"]["cls"] == 7  # 0-d values are their numbers
    assert got["a"]["jpg"].format == "JPEG" and got["a"]["jpg"].size == (8, 6)
    assert got["a"]["jpg"].getpixel((4, 3))[0] > 240  # transparent pixels flattened on white, not black
    assert np.array_equal(got["b"]["npy"], array) and got["b"]["npy"].dtype == np.int32
    assert np.array_equal(np.asarray(got["b"]["png"]), pixels)  # PNG keeps the pixels
    assert np.array_equal(got["c"]["npy"], np.ones((2, 2), np.float32))
    # webdataset reads them back the same way
    shard = str(next((tmp_path / "out").glob("*.tar")))
    theirs = {s["__key__"]: s for s in wds.WebDataset(shard, shardshuffle=False, empty_check=False).decode("rgb8")}
    assert np.array_equal(theirs["b"]["png"], pixels) and np.array_equal(theirs["b"]["npy"], array)


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"npy": np.array([object()])}, "field 'npy': Object arrays cannot be saved"),
        ({"jpg": np.zeros((4, 5, 3), np.float32)}, "field 'jpg': cannot store a float32 array of shape (4, 5, 3)"),
        ({"tif": Image.new("RGB", (2, 2))}, "field 'tif': cannot encode an image as .tif"),
        ({"txt": "a", "TXT": "b"}, "fields 'TXT' and 'txt' would both be read as field 'txt'"),
        ({"pth": torch.ones(2, 2)}, "field 'pth': cannot store a float32 array of shape (2, 2) as .pth"),
    ],
    ids=["object-array", "float-image", "tif", "case-clash", "tensor-as-pth"],
)
def test_what_cannot_be_stored_is_refused_naming_the_field_and_nothing_of_it_is_written(tmp_path, sample, message):
    with shardkit.ShardWriter(str(tmp_path / "out")) as writer:
        writer.write({"__key__": "ok", "txt": "kept"})
        with pytest.raises(UsageError, match=r"sample 'bad'") as info:
            writer.write({"__key__": "bad", **sample})
        assert message in str(info.value)
    assert [s["__key__"] for s in shardkit.ShardDataset(str(tmp_path / "out"), shuffle=False)] == ["ok"]


def test_jsonl_rows_and_files_whose_extensions_read_as_one_field_are_refused(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"__key__": "a", "txt": "x", "TXT": "y"}) + "\n")
    assert main(["write", str(rows), str(tmp_path / "out1"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "rows.jsonl:1: line 1: fields 'TXT' and 'txt' would both be read as field 'txt'" in err
    tree = tmp_path / "tree" / "x"
    tree.mkdir(parents=True)
    (tree / "a.txt").write_text("1")
    (tree / "a.TXT").write_text("2")
    assert main(["write", str(tmp_path / "tree"), str(tmp_path / "out2"), "--format", "directory", "-q"]) == 2
    assert "both map to sample 'a' field 'txt'" in capsys.readouterr().err
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


def test_a_table_field_given_twice_in_two_cases_is_refused():
    from shardkit.write.fieldmap import FieldMap

    with pytest.raises(UsageError, match=r"extension 'TXT' is given twice \('a' and 'b'\)"):
        FieldMap.parse(["txt=a", "TXT=b"])


def test_a_second_writer_into_a_folder_being_written_is_refused_until_the_first_closes(tmp_path, monkeypatch):
    """One ShardWriter per DDP rank into one folder would write shard-000000.tar
    over each other; the second is refused, naming the folder and the remedy."""
    monkeypatch.setattr("shardkit.write.destination.LOCK_WAIT_S", 0.2)
    dest = str(tmp_path / "out")
    first = ShardWriter(dest, max_samples=2)
    first.write({"__key__": "a", "txt": "first"})
    with pytest.raises(DestinationError, match="another shardkit write or index into this folder") as caught:
        ShardWriter(dest, max_samples=2, overwrite=True)
    assert caught.value.path == dest and "give each DDP rank its own folder" in str(caught.value)
    assert first.close().num_samples == 1
    with ShardWriter(dest, max_samples=2, overwrite=True) as second:  # free once the first has closed
        second.write({"__key__": "b", "txt": "second"})
    assert [s["__key__"] for s in ShardDataset(dest, mode="exact")] == ["b"]
    aborted = ShardWriter(dest, max_samples=2, overwrite=True)
    aborted.abort()  # an aborted writer lets go too, and takes nothing more
    with pytest.raises(UsageError, match="ShardWriter is aborted"):
        aborted.write({"__key__": "c", "txt": "after"})
    with pytest.raises(UsageError, match="was aborted: it writes no manifest"):
        aborted.close()
    with ShardWriter(dest, max_samples=2, overwrite=True) as cancelled:
        cancelled.write({"__key__": "d", "txt": "cancelled"})
        cancelled.abort()  # leaving the block after an abort publishes nothing, and raises nothing
    assert not os.path.exists(os.path.join(dest, "manifest.json"))
    ShardWriter(dest, max_samples=2, overwrite=True).close()


def test_processes_forked_while_a_writer_is_open_do_not_keep_its_folder_locked(tmp_path, monkeypatch):
    """DataLoader workers (persistent ones, say) forked while a ShardWriter
    is open share its lock's open file; they must not hold the folder after
    the writer closes."""
    import multiprocessing

    monkeypatch.setattr("shardkit.write.destination.LOCK_WAIT_S", 0.2)
    dest = str(tmp_path / "out")
    writer = ShardWriter(dest, max_samples=2)
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    child.start()
    try:
        writer.write({"__key__": "a", "txt": "x"})
        writer.close()
        with ShardWriter(dest, max_samples=2, overwrite=True) as again:  # the child lives on
            again.write({"__key__": "b", "txt": "y"})
        assert child.is_alive()
    finally:
        child.kill()
        child.join()
    assert [s["__key__"] for s in ShardDataset(dest, mode="exact")] == ["b"]


_KILLED_WRITER = """
import os, signal, sys
import shardkit
writer = shardkit.ShardWriter(sys.argv[1], max_samples=10)
for i in range(25):
    writer.write({"__key__": f"{i:04d}", "txt": f"sample {i}", "cls": i % 3})
writer._current._file.flush()  # the third shard's bytes are on disk, under its temporary name
os.kill(os.getpid(), signal.SIGKILL)
"""


def _samples(count: int):
    return [{"__key__": f"{i:04d}", "txt": f"sample {i}", "cls": i % 3} for i in range(count)]


def _shard_bytes(folder) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder)) if name.endswith((".tar", ".idx"))}


def test_a_killed_writer_is_finished_by_resume_as_if_never_interrupted(tmp_path):
    import subprocess
    import sys

    killed = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(killed)], capture_output=True)
    assert proc.returncode == -9
    assert "shard-000002.tar.tmp" in os.listdir(killed) and "manifest.json" not in os.listdir(killed)

    with pytest.raises(DestinationError) as caught:  # the advice is spelled as ShardWriter takes it
        ShardWriter(str(killed), max_samples=10)
    assert "resume=True" in str(caught.value) and "--resume" not in str(caught.value)

    with ShardWriter(str(killed), max_samples=10, resume=True) as writer:
        assert writer.resumed_samples == 20
        assert not [name for name in os.listdir(killed) if name.endswith(".tmp")]
        for sample in _samples(40)[writer.resumed_samples :]:
            writer.write(sample)
    with ShardWriter(str(tmp_path / "whole"), max_samples=10) as whole:
        for sample in _samples(40):
            whole.write(sample)
    assert _shard_bytes(killed) == _shard_bytes(tmp_path / "whole")
    assert writer.manifest.num_samples == 40 and writer.manifest.extensions == whole.manifest.extensions
    assert [s["__key__"] for s in ShardDataset(str(killed), mode="exact", shuffle=False)] == [f"{i:04d}" for i in range(40)]


def test_resume_refuses_what_it_cannot_finish_naming_the_file(tmp_path):
    done = tmp_path / "done"
    with ShardWriter(str(done), max_samples=2) as writer:
        for sample in _samples(5):
            writer.write(sample)
    with pytest.raises(DestinationError, match="holds a finished dataset"):
        ShardWriter(str(done), max_samples=2, resume=True)
    with pytest.raises(UsageError, match="pass one of them"):
        ShardWriter(str(done), max_samples=2, resume=True, overwrite=True)

    os.unlink(done / "manifest.json")
    os.unlink(done / "shard-000001.tar")  # a gap: shard 2 without shard 1
    with pytest.raises(DestinationError, match="shard-000001.tar is missing but shard-000002.tar is there"):
        ShardWriter(str(done), max_samples=2, resume=True)

    os.unlink(done / "shard-000002.tar")
    shard = done / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[:-1024]) + bytes(512) + bytes(1024))  # a shard longer than its index says
    with pytest.raises(shardkit.CorruptShardError, match="shard-000000.tar: .*its index"):
        ShardWriter(str(done), max_samples=2, resume=True)
    with ShardWriter(str(done), max_samples=2, overwrite=True) as again:  # nothing above kept the folder locked
        again.write(_samples(1)[0])


def test_a_close_that_fails_publishing_counts_as_aborted(tmp_path):
    dest = tmp_path / "out"
    writer = ShardWriter(str(dest), max_samples=2)
    for sample in _samples(3):
        writer.write(sample)
    (dest / "manifest.json" / "in-the-way").mkdir(parents=True)  # publishing's rename into place fails
    with pytest.raises(OSError):
        writer.close()
    with pytest.raises(UsageError, match="was aborted"):
        writer.close()  # not a second try that would publish without holding the folder
    assert os.path.isdir(dest / "manifest.json")
    os.rmdir(dest / "manifest.json" / "in-the-way")
    os.rmdir(dest / "manifest.json")
    with ShardWriter(str(dest), max_samples=2, resume=True) as again:  # the lock was let go; every shard kept
        assert again.resumed_samples == 3
    assert again.manifest.num_samples == 3
