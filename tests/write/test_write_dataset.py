"""write_dataset: correct content, reproducible bytes, size limits, sources."""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import time

import pytest
import webdataset as wds

from shardkit.errors import InputFileError
from shardkit.format.index import load_index
from shardkit.format.manifest import load_manifest
from shardkit.write.parallel import WriteOptions, write_dataset
from shardkit.verify import verify_dataset
from tests.write.conftest import make_imagefolder


def tree_bytes(root) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb") as f:
            out[name] = f.read()
    return out


def read_with_webdataset(manifest) -> dict:
    urls = [manifest.resolve(s.path) for s in manifest.shards]
    return {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False)}


def test_imagefolder_reads_back_through_webdataset_with_exact_bytes_and_labels(imagefolder, tmp_path):
    root, files = imagefolder
    report = write_dataset(root, str(tmp_path / "out"), options=WriteOptions(max_samples=5, workers=2))
    manifest = report.manifest
    assert manifest.class_names == ("cat", "dog", "eel")
    assert manifest.num_samples == len(files) and manifest.extensions == ("cls", "jpg")
    samples = read_with_webdataset(manifest)
    assert len(samples) == len(files)
    for rel, (data, label) in files.items():
        sample = samples[rel[: -len(".jpg")]]
        assert sample["jpg"] == data
        assert int(sample["cls"]) == label
    verify_dataset(str(tmp_path / "out"))


def test_shards_are_byte_identical_for_1_and_2_workers(imagefolder, tmp_path):
    root, _ = imagefolder
    for workers in (1, 2):
        write_dataset(root, str(tmp_path / f"w{workers}"), options=WriteOptions(max_samples=4, workers=workers, seed=7))
    one, two = tree_bytes(tmp_path / "w1"), tree_bytes(tmp_path / "w2")
    assert one == two and len([n for n in one if n.endswith(".tar")]) == 6


def test_progress_clock_starts_with_the_writing_not_with_the_first_finished_shard(imagefolder, tmp_path, monkeypatch):
    """A progress bar's rates use each event's elapsed_s: seconds since the
    shards began to be written. The first event comes once a shard is done,
    so a clock started there would make the first rates near infinite."""
    from shardkit.write import shard as shard_module

    commit = shard_module.ShardFile.commit

    def slow_commit(self):  # every shard takes at least 50 ms
        time.sleep(0.05)
        return commit(self)

    monkeypatch.setattr(shard_module.ShardFile, "commit", slow_commit)
    root, files = imagefolder
    events = []
    report = write_dataset(root, str(tmp_path / "out"), options=WriteOptions(max_samples=5, workers=1), progress=events.append)
    assert sum(e.num_samples for e in events) == len(files)
    elapsed = [e.elapsed_s for e in events]
    assert elapsed[0] >= 0.05, "the first event's clock started before its shard was written"
    assert elapsed == sorted(elapsed) and elapsed[-1] <= report.seconds
    assert elapsed[-1] >= 0.05 * len(events) / 2  # (one worker writes two shards at once, in two threads)


def test_seed_changes_the_mix_and_no_shuffle_keeps_source_order(imagefolder, tmp_path):
    root, files = imagefolder
    orders = {}
    for name, options in {
        "s0": WriteOptions(seed=0),
        "s1": WriteOptions(seed=1),
        "keep": WriteOptions(shuffle=False),
    }.items():
        manifest = write_dataset(root, str(tmp_path / name), options=options).manifest
        orders[name] = list(read_with_webdataset(manifest))
    assert orders["s0"] != orders["s1"]
    assert sorted(orders["s0"]) == sorted(orders["s1"])
    assert orders["keep"] == sorted(rel[:-4] for rel in files)
    assert load_manifest(str(tmp_path / "keep")).seed is None


def test_max_bytes_bounds_real_shard_size(imagefolder, tmp_path):
    root, _ = imagefolder
    limit = 20_000
    manifest = write_dataset(root, str(tmp_path / "out"), options=WriteOptions(max_bytes=limit)).manifest
    sizes = [os.path.getsize(manifest.resolve(s.path)) for s in manifest.shards]
    assert all(size <= limit for size in sizes)
    assert sizes == [s.num_bytes for s in manifest.shards]
    # Greedy packing: no shard could also have held the next shard's first sample.
    assert len(sizes) <= 2 * sum(sizes) // limit + 1


