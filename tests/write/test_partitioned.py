"""Partitioned scanning and the bucketed shuffle: the output depends on the
inputs, the seed and the options only; bad input in any partition is named."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
import webdataset as wds

from shardkit.errors import DuplicateSampleError, InputFileError, SourceError
from shardkit.format.manifest import load_manifest
from shardkit.read.shuffle import shuffle_quality
from shardkit.write import plan as plan_module
from shardkit.write.parallel import WriteOptions, scan_and_plan, write_dataset
from shardkit.write.spill import spill_prefix
from tests.write.test_write_dataset import tree_bytes

ROWS = 400


def make_jsonl(path, rows=ROWS, *, classes=8) -> list[str]:
    """Class-sorted text rows (``cls`` = row * classes // rows); returns the lines."""
    lines = [json.dumps({"__key__": f"r{i:05d}", "txt": "t" * (i % 37), "cls": i * classes // rows}) for i in range(rows)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def keys_in_order(dest) -> list[str]:
    manifest = load_manifest(str(dest))
    return [s["__key__"] for s in wds.WebDataset([manifest.resolve(e.path) for e in manifest.shards], shardshuffle=False)]


def test_output_does_not_depend_on_partitions_workers_or_buckets(tmp_path, monkeypatch):
    source = tmp_path / "rows.jsonl"
    make_jsonl(source)
    trees = {}
    for partition_bytes, workers in [(1 << 20, 1), (700, 1), (700, 2), (333, 2)]:
        dest = tmp_path / f"p{partition_bytes}-w{workers}"
        options = WriteOptions(max_samples=48, seed=11, workers=workers, partition_bytes=partition_bytes)
        write_dataset(str(source), str(dest), options=options)
        trees[dest.name] = tree_bytes(dest)
    monkeypatch.setattr(plan_module, "BUCKET_ROWS", 16)  # 32 buckets instead of 1
    write_dataset(str(source), str(tmp_path / "buckets"), options=WriteOptions(max_samples=48, seed=11, workers=2, partition_bytes=700))
    trees["buckets"] = tree_bytes(tmp_path / "buckets")
    first = next(iter(trees.values()))
    assert all(tree == first for tree in trees.values())
    assert not os.path.exists(tmp_path / "buckets" / ".shardkit-journal")


def test_no_shuffle_keeps_source_order_across_partitions(tmp_path):
    source = tmp_path / "rows.jsonl"
    make_jsonl(source)
    write_dataset(str(source), str(tmp_path / "out"), options=WriteOptions(shuffle=False, workers=2, partition_bytes=500))
    assert keys_in_order(tmp_path / "out") == [f"r{i:05d}" for i in range(ROWS)]


def test_class_sorted_input_is_mixed_like_an_iid_order(tmp_path):
    source = tmp_path / "rows.jsonl"
    make_jsonl(source, rows=2000)
    write_dataset(str(source), str(tmp_path / "out"), options=WriteOptions(max_samples=100, partition_bytes=4000))
    labels = [int(key[1:]) * 8 // 2000 for key in keys_in_order(tmp_path / "out")]
    assert shuffle_quality(labels, batch_size=100) == pytest.approx(1.0, abs=0.25)
    per_shard = [len(set(labels[i : i + 100])) for i in range(0, 2000, 100)]
    assert min(per_shard) >= 7  # every shard holds (nearly) every class


def test_duplicate_key_in_two_partitions_names_both_lines(tmp_path):
    source = tmp_path / "rows.jsonl"
    lines = make_jsonl(source, rows=200)
    lines[150] = json.dumps({"__key__": "r00003", "txt": "again"})
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(DuplicateSampleError, match=r"rows.jsonl: lines 4 and 151 both have __key__ 'r00003'"):
        write_dataset(str(source), str(tmp_path / "out"), options=WriteOptions(workers=2, partition_bytes=300))
    assert not os.path.exists(tmp_path / "out")


def test_bad_line_in_a_later_partition_is_named_by_its_line_number(tmp_path, capsys):
    from shardkit.cli import main

    source = tmp_path / "rows.jsonl"
    lines = make_jsonl(source, rows=200)
    lines[170] = "{not json"
    source.write_text("\n".join(lines) + "\n")
    dest = str(tmp_path / "out")
    args = ["write", str(source), dest, "--workers", "2", "--config", str(_config(tmp_path, partition_bytes=300))]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{source}:171: line 171 is not valid JSON" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(dest)
    assert main([*args, "--on-error", "skip", "-q"]) == 0
    manifest = load_manifest(dest)
    assert manifest.num_samples == 199 and [s.path for s in manifest.skipped] == [str(source)]
    assert "line 171" in manifest.skipped[0].reason


def _config(tmp_path, **write) -> str:
    path = tmp_path / "c.yaml"
    path.write_text("write:\n" + "".join(f"  {k}: {v}\n" for k, v in write.items()))
    return str(path)


def test_jsonl_changed_between_scan_and_write_is_named_and_nothing_half_written(tmp_path):
    source = tmp_path / "rows.jsonl"
    make_jsonl(source)
    original = source.read_bytes()

    def rewrite(event) -> None:  # same length, other bytes: a row's caption changes
        source.write_bytes(original.replace(b'"tttt"', b'"TTTT"'))

    dest = tmp_path / "out"
    options = WriteOptions(max_samples=20, workers=1, shuffle=False)
    with pytest.raises(InputFileError, match=r"rows.jsonl: changed since it was scanned .* rerun the write"):
        write_dataset(str(source), str(dest), options=options, progress=rewrite)
    names = os.listdir(dest)
    assert "manifest.json" not in names and not [n for n in names if n.endswith(".tmp")]


def test_resume_after_a_kill_while_scanning_reuses_finished_partitions(tmp_path):
    source = tmp_path / "rows.jsonl"
    make_jsonl(source)
    options = WriteOptions(max_samples=40, seed=2, workers=2, partition_bytes=600)
    write_dataset(str(source), str(tmp_path / "clean"), options=options)
    # The state a SIGKILL leaves after some partitions were scanned: their
    # spills complete, another one's summary (written last) missing. And what
    # a power loss may leave: a summary on disk whose records never got there
    # (the files are not fsynced; the summary's CRCs vouch for them instead).
    dest = tmp_path / "killed"
    work = dest / ".shardkit-journal"
    os.makedirs(work)
    with tempfile.TemporaryDirectory() as unpack_dir:
        scanned, _, _ = scan_and_plan(str(source), options, work=str(work), unpack_dir=unpack_dir)
    spill_dir = str(work / "scan")
    os.unlink(spill_prefix(spill_dir, 3) + ".json")
    torn = spill_prefix(spill_dir, 1) + ".rec.npy"
    with open(torn, "r+b") as f:  # the numpy header survives, the records read back as zeros
        assert np.lib.format.read_magic(f) == (1, 0)
        np.lib.format.read_array_header_1_0(f)
        f.write(bytes(os.path.getsize(torn) - f.tell()))
    kept = os.stat(spill_prefix(spill_dir, 0) + ".rec.npy").st_mtime_ns
    torn_at = os.stat(torn).st_mtime_ns
    resumed = {}

    def on_progress(event) -> None:
        if not resumed:
            resumed["p0"] = os.stat(spill_prefix(spill_dir, 0) + ".rec.npy").st_mtime_ns
            resumed["p1 rescanned"] = os.stat(torn).st_mtime_ns != torn_at
            resumed["p3"] = os.path.exists(spill_prefix(spill_dir, 3) + ".json")

    import dataclasses

    write_dataset(str(source), str(dest), options=dataclasses.replace(options, resume=True), progress=on_progress)
    assert resumed == {"p0": kept, "p1 rescanned": True, "p3": True}
    assert tree_bytes(dest) == tree_bytes(tmp_path / "clean")
    assert len(scanned.partitions) > 4


def test_empty_and_missing_sources_leave_no_destination(tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text("\n\n")
    with pytest.raises(SourceError, match="no samples found"):
        write_dataset(str(source), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("workers", [1, 2])
def test_scan_progress_reports_each_partition_as_it_is_scanned(tmp_path, workers):
    """A large source scans for minutes before the first shard: the scan
    reports each partition done, in order, with the samples found so far."""
    make_jsonl(tmp_path / "rows.jsonl")
    events = []

    def on_scan(event):
        events.append((event.done, event.num_partitions, event.num_samples, os.path.exists(first_shard)))

    first_shard = tmp_path / "out" / "shard-000000.tar"

    options = WriteOptions(max_samples=100, workers=workers, partition_bytes=4096)
    write_dataset(str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), options=options, scan_progress=on_scan)
    total = events[0][1]
    assert total > 3 and [done for done, *_ in events] == list(range(total + 1))
    counts = [found for _, _, found, _ in events]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == ROWS
    assert not any(shard_there for *_, shard_there in events)  # all before the first shard


def test_cli_shows_a_scan_bar_before_the_write_bar(tmp_path, capsys, monkeypatch):
    from shardkit.cli import main
    from shardkit.cli import write as cli_write

    monkeypatch.setattr(cli_write, "SCAN_BAR_DELAY_S", 0)  # shown for this small source too
    make_jsonl(tmp_path / "rows.jsonl")
    (tmp_path / "c.yaml").write_text("write:\n  partition_bytes: 4096\n")
    args = ["write", str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), "--max-samples", "100", "--config",
            str(tmp_path / "c.yaml")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "scan: 100%" in err and " partitions" in err and f"{ROWS:,} samples" in err
    assert err.index("scan:") < err.index("write:")
