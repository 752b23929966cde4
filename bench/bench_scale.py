#!/usr/bin/env python3
"""The reader at internet scale (issue #22): opening 10^3 to 10^6 shards.

Side by side in one run, over the same synthetic datasets:

- ``shardkit``: ``ShardDataset(DIR, batch_size=32, collate=len)``; the
  dataset is written as today's format-1 ``manifest.json`` and, when the
  shardkit being measured has ``shardkit upgrade``, upgraded in place (the
  JSON records which format was measured); also ``IndexedDataset(DIR)``'s
  open in a fresh process;
- ``shardkit-wide`` and ``shardkit-irregular`` (issue #42): the same over
  shards named ``shard-0000000.tar`` (7 digits: a naming pattern, not the
  writer's) and over names of no single pattern
  (``c3/lemon-5f1e0c9a2b7d4e68.tar`` in 256 subfolders: the table stores
  every path), each written as format 1 and upgraded;
- ``webdataset``: ``WebDataset("DIR/shard-{000000..N-1}.tar",
  shardshuffle=1000).batched(32)`` over the same tar files;
- ``litdata``: ``litdata.StreamingDataset(DIR, shuffle=True)`` read by its
  ``StreamingDataLoader``: an ``index.json`` with one ``chunks`` entry per
  chunk file;
- ``mosaic``: ``streaming.StreamingDataset(local=DIR, shuffle=True,
  batch_size=32)``: an MDS ``index.json`` with one ``shards`` entry per file.

**Synthetic metadata, real reads.** Each library's own writer writes one
real shard (100 samples of ~1 KB: a 1 KB ``bin`` and an int ``cls``); its
metadata entry is then repeated N times, each pointing at a hard link to that
shard (ext4 allows 65,000 links per file: more copies are made as needed),
so opening parses N real entries and reading reads real bytes. 100 samples
per shard make 5x10^7 samples at 5x10^5 shards; the LAION-scale rows
repeat the peers of ``--laion-peers`` (default shardkit and Mosaic, whose
per-sample arrays grow with the sample count) with a real 10,000-sample shard
(~10 MB): 5x10^9 samples at 5x10^5 shards, the scale of LAION-5B. A 16-shard dataset is each peer's "empty" reference.

**Per cell** (peer, samples per shard, shards), two fresh child processes
with a timeout and an address-space cap (``RLIMIT_AS``), so a peer that fails,
runs out of memory or hangs at a size is recorded with its error and the run
goes on (a peer that fails at a size is not tried at larger ones):

1. ``memory``: open time (constructing the dataset, modules imported
   before; for LitData also its ``len()``, where it reads ``index.json``);
   pickled size of the dataset object; the parent's memory after
   opening; then a DataLoader with 8 workers, read until each worker has
   delivered a batch (in-order loading), and each process's unique set size
   (USS: ``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup``,
   so pages shared by fork count once; the median of 3 snapshots);
2. ``first_batch``: open again, then the time from ``iter(loader)`` to the
   first batch with 4 workers.

The metadata files were just written or read by the previous cell, so they
are in the page cache: open time is parsing, not disk. The parent stops a
child when the machine's available memory falls below ``--min-free-gb``.

Writes ``bench/results/scale.json`` / ``.md`` / ``.png``::

    make bench-scale                                       # sets up .venv-scale (the peers), then:
    .venv-scale/bin/python bench/bench_scale.py            # 10^3 .. 10^6 shards: ~25 min on 2 cores,
                                                           # +7 min the first time to make ~3 GB of metadata
    .venv-scale/bin/python bench/bench_scale.py --quick    # 10^3 and 10^4 shards
    .venv-scale/bin/python bench/bench_scale.py --sizes 1000,500000 --peers shardkit,webdataset
    .venv/bin/python bench/bench_scale.py --sizes 1000,500000 --peers shardkit-wide,shardkit-irregular \
        --laion-peers '' --out bench/results/scale-names.json    # issue #42: shardkit's peers only

The writer part (issue #23: scan + plan memory and rate, end-to-end writing
against peers on JSONL rows and on an ImageFolder of 10^5 small files,
shuffle quality) is ``bench_scale.py --writer [--help]``; see
``bench/harness/scale_writer.py``. It writes ``bench/results/scale-writer.*``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, REPO_ROOT)

from bench.common import git_commit, machine, plot_path, save_record  # noqa: E402
from bench.harness.memory import _children, smaps  # noqa: E402
from bench.harness.scale_data import PAYLOAD_BYTES, SHARDKIT_PEERS, has_upgrade, prepare  # noqa: E402

PEERS = ("shardkit", "shardkit-wide", "shardkit-irregular", "webdataset", "litdata", "mosaic")
SIZES = (1_000, 10_000, 100_000, 500_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000)
#: The "empty dataset" each peer's memory is compared with.
BASELINE_SHARDS = 16
SAMPLES_PER_SHARD = 100
LAION_SAMPLES_PER_SHARD = 10_000
BATCH = 32
MEMORY_WORKERS = 8
FIRST_BATCH_WORKERS = 4
SNAPSHOTS = 3
#: Target size and the targets of issue #22 (at 5x10^5 shards).
TARGET_SHARDS = 500_000
TARGETS = {
    "open_s": 1.0,
    "extra_mb_per_process": 50.0,
    "worker_growth_mb": 20.0,
    "pickled_mb": 1.0,
    "first_batch_s": 2.0,
}
CELL_ANSWER = "@@bench-scale "


# --------------------------------------------------------------------------- one cell (child process)


def count_batch(batch: list[Any]) -> int:
    return len(batch)


def import_peer(peer: str) -> None:
    """Import what a peer needs before any timing (so open time is not import time)."""
    import torch.utils.data  # noqa: F401

    if peer in SHARDKIT_PEERS:
        import shardkit  # noqa: F401
    elif peer == "webdataset":
        import webdataset  # noqa: F401
    elif peer == "litdata":
        import litdata  # noqa: F401
    elif peer == "mosaic":
        import streaming  # noqa: F401
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()


def open_dataset(peer: str, path: str, num_shards: int) -> Any:
    if peer in SHARDKIT_PEERS:
        import shardkit

        return shardkit.ShardDataset(path, seed=0, buffer_size=1000, batch_size=BATCH, collate=count_batch)
    if peer == "webdataset":
        import webdataset as wds

        pattern = os.path.join(path, f"shard-{{000000..{num_shards - 1:06d}}}.tar")
        return wds.WebDataset(pattern, shardshuffle=1000, seed=0, empty_check=False).batched(
            BATCH, collation_fn=count_batch
        )
    if peer == "litdata":
        import litdata

        return litdata.StreamingDataset(path, shuffle=True, seed=0)
    if peer == "mosaic":
        import streaming

        return streaming.StreamingDataset(local=path, shuffle=True, shuffle_seed=0, batch_size=BATCH)
    raise ValueError(f"unknown peer {peer!r}")


def make_loader(peer: str, dataset: Any, workers: int) -> Any:
    from torch.utils.data import DataLoader

    if peer in (*SHARDKIT_PEERS, "webdataset"):  # batched in the workers
        return DataLoader(dataset, batch_size=None, num_workers=workers)
    if peer == "litdata":
        import litdata

        return litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=count_batch)
    return DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=count_batch)


def cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def worker_pids() -> list[int]:
    """This process's DataLoader workers: forked children running our own
    command line (not helpers such as multiprocessing's resource tracker)."""
    own = cmdline(os.getpid())
    out = []
    for pid in _children(os.getpid()):
        try:
            if cmdline(pid) == own:
                out.append(pid)
        except OSError:
            pass
    return out


def memory_snapshot() -> dict[str, Any]:
    """USS/RSS of this process and each DataLoader worker, median of a few
    snapshots, MB."""
    per_pid: dict[int, list[dict[str, float]]] = {}
    for _ in range(SNAPSHOTS):
        for pid in [os.getpid(), *worker_pids()]:
            try:
                per_pid.setdefault(pid, []).append(smaps(pid))
            except OSError:
                pass
        time.sleep(0.3)
    median = {
        pid: {key: statistics.median(s[key] for s in snaps) for key in snaps[0]} for pid, snaps in per_pid.items()
    }
    parent = median.pop(os.getpid())
    return {"parent": parent, "workers": list(median.values())}


def run_indexed(path: str) -> dict[str, Any]:
    """The ``indexed`` phase (shardkit only): open an ``IndexedDataset``,
    its pickled size and the process's USS, then read one sample."""
    import shardkit

    before = smaps(os.getpid())
    start = time.perf_counter()
    dataset = shardkit.IndexedDataset(path)
    result: dict[str, Any] = {"open_s": time.perf_counter() - start, "parent_before_open": before}
    result["parent_after_open"] = smaps(os.getpid())
    result["pickled_bytes"] = len(pickle.dumps(dataset))
    start = time.perf_counter()
    dataset[len(dataset) - 1]
    result["last_sample_s"] = time.perf_counter() - start
    return result


def run_cell(peer: str, path: str, num_shards: int, phase: str) -> dict[str, Any]:
    import_peer(peer)
    if phase == "indexed":
        return run_indexed(path)
    start = time.perf_counter()
    dataset = open_dataset(peer, path, num_shards)
    result: dict[str, Any] = {"construct_s": time.perf_counter() - start}
    if peer == "litdata":  # reads its index.json on the first len(), not in the constructor
        result["len"] = len(dataset)
    result["open_s"] = time.perf_counter() - start
    if phase == "first_batch":
        loader = make_loader(peer, dataset, FIRST_BATCH_WORKERS)
        start = time.perf_counter()
        iterator = iter(loader)
        next(iterator)
        result["first_batch_s"] = time.perf_counter() - start
        del iterator
        return result
    result["parent_after_open"] = smaps(os.getpid())
    try:
        result["pickled_bytes"] = len(pickle.dumps(dataset))
    except Exception as exc:  # recorded: some datasets do not pickle
        result["pickle_error"] = f"{type(exc).__name__}: {exc}"[:500]
    loader = make_loader(peer, dataset, MEMORY_WORKERS)
    iterator = iter(loader)
    got = 0
    for _ in range(MEMORY_WORKERS):  # in order: batch k comes from worker k
        try:
            next(iterator)
        except StopIteration:
            break
        got += 1
    result["batches_before_snapshot"] = got
    result.update(memory_snapshot())
    del iterator
    return result


def cell_main(spec: str) -> int:
    args = json.loads(spec)
    result = run_cell(args["peer"], args["path"], args["num_shards"], args["phase"])
    print(CELL_ANSWER + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- the parent


def mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def run_child(spec: dict[str, Any], *, timeout_s: float, as_limit_gb: float, min_free_gb: float) -> dict[str, Any]:
    """Run one cell phase in a fresh interpreter; its answer, or what went wrong."""
    limit = int(as_limit_gb * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--cell", json.dumps(spec)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=cap,
        start_new_session=True,
    )
    started = time.monotonic()
    killed = None
    try:
        while proc.poll() is None and killed is None:
            time.sleep(0.25)
            if time.monotonic() - started > timeout_s:
                killed = f"timed out after {timeout_s:.0f} s"
            elif mem_available_gb() < min_free_gb:
                killed = f"stopped: the machine's available memory fell below {min_free_gb} GB"
    finally:  # the child and its workers are a session of their own: end it with us
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - started
    if killed:
        return {"error": killed, "wall_s": wall, "stderr_tail": stderr[-1500:]}
    for line in stdout.splitlines():
        if line.startswith(CELL_ANSWER):
            return {**json.loads(line[len(CELL_ANSWER) :]), "wall_s": wall}
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return {"error": lines[-1][:500] if lines else f"exit code {proc.returncode}", "wall_s": wall,
            "stderr_tail": stderr[-3000:]}  # fmt: skip


def peer_available(peer: str) -> str | None:
    module = {**dict.fromkeys(SHARDKIT_PEERS, "shardkit"), "webdataset": "webdataset", "litdata": "litdata", "mosaic": "streaming"}[peer]
    try:
        __import__(module)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("shardkit", "torch", "webdataset", "litdata", "mosaicml-streaming", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out



def summarize(cell: dict[str, Any]) -> None:
    """Add the per-cell numbers the table and plot use (MB)."""
    memory = cell.get("memory", {})
    workers = memory.get("workers") or []
    if workers:
        uss = [w["uss_mb"] for w in workers]
        cell["worker_uss_mb_mean"] = statistics.fmean(uss)
        cell["worker_uss_mb_max"] = max(uss)
        cell["num_worker_processes"] = len(uss)
    if "parent_after_open" in memory:
        cell["parent_uss_mb"] = memory["parent_after_open"]["uss_mb"]
    if "open_s" in memory:
        cell["open_s"] = memory["open_s"]
    if "pickled_bytes" in memory:
        cell["pickled_mb"] = memory["pickled_bytes"] / 1e6
    if "first_batch_s" in cell.get("first_batch", {}):
        cell["first_batch_s"] = cell["first_batch"]["first_batch_s"]
    if "open_s" in cell.get("indexed", {}):
        cell["indexed_open_s"] = cell["indexed"]["open_s"]
        cell["indexed_open_uss_mb"] = cell["indexed"]["parent_after_open"]["uss_mb"] - cell["indexed"]["parent_before_open"]["uss_mb"]
    errors = [f"{phase}: {cell[phase]['error']}" for phase in ("memory", "first_batch", "indexed") if "error" in cell.get(phase, {})]
    if errors:
        cell["error"] = "; ".join(errors)


def row_sets(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(peer, samples per shard) pairs to run."""
    rows = [(peer, SAMPLES_PER_SHARD) for peer in args.peers]
    rows += [(peer, LAION_SAMPLES_PER_SHARD) for peer in args.laion_peers if peer in args.peers]
    return rows


def measure(args: argparse.Namespace, record: dict[str, Any], save: Callable[[], None]) -> None:
    upgrade = has_upgrade()
    record["shardkit_upgrade_available"] = upgrade
    unavailable = {peer: peer_available(peer) for peer in args.peers}
    record["unavailable"] = {peer: why for peer, why in unavailable.items() if why}
    sizes = [BASELINE_SHARDS, *args.sizes]
    for peer, samples in row_sets(args):
        failed_at = None
        for num_shards in sizes:
            cell: dict[str, Any] = {"peer": peer, "samples_per_shard": samples, "num_shards": num_shards}
            record["cells"].append(cell)
            if unavailable[peer]:
                cell["error"] = f"not installed: {unavailable[peer]}"
                continue
            if failed_at is not None:
                cell["error"] = f"not run: failed at {failed_at} shards"
                continue
            print(f"{peer} x {samples}/shard x {num_shards} shards: preparing", flush=True)
            cell["dataset"] = prepare(args.workdir, peer, samples, num_shards, upgrade=upgrade)
            for phase in ("memory", "first_batch", *(("indexed",) if peer in SHARDKIT_PEERS else ())):
                spec = {"peer": peer, "path": cell["dataset"]["path"], "num_shards": num_shards, "phase": phase}
                cell[phase] = run_child(
                    spec, timeout_s=args.timeout_s, as_limit_gb=args.as_limit_gb, min_free_gb=args.min_free_gb
                )
                if "error" in cell[phase]:
                    break
            summarize(cell)
            if "error" in cell:
                failed_at = num_shards
            print(f"  {json.dumps({k: v for k, v in cell.items() if k not in ('memory', 'first_batch', 'indexed')})}", flush=True)
            save()


# --------------------------------------------------------------------------- report


def label(peer: str, samples: int) -> str:
    return peer if samples == SAMPLES_PER_SHARD else f"{peer} ({samples:,}/shard)"


def fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def cell_of(record: dict[str, Any], peer: str, samples: int, num_shards: int) -> dict[str, Any] | None:
    for cell in record["cells"]:
        if (cell["peer"], cell["samples_per_shard"], cell["num_shards"]) == (peer, samples, num_shards):
            return cell
    return None


def target_check(record: dict[str, Any], peer: str, samples: int) -> dict[str, Any]:
    """The issue's targets for one row set, at :data:`TARGET_SHARDS` (or the
    largest size run when that is not in the run)."""
    sizes = [s for s in record["sizes"] if s != BASELINE_SHARDS]
    at = TARGET_SHARDS if TARGET_SHARDS in sizes else max(sizes)
    cell = cell_of(record, peer, samples, at) or {}
    empty = cell_of(record, peer, samples, BASELINE_SHARDS) or {}
    small = cell_of(record, peer, samples, min(sizes)) or {}
    large = cell_of(record, peer, samples, max(sizes)) or {}

    def diff(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
        return a[key] - b[key] if key in a and key in b else None

    extra = [diff(cell, empty, "parent_uss_mb"), diff(cell, empty, "worker_uss_mb_max")]
    values = {
        "at_shards": at,
        "open_s": cell.get("open_s"),
        "extra_mb_per_process": None if None in extra else max(extra),
        "worker_growth_mb": diff(large, small, "worker_uss_mb_max"),
        "worker_growth_range": [min(sizes), max(sizes)],
        "pickled_mb": cell.get("pickled_mb"),
        "first_batch_s": cell.get("first_batch_s"),
        "error": cell.get("error"),
    }
    failed = [c for c in record["cells"] if (c["peer"], c["samples_per_shard"]) == (peer, samples)
              and "error" in c and not c["error"].startswith("not run")]  # fmt: skip
    if failed and failed[0]["num_shards"] <= at:
        values["error"] = f"fails from {failed[0]['num_shards']:,} shards: {failed[0]['error']}"
    values["met"] = {
        key: (values[key] is not None and values[key] <= limit) for key, limit in TARGETS.items()
    }  # fmt: skip
    return values


def table(record: dict[str, Any]) -> str:
    fmt_note = {
        1: "format 1 (manifest.json with one entry per shard)",
        2: "format 2 (shard table beside manifest.json)",
    }
    formats = sorted({c["dataset"]["format_version"] for c in record["cells"] if "format_version" in c.get("dataset", {})})
    lines = [
        "# Reader at internet scale: opening 10^3 to 10^6 shards",
        "",
        f"shardkit commit {record['git_commit']}, measured in "
        + (", ".join(fmt_note.get(f, f"format {f}") for f in formats) or "no shardkit cell")
        + f"; `shardkit upgrade` {'available and run' if record['shardkit_upgrade_available'] else 'not available'}. "
        + ", ".join(f"{k} {v}" for k, v in record["versions"].items() if v),
        "",
        f"Synthetic metadata over hard links to one real shard per format: {SAMPLES_PER_SHARD} samples of "
        f"~{PAYLOAD_BYTES // 1000} KB per shard ({SAMPLES_PER_SHARD * TARGET_SHARDS:.0e} samples at "
        f"{TARGET_SHARDS:,} shards); rows marked {LAION_SAMPLES_PER_SHARD:,}/shard use a real "
        f"{LAION_SAMPLES_PER_SHARD:,}-sample shard (LAION scale: {LAION_SAMPLES_PER_SHARD * TARGET_SHARDS:.1e} "
        f"samples at {TARGET_SHARDS:,} shards). {BASELINE_SHARDS} shards is the \"empty\" reference. "
        f"Each cell in fresh processes (timeout {record['timeout_s']:.0f} s, address space capped at "
        f"{record['as_limit_gb']} GiB); a reader that fails at a size is not run at larger ones. Open: constructing the dataset; for LitData also its `len()`, since it reads index.json there (the others read their metadata in the constructor; webdataset expands the brace pattern); metadata page-cache-hot. Memory: USS "
        f"(private pages) of the parent and of each of {MEMORY_WORKERS} DataLoader workers once each has "
        f"delivered a batch. First batch: `iter(loader)` to the first batch, {FIRST_BATCH_WORKERS} workers. "
        "IndexedDataset (shardkit only): its open in a fresh process, and the USS that open added. "
        "shardkit-wide: shards named `shard-0000000.tar` (7 digits, not the writer's 6); shardkit-irregular: "
        "names of no single pattern (`c3/lemon-5f1e0c9a2b7d4e68.tar`, 256 subfolders), whose table stores every "
        "path (issue #42); both written as format 1 and upgraded, as the shardkit rows are. "
        f"{record['machine']['cpus']} CPUs shared with other jobs (load average {record['load_before']:.1f} "
        f"before, {record.get('load_after', float('nan')):.1f} after); {record['seconds'] / 60:.1f} minutes.",
        "",
        "| reader | shards | open (s) | parent USS (MB) | worker USS mean / max (MB) | pickled (MB) "
        "| first batch, 4 workers (s) | IndexedDataset open (s) / +USS (MB) | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for peer, samples in record["row_sets"]:
        for num_shards in record["sizes"]:
            cell = cell_of(record, peer, samples, num_shards)
            if cell is None:
                continue
            note = (cell.get("error") or "").replace("|", "/").replace("\n", " ")[:160]
            if "pickle_error" in cell.get("memory", {}):
                note = (note + " pickle: " + cell["memory"]["pickle_error"][:100]).strip()
            workers = (
                f"{cell['worker_uss_mb_mean']:.0f} / {cell['worker_uss_mb_max']:.0f}"
                if "worker_uss_mb_mean" in cell else "–"
            )  # fmt: skip
            indexed = (
                f"{cell['indexed_open_s']:.2f} / {cell['indexed_open_uss_mb']:.0f}" if "indexed_open_s" in cell else "–"
            )
            lines.append(
                f"| {label(peer, samples)} | {num_shards:,} | {fmt(cell.get('open_s'), '.2f')} "
                f"| {fmt(cell.get('parent_uss_mb'), '.0f')} | {workers} | {fmt(cell.get('pickled_mb'), '.3f')} "
                f"| {fmt(cell.get('first_batch_s'), '.2f')} | {indexed} | {note} |"
            )
    lines += [
        "",
        f"## Targets of issue #22 (at {TARGET_SHARDS:,} shards)",
        "",
        f"open ≤ {TARGETS['open_s']:g} s; ≤ {TARGETS['extra_mb_per_process']:g} MB more per process (parent or "
        f"worker, USS) than the {BASELINE_SHARDS}-shard dataset; per-worker USS growth from the smallest to the "
        f"largest size ≤ {TARGETS['worker_growth_mb']:g} MB; pickled ≤ {TARGETS['pickled_mb']:g} MB; first batch "
        f"with 4 workers ≤ {TARGETS['first_batch_s']:g} s. ✓ met, ✗ not met, – not measured. At "
        f"{SAMPLES_PER_SHARD} samples/shard the {BASELINE_SHARDS}-shard reference gives each worker 2 shards "
        f"(~200 KB), less than a reader's read-ahead holds, so a worker's extra memory there includes read-ahead "
        f"buffers as well as metadata (compare the worker column at {BASELINE_SHARDS} and 1,000 shards); the "
        f"{LAION_SAMPLES_PER_SHARD:,}/shard rows (10 MB shards) do not have this.",
        "",
        "| reader | at shards | open (s) | extra MB per process | worker growth (MB) | pickled (MB) | first batch (s) "
        "| note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for peer, samples in record["row_sets"]:
        check = record["targets"][label(peer, samples)]

        def mark(key: str, spec: str, check: dict[str, Any] = check) -> str:
            value = check[key]
            if value is None:
                return "–"
            return f"{value:{spec}} {'✓' if check['met'][key] else '✗'}"

        lo, hi = check["worker_growth_range"]
        lines.append(
            f"| {label(peer, samples)} | {check['at_shards']:,} | {mark('open_s', '.2f')} "
            f"| {mark('extra_mb_per_process', '.0f')} | {mark('worker_growth_mb', '.0f')} ({lo:.0e}→{hi:.0e}) "
            f"| {mark('pickled_mb', '.3f')} | {mark('first_batch_s', '.2f')} "
            f"| {(check['error'] or '').replace('|', '/')[:160]} |"
        )
    mosaic = record["versions"].get("mosaicml-streaming") or ""
    if mosaic.startswith("0.10."):
        lines += [
            "",
            f"Mosaic is {mosaic}: mosaicml-streaming 0.11 and later require numpy < 2.2, and `make bench-scale` keeps "
            f"the test venv's numpy ({record['versions'].get('numpy')}), so pip picks the newest Mosaic that accepts it.",
        ]
    if record["unavailable"]:
        lines += ["", "Not installed: " + "; ".join(f"{p}: {why}" for p, why in record["unavailable"].items())]
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (
        ("open_s", "open (s)", TARGETS["open_s"]),
        ("worker_uss_mb_max", "largest worker USS (MB)", None),
        ("parent_uss_mb", "parent USS (MB)", None),
    )
    for ax, (key, title, target) in zip(axes, panels):
        for peer, samples in record["row_sets"]:
            points = [
                (c["num_shards"], c[key])
                for c in record["cells"]
                if c["peer"] == peer and c["samples_per_shard"] == samples and key in c
            ]
            failed = [
                c["num_shards"]
                for c in record["cells"]
                if c["peer"] == peer and c["samples_per_shard"] == samples and "error" in c
            ]
            name = label(peer, samples) + (f" (fails from {min(failed):,})" if failed else "")
            if points:
                xs, ys = zip(*points)
                style = "--" if samples != SAMPLES_PER_SHARD else "-"
                ax.plot(xs, ys, style, marker="o", label=name)
        if target is not None:
            ax.axhline(target, color="grey", linestyle=":", label=f"target at {TARGET_SHARDS:.0e}")
        ax.set_xscale("log")
        if key == "open_s":
            ax.set_yscale("log")
        ax.set_xlabel("shards")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[2].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Opening N shards (shardkit {record['git_commit']}; {BASELINE_SHARDS} shards = empty reference)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_list(text: str, cast: Callable[[str], Any]) -> list[Any]:
    return [cast(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["--writer"]:
        from bench.harness.scale_writer import main as writer_main

        return writer_main(given[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, shorter timeout")
    parser.add_argument("--sizes", type=lambda s: parse_list(s, int), default=None, help="comma-separated shard counts")
    parser.add_argument("--peers", type=lambda s: parse_list(s, str), default=list(PEERS))
    parser.add_argument(
        "--laion-peers", type=lambda s: parse_list(s, str), default=["shardkit", "mosaic"],
        help=f"peers also run at {LAION_SAMPLES_PER_SHARD:,} samples per shard (empty: none)",
    )  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=None, help="per child process (default 300, quick 120)")
    parser.add_argument("--as-limit-gb", type=float, default=12.0, help="RLIMIT_AS of each child, GiB")
    parser.add_argument("--min-free-gb", type=float, default=2.5, help="stop a child below this much available memory")
    parser.add_argument("--report-only", action="store_true", help="rewrite the Markdown and plot from --out's JSON")
    parser.add_argument("--prepare-only", action="store_true", help="make the synthetic datasets, measure nothing")
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "scale"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "scale.json"))
    args = parser.parse_args(argv)
    if args.cell:
        return cell_main(args.cell)
    unknown = sorted(set(args.peers + args.laion_peers) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; choose from {PEERS}")
    args.sizes = sorted(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    args.timeout_s = args.timeout_s or (120.0 if args.quick else 300.0)
    if args.report_only:
        with open(args.out) as f:
            record = json.load(f)
        record["row_sets"] = [tuple(row) for row in record["row_sets"]]
        record["targets"] = {label(p, s): target_check(record, p, s) for p, s in record["row_sets"]}
        save_record(args.out, record, table(record))
        plot(record, plot_path(args.out))
        return 0
    if args.prepare_only:
        for peer, samples in row_sets(args):
            for num_shards in [BASELINE_SHARDS, *args.sizes]:
                print(peer, samples, num_shards, prepare(args.workdir, peer, samples, num_shards, upgrade=False), flush=True)
        return 0
    started = time.time()
    record: dict[str, Any] = {
        "command": " ".join(["bench/bench_scale.py", *(argv if argv is not None else sys.argv[1:])]),
        "git_commit": git_commit(),
        "machine": machine(),
        "versions": versions(),
        "load_before": os.getloadavg()[0],
        "sizes": [BASELINE_SHARDS, *args.sizes],
        "row_sets": row_sets(args),
        "samples_per_shard": SAMPLES_PER_SHARD,
        "laion_samples_per_shard": LAION_SAMPLES_PER_SHARD,
        "payload_bytes": PAYLOAD_BYTES,
        "batch_size": BATCH,
        "memory_workers": MEMORY_WORKERS,
        "first_batch_workers": FIRST_BATCH_WORKERS,
        "timeout_s": args.timeout_s,
        "as_limit_gb": args.as_limit_gb,
        "targets": {},
        "target_limits": TARGETS,
        "cells": [],
    }

    def save() -> None:
        record["seconds"] = time.time() - started
        record["load_after"] = os.getloadavg()[0]
        record["targets"] = {label(p, s): target_check(record, p, s) for p, s in record["row_sets"]}
        save_record(args.out, record, table(record))

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so run_child ends the running cell
    measure(args, record, save)
    save()
    plot(record, plot_path(args.out))
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