def test_oversized_sample_gets_own_shard_and_warning(tmp_path, caplog):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(50_000))
    for i in range(4):
        (src / f"small{i}.bin").write_bytes(os.urandom(1000))
    with caplog.at_level(logging.WARNING):
        report = write_dataset(str(src), str(tmp_path / "out"), options=WriteOptions(max_bytes=10_000, shuffle=False))
    big = [s for s in report.manifest.shards if s.num_bytes > 10_000]
    assert len(big) == 1 and big[0].num_samples == 1
    assert "big" in caplog.text and "exceeds max_bytes" in caplog.text
    assert report.manifest.num_samples == 5


def test_a_limit_every_sample_exceeds_is_said_once_not_once_per_sample(tmp_path, caplog, capsys):
    # The plan counts such samples and keeps a few (a limit set too small for
    # 10**8 samples would otherwise hold 10**8 descriptions, and print them).
    from shardkit.cli import main
    from shardkit.write.plan import OVERSIZED_LISTED

    src = tmp_path / "src"
    src.mkdir()
    for i in range(OVERSIZED_LISTED + 5):
        (src / f"s{i:02d}.bin").write_bytes(os.urandom(3000))
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        report = write_dataset(str(src), str(tmp_path / "out"), options=WriteOptions(max_bytes=2048, shuffle=False))
    assert report.num_oversized == OVERSIZED_LISTED + 5 == report.manifest.num_shards
    assert len(report.oversized) == OVERSIZED_LISTED and "sample 's00'" in report.oversized[0]
    warned = [r.getMessage() for r in caplog.records if "exceed" in r.getMessage()]
    assert warned == [f"{OVERSIZED_LISTED + 5} samples alone exceed max_bytes=2048, each getting a shard of its own "
                      f"(e.g. {report.oversized[0]}); raise --max-bytes"]
    capsys.readouterr()
    assert main(["write", str(src), str(tmp_path / "cli"), "--max-bytes", "2048", "--no-shuffle", "-q", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("exceed") == 1 and f"warning: {OVERSIZED_LISTED + 5} samples alone exceed --max-bytes" in out


def test_directory_groups_files_by_key_across_folders(tmp_path):
    src = tmp_path / "src"
    (src / "imgs").mkdir(parents=True)
    (src / "labels").mkdir()
    for key in ("a1", "b2"):
        (src / "imgs" / f"{key}.jpg").write_bytes(key.encode() * 10)
        (src / "labels" / f"{key}.cls").write_text("4")
    manifest = write_dataset(str(src), str(tmp_path / "out")).manifest
    samples = read_with_webdataset(manifest)
    assert set(samples) == {"a1", "b2"}
    assert samples["a1"]["jpg"] == b"a1" * 10 and samples["a1"]["cls"] == b"4"
    assert manifest.source["format"] == "directory"


def test_imagefolder_keys_follow_the_walk_through_nested_folders(tmp_path):
    root = tmp_path / "src"
    files = {"cls/sub/x.JPG": b"x" * 700, "cls/a.b.jpg": b"a" * 5, "cls/z.png": b"z" * 9}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "cls" / ".hidden.jpg").write_bytes(b"h")
    (root / "cls" / ".git").mkdir()
    (root / "cls" / ".git" / "y.jpg").write_bytes(b"y")
    (root / "cls" / "notes.txt").write_text("not an image")
    options = WriteOptions(shuffle=False, workers=1, format="imagefolder")
    manifest = write_dataset(str(root), str(tmp_path / "out"), options=options).manifest
    urls = [manifest.resolve(s.path) for s in manifest.shards]
    samples = [(s["__key__"], s) for s in wds.WebDataset(urls, shardshuffle=False)]
    # The class folder's own files first (sorted), then its folders' files.
    assert [key for key, _ in samples] == ["cls/a_b", "cls/z", "cls/sub/x"]
    members = [sorted(k for k in s if not k.startswith("__")) for _, s in samples]
    assert members == [["cls", "jpg"], ["cls", "png"], ["cls", "jpg"]]
    assert [s[ext] for (_, s), ext in zip(samples, ["jpg", "png", "jpg"])] == [b"a" * 5, b"z" * 9, b"x" * 700]


@pytest.mark.parametrize(("kind", "change"), [("imagefolder", 1000), ("imagefolder", -2000), ("directory", -2000)])
def test_input_changing_size_after_the_scan_is_named(imagefolder, tmp_path, kind, change):
    root, files = imagefolder
    victim = os.path.join(root, "eel", "img_007.jpg")
    size = len(files["eel/img_007.jpg"][0])
    if kind == "directory":  # a tree whose file names are the keys
        root = str(tmp_path / "tree")
        os.makedirs(os.path.join(root, "a"))
        for i in range(24):
            with open(os.path.join(root, "a", f"k{i:02d}.bin"), "wb") as f:
                f.write(os.urandom(size))
        victim = os.path.join(root, "a", "k23.bin")

    def change_after_first_shard(event):  # the victim is in the last of 8 shards
        with open(victim, "r+b") as f:
            if f.seek(0, os.SEEK_END) == size:
                f.truncate(size + change)

    options = WriteOptions(max_samples=3, workers=1, shuffle=False, format=kind)
    with pytest.raises(InputFileError, match="input changed size since it was scanned") as info:
        write_dataset(root, str(tmp_path / "out"), options=options, progress=change_after_first_shard)
    assert info.value.path == victim and str(info.value).startswith(f"{victim}: ")
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_jsonl_rows_with_files_and_inline_values(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a1.jpg").write_bytes(b"\xff\xd8jpeg-bytes")
    rows = [
        {"__key__": "a1", "jpg": "imgs/a1.jpg", "cls": 3, "json": {"w": 1}, "txt": "a caption"},
        {"__key__": "b2", "txt": "only text", "cls": 0},
    ]
    src = tmp_path / "data.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    samples = read_with_webdataset(write_dataset(str(src), str(tmp_path / "out")).manifest)
    assert samples["a1"]["jpg"] == b"\xff\xd8jpeg-bytes"
    assert samples["a1"]["cls"] == b"3"
    assert json.loads(samples["a1"]["json"]) == {"w": 1}
    assert samples["a1"]["txt"] == b"a caption" and samples["b2"]["txt"] == b"only text"


def test_jsonl_saved_with_a_byte_order_mark_and_crlf_gives_the_same_samples(tmp_path):
    """Notepad and Excel save UTF-8 with a BOM and CRLF line ends; the BOM is
    no part of the first row (it read as 'line 1 is not valid JSON')."""
    rows = [{"__key__": f"k{i}", "txt": f"row {i}", "cls": i} for i in range(5)]
    plain, windows = tmp_path / "plain.jsonl", tmp_path / "windows.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    windows.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\r\n" for r in rows).encode())

    def fields(source: str, dest: str) -> dict:
        samples = read_with_webdataset(write_dataset(source, str(tmp_path / dest)).manifest)
        return {key: {k: v for k, v in sample.items() if not k.startswith("__")} for key, sample in samples.items()}

    expected = fields(str(plain), "a")
    assert fields(str(windows), "b") == expected
    assert sorted(expected) == [f"k{i}" for i in range(5)] and expected["k0"] == {"cls": b"0", "txt": b"row 0"}


