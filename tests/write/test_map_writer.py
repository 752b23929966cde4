"""write_dataset(source, dest, map=fn): the user's function run in the writer.

Real worker processes (fork and spawn), real tar shards read back member by
member, a real SIGKILL half-way and a resume."""

from __future__ import annotations

import functools
import glob
import hashlib
import io
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit.cli import main
from shardkit.errors import DuplicateSampleError, MapError, SourceError, UsageError
from shardkit.write.parallel import WriteOptions, write_dataset
from tests.write import map_functions as fns

ROOT = Path(__file__).resolve().parents[2]


def shard_bytes(dest: Path) -> dict[str, str]:
    """sha256 of every file a write left (the manifest without its absolute location)."""
    out = {}
    for path in sorted(dest.iterdir()):
        data = path.read_bytes()
        if path.name == "manifest.json":
            manifest = json.loads(data)
            manifest.pop("location", None)
            data = json.dumps(manifest, sort_keys=True).encode()
        out[path.name] = hashlib.sha256(data).hexdigest()
    return out


def samples_of(dest: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of a written dataset: key -> {extension: bytes}, keys unique."""
    manifest = shardkit.load_manifest(str(dest))
    out: dict[str, dict[str, bytes]] = {}
    for entry in manifest.shards:
        with tarfile.open(dest / entry.path) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                out.setdefault(key, {})[ext] = tar.extractfile(member).read()
    assert sum(e.num_samples for e in manifest.shards) == len(out)
    return out


def _spawn_pool(monkeypatch):
    """Writer processes started by spawn, as on macOS or under a CUDA parent, instead of fork."""
    import shardkit.write.engine_local as engine_local
    import shardkit.write.pool as pool

    for module in (pool, engine_local):
        monkeypatch.setattr(module, "pool_context", lambda: multiprocessing.get_context("spawn"))


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_one_and_two_workers_write_the_same_bytes(tmp_path, monkeypatch, start):
    if start == "spawn":
        _spawn_pool(monkeypatch)
    items = range(300)
    written = {}
    for workers in (1, 2):
        dest = tmp_path / f"w{workers}"
        report = write_dataset(items, str(dest), map=fns.square,
                               options=WriteOptions(workers=workers, max_samples=37, seed=3))  # fmt: skip
        assert report.num_items == 300 and report.num_filtered == 0 and report.manifest.num_samples == 300
        written[workers] = shard_bytes(dest)
    assert written[1] == written[2]
    got = samples_of(tmp_path / "w2")
    assert sorted(got) == [f"{i:06d}" for i in range(300)]
    for i in (0, 6, 13, 299):
        sample = got[f"{i:06d}"]
        assert sample["txt"] == f"item {i}".encode() and sample["cls"] == str(i * i).encode()
        assert np.array_equal(np.load(io.BytesIO(sample["tokens.npy"])), np.arange(i % 7, dtype=np.int32))
    assert len(shardkit.load_manifest(str(tmp_path / "w2")).shards) == 9  # cut by --max-samples after the map


def test_shuffle_and_order_apply_to_what_map_returned(tmp_path):
    keys = {}
    for shuffle in (True, False):
        dest = tmp_path / str(shuffle)
        write_dataset(range(100), str(dest), map=fns.square, options=WriteOptions(workers=2, shuffle=shuffle))
        manifest = shardkit.load_manifest(str(dest))
        with tarfile.open(dest / manifest.shards[0].path) as tar:
            keys[shuffle] = [m.name.partition(".")[0] for m in tar.getmembers()][::3]
    assert keys[False] == [f"{i:06d}" for i in range(100)]
    assert sorted(keys[True]) == keys[False] and keys[True] != keys[False]


def test_a_sequence_of_sample_dicts_is_written_as_it_is(tmp_path):
    items = [{"__key__": f"s{i}", "json": {"i": i}, "jpg": bytes([i]) * 10} for i in range(20)]
    write_dataset(items, str(tmp_path / "out"), options=WriteOptions(workers=1))
    got = samples_of(tmp_path / "out")
    assert got["s7"] == {"jpg": bytes([7]) * 10, "json": b'{"i":7}'}
    assert len(got) == 20


def test_generators_fan_out_and_none_is_counted_as_filtered(tmp_path):
    report = write_dataset(range(50), str(tmp_path / "out"), map=fns.fan_out, options=WriteOptions(workers=2))
    kept = [i for i in range(50) if i % 5]
    expected = {f"{i:06d}_{c}" for i in kept for c in range(2 if i % 2 == 0 else 1)}
    assert set(samples_of(tmp_path / "out")) == expected
    assert (report.num_items, report.num_filtered, report.num_failed) == (50, 10, 0)
    assert report.manifest.num_skipped == 0
    assert report.manifest.source["map"] == "tests.write.map_functions:fan_out"
    assert report.manifest.source["num_filtered"] == 10


def test_a_map_that_raises_names_the_item_and_publishes_nothing(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(MapError) as caught:
        write_dataset(list(range(40)), str(dest), map=fns.fails_on_13, options=WriteOptions(workers=2))
    message = str(caught.value)
    assert "map tests.write.map_functions:fails_on_13 failed on item 13 (13): ValueError: cannot handle 13" in message
    assert "--on-error skip" in message
    assert caught.value.path == "items#row=13"
    assert not (dest / "manifest.json").exists()
    assert not glob.glob(str(dest / "*.tar*"))


def test_skip_records_each_failed_item_apart_from_the_filtered(tmp_path):
    report = write_dataset(range(40), str(tmp_path / "out"), map=fns.fails_on_13,
                           options=WriteOptions(workers=2, on_error="skip"))  # fmt: skip
    assert report.manifest.num_samples == 39 and (report.num_failed, report.num_filtered) == (1, 0)
    (skipped,) = report.manifest.skipped
    assert skipped.path == "items#row=13"
    assert skipped.reason.startswith("map_error: map tests.write.map_functions:fails_on_13 failed on item 13")
    assert "000013" not in samples_of(tmp_path / "out")


@pytest.mark.parametrize(
    "fn, item, says",
    [
        (fns.returns_text, 3, "map's output for item 3 (3) is a str, not a sample"),
        (fns.forgets_key, 4, "map's output for item 4 (4): sample needs a non-empty str '__key__', got None"),
        (fns.unencodable, 5, "map's output for item 5 (5): sample '000005', field 'txt': cannot store a object"),
    ],
)
def test_what_map_returns_that_is_not_a_sample_is_named_by_its_item(tmp_path, fn, item, says):
    with pytest.raises(MapError) as caught:
        write_dataset(range(10), str(tmp_path / "out"), map=fn, options=WriteOptions(workers=1))
    assert says in str(caught.value)
    assert caught.value.reason == "bad_sample" and caught.value.path == f"items#row={item}"
    report = write_dataset(range(10), str(tmp_path / "skipped"), map=fn, options=WriteOptions(on_error="skip"))
    assert report.manifest.num_samples == 9
    assert report.manifest.skipped[0].reason.startswith("bad_sample: ")


def test_one_key_from_two_items_names_both(tmp_path):
    with pytest.raises(DuplicateSampleError) as caught:
        write_dataset(range(10), str(tmp_path / "out"), map=fns.same_key_twice, options=WriteOptions(workers=2))
    assert "sample key 'dup' appears in both item 2 and item 7" in str(caught.value)


def test_a_write_in_which_every_item_failed_fails(tmp_path, capsys):
    with pytest.raises(SourceError, match=r"no sample to write: of 30 items, map dropped 0 .* and 30 failed"):
        write_dataset(range(30), str(tmp_path / "out"), map=fns.always_fails, options=WriteOptions(on_error="skip"))
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize(
    "source, says",
    [
        (iter(range(3)), "pass list(iterator)"),
        ({"a": 1}, "must be a sequence"),
    ],
)
def test_sources_that_are_not_sequences_are_refused(tmp_path, source, says):
    with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
        write_dataset(source, str(tmp_path / "out"), map=fns.square)


def test_a_map_that_does_not_pickle_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match="does not pickle"):
        write_dataset(range(3), str(tmp_path / "out"), map=lambda i: {"__key__": str(i), "txt": "x"})
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- kill -9


KILLED = textwrap.dedent(
    """
    import functools, sys
    from shardkit.write.parallel import WriteOptions, write_dataset
    from tests.write.map_functions import logged
    write_dataset(range(int(sys.argv[3])), sys.argv[1], map=functools.partial(logged, sys.argv[2]),
                  options=WriteOptions(workers=2, max_samples=50, seed=1))
    """
)


def _logged_items(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_kill_9_then_resume_gives_the_clean_runs_bytes_without_mapping_finished_partitions_again(tmp_path):
    num_items = 480  # 30 partitions of 16
    dest, log = tmp_path / "out", tmp_path / "calls.log"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(dest), str(log), str(num_items)], cwd=ROOT,
                            start_new_session=True)  # fmt: skip
    stage = dest / ".shardkit-journal" / "map"
    deadline = time.monotonic() + 120
    while len(glob.glob(str(stage / "p-*.json"))) < 6:
        assert proc.poll() is None, "the write ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (dest / "manifest.json").exists()
    finished = []
    for path in glob.glob(str(stage / "p-*.json")):
        summary = json.loads(Path(path).read_text())
        finished += range(summary["signature"]["start"], summary["signature"]["end"])
    assert finished and len(finished) < num_items
    assert not [p for p in os.listdir(dest) if p.endswith(".tar")] or all(
        not p.endswith(".tmp") for p in os.listdir(dest)
    )
    calls_before = len(_logged_items(log))

    write_dataset(range(num_items), str(dest), map=functools.partial(fns.logged, str(log)),
                  options=WriteOptions(workers=2, max_samples=50, seed=1, resume=True))  # fmt: skip
    again = _logged_items(log)[calls_before:]
    assert not set(again) & set(finished)  # finished partitions were not mapped again
    assert set(again) | set(_logged_items(log)[:calls_before]) >= set(range(num_items))

    clean = tmp_path / "clean"
    write_dataset(range(num_items), str(clean), map=functools.partial(fns.logged, str(log)),
                  options=WriteOptions(workers=1, max_samples=50, seed=1))  # fmt: skip
    assert shard_bytes(dest) == shard_bytes(clean)
    assert not (dest / ".shardkit-journal").exists()


# ---------------------------------------------------------------- path sources


def test_a_path_sources_samples_reach_map_as_the_reader_sees_them(imagefolder, tmp_path):
    root, files = imagefolder
    dest = tmp_path / "out"
    assert main(["write", root, str(dest), "--map", "tests.write.map_functions:upper_text", "-q", "--workers", "2"]) == 0
    got = samples_of(dest)
    assert len(got) == len(files)
    for rel, (data, label) in files.items():
        key = rel.rsplit(".", 1)[0]
        assert got[key]["jpg"] == data
        assert got[key]["cls"] == str(2 * label).encode()
        assert got[key]["txt"] == key.upper().encode()
    manifest = shardkit.load_manifest(str(dest))
    assert manifest.source["format"] == "imagefolder" and manifest.class_names == ("cat", "dog", "eel")


def test_path_source_map_output_does_not_depend_on_workers(imagefolder, tmp_path):
    root, _ = imagefolder
    for workers in ("1", "2"):
        assert main(["write", root, str(tmp_path / workers), "--map", "tests.write.map_functions:upper_text", "-q",
                     "--workers", workers, "--max-samples", "5"]) == 0  # fmt: skip
    assert shard_bytes(tmp_path / "1") == shard_bytes(tmp_path / "2")


@pytest.mark.parametrize(
    "spec, says",
    [
        ("no_such_module_xyz:fn", "--map no_such_module_xyz:fn: cannot import module 'no_such_module_xyz'"),
        ("tests.write.map_functions:nope", "--map tests.write.map_functions:nope: module tests.write.map_functions"),
        ("tests.write.map_functions:NOT_CALLABLE", "is an int, not a function"),
        ("tests.write.map_functions", "--map must be MODULE:FUNCTION"),
        ("broken_on_import:fn", "--map broken_on_import:fn: importing module 'broken_on_import' failed: ZeroDivisionError"),
    ],
)
def test_cli_map_that_cannot_be_imported_is_one_line_and_exit_2(imagefolder, tmp_path, monkeypatch, capsys, spec, says):
    root, _ = imagefolder
    (tmp_path / "broken_on_import.py").write_text("x = 1 / 0\n")
    monkeypatch.chdir(tmp_path)  # the current folder is searched, as python -m does
    monkeypatch.delitem(sys.modules, "broken_on_import", raising=False)
    assert main(["write", root, str(tmp_path / "out"), "--map", spec, "-q"]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_cli_imports_a_map_from_the_current_folder(imagefolder, tmp_path, monkeypatch):
    root, files = imagefolder
    (tmp_path / "my_prep.py").write_text(
        "def tag(sample):\n    return {'__key__': sample['__key__'], 'txt': 'tagged', 'jpg': sample['jpg']}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "my_prep", raising=False)
    proc = subprocess.run([sys.executable, "-m", "shardkit", "write", root, "out", "--map", "my_prep:tag", "-q"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = samples_of(tmp_path / "out")
    assert {s["txt"] for s in got.values()} == {b"tagged"} and len(got) == len(files)


def test_cli_reports_items_samples_filtered_and_failed(imagefolder, tmp_path, capsys):
    root, files = imagefolder
    assert main(["write", root, str(tmp_path / "out"), "--map", "tests.write.map_functions:upper_text"]) == 0
    out = capsys.readouterr().out
    assert f"map: {len(files)} items read, {len(files)} samples written, 0 filtered, 0 failed" in out


def test_items_that_do_not_pickle_are_refused_before_any_work(tmp_path):
    import threading

    with pytest.raises(UsageError, match=r"items 0\.\.15 do not pickle \(TypeError: cannot pickle '_thread.lock'"):
        write_dataset([1, threading.Lock()] * 20, str(tmp_path / "out"), map=fns.square, options=WriteOptions(workers=2))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_cli_verbose_prints_the_functions_own_frames(imagefolder, tmp_path, monkeypatch, capsys):
    root, _ = imagefolder
    (tmp_path / "prep_fails.py").write_text("def prep(sample):\n    return helper(sample)\n\n\ndef helper(sample):\n"
                                            "    raise KeyError('caption')\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "prep_fails", raising=False)
    assert main(["write", root, str(tmp_path / "out"), "--map", "prep_fails:prep", "-q", "--workers", "2"]) == 2
    quiet = capsys.readouterr().err
    assert quiet.strip().splitlines() == [
        f"shardkit: error: map prep_fails:prep failed on {root}/cat/img_000.jpg: KeyError: 'caption'; fix the "
        "function, or pass on_error='skip' (--on-error skip) to record such items and go on"
    ]
    assert main(["write", root, str(tmp_path / "out"), "--map", "prep_fails:prep", "-q", "-v"]) == 2
    verbose = capsys.readouterr().err
    assert "the function's traceback (last frames):" in verbose
    assert 'prep_fails.py", line 6, in helper' in verbose and "raise KeyError('caption')" in verbose


MEMORY = textwrap.dedent(
    """
    import resource, sys
    from shardkit.write.parallel import WriteOptions, write_dataset
    from tests.write.map_functions import one_in_a_million
    report = write_dataset(range(int(sys.argv[1])), sys.argv[2], map=one_in_a_million, options=WriteOptions(workers=2))
    print(report.manifest.num_samples, report.num_filtered, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """
)


def test_the_drivers_memory_stays_flat_from_10_5_to_10_7_items(tmp_path):
    """The driver holds one summary per partition and the items of the partitions in flight (a range is
    sliced, never listed): its peak grows by partitions' bookkeeping only, not by items."""
    peaks = {}
    for num_items in (10**5, 10**7):
        done = subprocess.run([sys.executable, "-c", MEMORY, str(num_items), str(tmp_path / str(num_items))],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        samples, filtered, peak_kib = map(int, done.stdout.split())
        assert (samples, filtered) == (num_items // 10**6 + (num_items < 10**6), num_items - samples)
        peaks[num_items] = peak_kib
    assert peaks[10**7] - peaks[10**5] < 40 * 1024, peaks  # ~15 MB measured: 2,442 partitions' summaries


TORCH_AFTER_FORK = """
import sys
import torch
import shardkit

torch.set_num_threads(2)
torch.ones(4_000_000).mul_(2)  # OpenMP's threads start in this, the parent, process


def double(item):
    i, _ = item
    return {"__key__": f"k{i}", "npy": (torch.arange(1_000_000) * 2).clone().numpy()[:4]}  # parallel operators


report = shardkit.write_dataset(list(enumerate([None] * 4)), sys.argv[1], map=double,
                                options=shardkit.WriteOptions(workers=2))
print(report.manifest.num_samples)
"""


def test_a_map_running_torch_operators_in_forked_workers_after_the_parent_used_them_finishes(tmp_path):
    # OpenMP's thread pool does not survive fork: without one thread per
    # worker (as DataLoader's workers have), the first parallel operator in a
    # worker waits forever.
    done = subprocess.run(
        [sys.executable, "-c", TORCH_AFTER_FORK, str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.split()[-1] == "4", done.stderr[-2000:]
