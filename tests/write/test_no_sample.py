"""A write in which every input was left out fails, whatever the source and
the reason (downloads, unreadable files, images that do not decode, a map
that drops everything): exit 2, a SourceError from write_dataset, no
manifest and no empty shard in DEST, the reasons counted and the first
inputs named. A write that left out some inputs, not all, is published."""

from __future__ import annotations

import csv
import os

import pytest

from shardkit.cli import main
from shardkit.errors import SourceError
from shardkit.format.manifest import load_manifest
from shardkit.write.parallel import WriteOptions, write_dataset
from tests.write import map_functions as fns
from tests.write.url_servers import Answer, photo_jpeg, server  # noqa: F401  (a fixture)

#: Quick to give up: no retries, a short read timeout (see test_ingest_write.py).
FAST = ["--read-timeout", "2", "--connect-timeout", "10", "--retries", "0"]


def drop_every_sample(sample: dict) -> None:
    """A --map that keeps nothing."""
    return None


def _table(path, rows: list[list[str]], header: tuple[str, ...] = ("url", "text")) -> str:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([list(header), *rows])
    return str(path)


def _nothing_published(dest) -> None:
    """DEST holds no dataset, no shard, no index and no journal."""
    left = sorted(os.listdir(dest)) if os.path.exists(dest) else []
    assert "manifest.json" not in left
    assert [n for n in left if n.startswith("shard") or n == ".shardkit-journal"] == []


def test_a_table_whose_every_download_fails_exits_2_publishes_nothing_and_can_be_run_again(tmp_path, server, capsys):
    urls = [server.serve(f"/{i}.jpg", Answer(404, b"gone")) for i in range(3)]
    source = _table(tmp_path / "bad.csv", [[url, f"caption {i}"] for i, url in enumerate(urls)])
    dest = tmp_path / "out"
    args = ["write", source, str(dest), "--field", "jpg=url", "--field", "txt=text", *FAST]
    assert main([*args, "-q"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1  # one line
    assert f"{source}: no sample to write: all 3 inputs were skipped (by reason: http_404 3)" in err
    assert f"{source}#row=0: http_404: jpg {urls[0]}" in err  # the first input, with its reason
    assert "empty shards and the write's journal were removed" in err and "run the same write again" in err
    _nothing_published(dest)
    with pytest.raises(SourceError, match=r"all 3 inputs were skipped \(by reason: http_404 3\)") as caught:
        write_dataset(source, str(dest), options=WriteOptions(fields=("jpg=url",), download_retries=0))
    assert caught.value.path == source
    _nothing_published(dest)
    # Once the inputs are fixed the same command writes the dataset: nothing in DEST stands in its way.
    for i in range(3):
        server.serve(f"/{i}.jpg", Answer(200, photo_jpeg(40, 30, seed=i)))
    assert main([*args, "-q"]) == 0
    assert load_manifest(str(dest)).num_samples == 3


def test_a_write_that_skipped_some_inputs_is_published_with_them_recorded(tmp_path, server, capsys):
    good = server.serve("/good.jpg", Answer(200, photo_jpeg(40, 30)))
    source = _table(tmp_path / "half.csv", [[good, "kept"], [server.serve("/bad.jpg", Answer(404)), "lost"]])
    dest = tmp_path / "out"
    assert main(["write", source, str(dest), "--field", "jpg=url", *FAST, "-q"]) == 0
    assert "1 samples" in capsys.readouterr().out
    manifest = load_manifest(str(dest))
    assert manifest.num_samples == 1 and [s.path for s in manifest.skipped] == [f"{source}#row=1"]


def test_inputs_unreadable_when_scanned_fail_the_write_naming_them(tmp_path, capsys):
    root = tmp_path / "images" / "cat"
    root.mkdir(parents=True)
    for i in range(3):
        os.symlink(tmp_path / f"never-{i}.jpg", root / f"img_{i}.jpg")
    dest = tmp_path / "out"
    assert main(["write", str(tmp_path / "images"), str(dest), "--on-error", "skip", "-q"]) == 2
    err = capsys.readouterr().err
    assert "no sample to write: all 3 inputs were skipped" in err
    assert f"{root / 'img_0.jpg'}: cannot read input file" in err and "Nothing was written" in err
    _nothing_published(dest)


def test_inputs_gone_before_their_shard_is_written_fail_the_write_naming_them(tmp_path):
    source = tmp_path / "files"
    source.mkdir()
    for i in range(3):
        (source / f"f{i}.bin").write_bytes(b"x" * (i + 1))

    def remove_after_scan(event) -> None:  # the scan found them; the shard writers will not
        if event.done == event.num_partitions:
            for name in os.listdir(source):
                os.remove(source / name)

    dest = tmp_path / "out"
    with pytest.raises(SourceError) as caught:
        write_dataset(str(source), str(dest), options=WriteOptions(on_error="skip", workers=1),
                      scan_progress=remove_after_scan)  # fmt: skip
    message = str(caught.value)
    assert "no sample to write: all 3 inputs were skipped" in message
    assert f"{source / 'f0.bin'}: cannot read input file" in message
    _nothing_published(dest)


def test_images_that_do_not_decode_fail_the_write_naming_them(tmp_path, capsys):
    # A folder resized in the map stage, and a table whose files are read as its shards are written.
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        (folder / f"p{i}.jpg").write_bytes(b"not an image")
    assert main(["write", str(folder), str(tmp_path / "a"), "--resize", "16", "--on-error", "skip", "-q"]) == 2
    err = capsys.readouterr().err
    assert "no sample to write: of 3 items, map dropped 0 (returned None) and 3 failed (by reason: not_image 3)" in err
    assert f"{folder / 'p0.jpg'}: not_image: " in err and "cannot identify an image" in err
    _nothing_published(tmp_path / "a")

    table = _table(tmp_path / "files.csv", [[f"folder/p{i}.jpg", str(i)] for i in range(3)], header=("file", "n"))
    assert main(["write", table, str(tmp_path / "b"), "--field", "jpg=file", "--resize", "16", "-q"]) == 2
    err = capsys.readouterr().err
    assert "no sample to write: all 3 inputs were skipped (by reason: not_image 3)" in err
    assert f"{table}#row=0: not_image: jpg: cannot identify an image" in err
    _nothing_published(tmp_path / "b")


def test_a_map_that_drops_everything_fails_the_write_naming_the_items(tmp_path, capsys):
    with pytest.raises(SourceError) as caught:
        write_dataset([1, 3, 5, 7], str(tmp_path / "a"), map=fns.drop_odd, options=WriteOptions(workers=1))
    message = str(caught.value)
    assert "no sample to write: of 4 items, map dropped 4 (returned None) and 0 failed" in message
    assert "(by reason: filtered 4)" in message
    assert "e.g. items#row=0: filtered: map returned None" in message and "Check that map returns a sample" in message
    _nothing_published(tmp_path / "a")

    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(2):
        (folder / f"k{i}.txt").write_text(str(i))
    spec = f"{__name__}:drop_every_sample"
    assert main(["write", str(folder), str(tmp_path / "b"), "--map", spec, "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert "map dropped 2 (returned None)" in err and f"{folder / 'k0.txt'}: filtered: map returned None" in err
    _nothing_published(tmp_path / "b")