def test_many_tiny_jsonl_rows_are_written_exactly_with_their_checksums(tmp_path):
    # Thousands of rows of inline values: the writer encodes them a block at a
    # time. Among them, rows it must take one by one (a name too long for a
    # ustar header, a key that is not ASCII) in the middle of a block.
    rows = [{"__key__": f"r{i:05d}", "txt": f"caption {i} " * (i % 7), "json": {"i": i}, "cls": i % 10} for i in range(5000)]
    rows[2500]["__key__"] = "long/" + "k" * 120
    rows[4100]["__key__"] = "k\u00e9y"
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for workers in (1, 2):
        write_dataset(str(src), str(tmp_path / f"w{workers}"), options=WriteOptions(max_samples=3000, workers=workers, seed=3))
    assert tree_bytes(tmp_path / "w1") == tree_bytes(tmp_path / "w2")
    verify_dataset(str(tmp_path / "w1"))  # every sample against its index checksum
    samples = read_with_webdataset(load_manifest(str(tmp_path / "w1" / "manifest.json")))
    assert len(samples) == len(rows)
    for row in rows:
        sample = samples[row["__key__"]]
        assert sample["txt"] == row["txt"].encode() and sample["cls"] == str(row["cls"]).encode()
        assert json.loads(sample["json"]) == row["json"]


def test_reshards_webdataset_tars_keeping_every_sample(tmp_path):
    src = tmp_path / "wds"
    src.mkdir()
    expected = {}
    for shard in range(2):
        with wds.TarWriter(str(src / f"part-{shard}.tar")) as sink:
            for i in range(7):
                key = f"k{shard}_{i}"
                sample = {"__key__": key, "txt": f"text {key}", "bin": os.urandom(300 + i)}
                sink.write(sample)
                expected[key] = sample
    manifest = write_dataset(str(src), str(tmp_path / "out"), options=WriteOptions(max_samples=4)).manifest
    samples = read_with_webdataset(manifest)
    assert set(samples) == set(expected)
    for key, sample in expected.items():
        assert samples[key]["bin"] == sample["bin"] and samples[key]["txt"] == sample["txt"].encode()
    # Our output has no per-member pax headers: every member is one ustar block.
    with tarfile.open(manifest.resolve(manifest.shards[0].path)) as tar:
        assert all(m.pax_headers == {} for m in tar.getmembers())


def test_index_points_at_each_sample(imagefolder, tmp_path):
    root, _ = imagefolder
    manifest = write_dataset(root, str(tmp_path / "out"), options=WriteOptions(max_samples=10)).manifest
    entry = manifest.shards[1]
    bounds = load_index(manifest.resolve(entry.index))
    assert len(bounds) == entry.num_samples + 1 and bounds[-1] == entry.num_bytes - 1024
    with open(manifest.resolve(entry.path), "rb") as f:
        f.seek(int(bounds[3]))
        chunk = f.read(int(bounds[4] - bounds[3]))
    with tarfile.open(fileobj=io.BytesIO(chunk + bytes(1024))) as tar:
        names = tar.getnames()
    assert len({n.split(".")[0] for n in names}) == 1 and len(names) == 2


def test_vanished_input_is_named_or_skipped_and_recorded(imagefolder, tmp_path):
    root, files = imagefolder
    victim = os.path.join(root, sorted(files)[-1])

    def remove_after_first_shard(event):
        if os.path.exists(victim):
            os.unlink(victim)

    options = WriteOptions(max_samples=3, workers=1, shuffle=False)
    with pytest.raises(OSError, match="img_007.jpg"):
        write_dataset(root, str(tmp_path / "raise"), options=options, progress=remove_after_first_shard)
    assert not os.path.exists(tmp_path / "raise" / "manifest.json")
    # The partial shard with the missing file never got a final name.
    names = os.listdir(tmp_path / "raise")
    finals = sorted(n for n in names if n.endswith(".tar"))
    assert "shard-000007.tar" not in finals and not [n for n in names if n.endswith(".tmp")]
    # Shards 0..6 are complete, except at most the one that was in flight
    # beside shard 7 (two writer threads) and stopped with the run.
    done = {f"shard-{i:06d}.tar" for i in range(7)}
    assert set(finals) <= done and len(done - set(finals)) <= 1

    make_imagefolder(root)  # restore the victim
    skip = WriteOptions(max_samples=3, workers=1, shuffle=False, on_error="skip")
    manifest = write_dataset(root, str(tmp_path / "skip"), options=skip, progress=remove_after_first_shard).manifest
    assert manifest.num_samples == len(files) - 1
    assert [s.path for s in manifest.skipped] == [victim]
    assert "cannot read input file" in manifest.skipped[0].reason
    verify_dataset(str(tmp_path / "skip"))


def test_jsonl_duplicate_key_names_both_lines(tmp_path):
    from shardkit.errors import DuplicateSampleError

    source = tmp_path / "in.jsonl"
    source.write_text('{"__key__": "a", "cls": 1}\n{"__key__": "b", "cls": 2}\n\n{"__key__": "a", "cls": 3}\n')
    with pytest.raises(DuplicateSampleError, match=r"in.jsonl: lines 1 and 4 both have __key__ 'a'") as caught:
        write_dataset(str(source), str(tmp_path / "out"))
    assert (caught.value.first, caught.value.second) == (f"{source}:1", f"{source}:4")


def test_jsonl_oversized_row_is_named_by_file_and_key(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"__key__": "small", "txt": "x"}\n' + json.dumps({"__key__": "big", "txt": "y" * 20_000}) + "\n")
    report = write_dataset(str(source), str(tmp_path / "out"), options=WriteOptions(max_bytes=10_000))
    assert report.oversized == (f"{source} (sample 'big', 20,992 bytes in tar)",)  # header + padded data
