"""Removing samples without rewriting shards (issue #41): what a removal
costs, and what it costs the reader afterwards.

- **find**: ``shardkit.remove_samples`` over a real dataset of 200,000
  samples of ~1 KB (20 shards), removing 1% of them (every 100th key): the
  shards are read once to find the keys (2 workers), as ``shardkit verify``
  reads them; samples scanned per second and the process's peak memory.
- **scale**: a dataset of 5x10^9 samples in 5x10^5 shards (synthetic
  metadata, as ``bench_scale.py`` makes it: one real shard of 10,000 samples
  hard-linked under every name, a shard table saying so). 10^6 samples at
  random places are removed from it by the revision step of
  ``remove_samples`` (the finding step would read 5x10^9 samples; the find
  cell gives its rate): time and peak memory of revising and publishing the
  table, then opening the dataset (``ShardDataset`` + ``len()``, fresh
  process) with and without the removals: time and private memory.
- **read**: the reader's throughput (``ShardDataset``, batches of 64, a
  DataLoader with 2 workers) over the same datasets with and without
  removals, runs interleaved: the 1%-removed real dataset (a whole epoch)
  and the 5x10^9 one (2,000 batches). Shards are in the page cache: what is
  measured is the reader's own cost of skipping removed samples (it reads a
  piece's removed samples with the rest and drops them, so on a disk the
  bytes read grow by the removed fraction at most).

Targets (issue #41): removing 10^6 keys from 5x10^9 samples in bounded
memory; the dataset opens in at most 1 s; throughput within 3%.

Writes ``bench/results/remove.{json,md,png}``; ``--quick`` a small run's
record under ``bench/work``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import bench_main, git_commit, machine, run_cell  # noqa: E402

CELL_ANSWER = "@@bench-remove "
FULL = {"find_samples": 200_000, "shards": 500_000, "removals": 1_000_000, "repeats": 5, "read_batches": 2000}
QUICK = {"find_samples": 20_000, "shards": 5_000, "removals": 10_000, "repeats": 1, "read_batches": 200}
SHARD_SAMPLES = 10_000
PAYLOAD = 1000
BATCH = 64
#: Links to one file (ext4 allows 65,000): the dataset and its clone each hold one.
LINKS_PER_FILE = 30_000


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _uss_mb() -> float:
    from bench.harness.memory import smaps

    return smaps(os.getpid())["uss_mb"]


# ------------------------------------------------------------------ datasets


def write_real(dest: str, samples: int) -> None:
    import shardkit

    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, PAYLOAD, dtype=np.uint8).tobytes()
    with shardkit.ShardWriter(dest, max_samples=SHARD_SAMPLES, max_bytes=None) as writer:
        for i in range(samples):
            writer.write({"__key__": f"k{i:09d}", "bin": blob, "cls": str(i % 10).encode()})


def write_synthetic(dest: str, shards: int, base: str) -> None:
    """``shards`` names, each a hard link of ``base``'s one shard and index,
    and a table that counts them (see the module docstring)."""
    from shardkit.format.manifest import load_manifest
    from shardkit.format.table import build_table
    from shardkit.write.publish import publish_manifest

    one = load_manifest(base)
    entry = one.table.entry(0)
    os.makedirs(dest, exist_ok=True)
    copies: dict[str, list[str]] = {}
    for kind, name in (("tar", entry.path), ("idx", entry.index)):
        copies[kind] = []
        for c in range(-(-shards // LINKS_PER_FILE)):
            copy = os.path.join(dest, f".base-{c}.{kind}")
            shutil.copyfile(os.path.join(base, name), copy)
            copies[kind].append(copy)
    for i in range(shards):
        for kind in ("tar", "idx"):
            os.link(copies[kind][i // LINKS_PER_FILE], os.path.join(dest, f"shard-{i:06d}.{kind}"))
    table = build_table(np.full(shards, entry.num_samples), np.full(shards, entry.num_bytes),
                        np.tile(one.table.sha256[:1], (shards, 1)))  # fmt: skip
    import dataclasses

    publish_manifest(dest, dataclasses.replace(one, shards=table, stored_fingerprint=None))


def _ensure(args: argparse.Namespace, name: str, make: Any) -> str:
    path = os.path.join(args.workdir, name)
    if not os.path.exists(os.path.join(path, "manifest.json")):
        shutil.rmtree(path, ignore_errors=True)
        make(path)
    return path


def _clone(src: str, dest: str) -> None:
    """``src``'s shards and indexes hard-linked into ``dest``, its manifest and table copied."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith((".tar", ".idx")):
            os.link(path, os.path.join(dest, name))
        elif os.path.isfile(path):
            shutil.copyfile(path, os.path.join(dest, name))


# ------------------------------------------------------------------ cells


def find_cell(spec: dict[str, Any]) -> dict[str, Any]:
    import shardkit

    keys = [f"k{i:09d}" for i in range(0, spec["samples"], 100)]
    before = _maxrss_mb()
    started = time.perf_counter()
    report = shardkit.remove_samples(spec["dest"], keys, workers=2)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "samples_per_s": spec["samples"] / seconds, "removed": report.num_removed,
            "peak_rss_mb": _maxrss_mb(), "rss_before_mb": before}  # fmt: skip


def revise_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Remove ``removals`` random places from the synthetic dataset: the
    revision and publishing of :func:`shardkit.revise.remove.remove_samples`."""
    from shardkit.format.manifest import load_manifest
    from shardkit.format.removed import pack
    from shardkit.io.base import SourceOptions
    from shardkit.write.publish import publish_manifest
    from shardkit.revise.remove import _revise

    manifest = load_manifest(spec["dest"])
    rng = np.random.default_rng(1)
    flat = rng.choice(manifest.num_samples, size=spec["removals"], replace=False)
    places = pack(flat // SHARD_SAMPLES, flat % SHARD_SAMPLES)
    base = _uss_mb()
    started = time.perf_counter()
    revised = _revise(manifest, np.zeros(0, dtype=np.uint64), places, SourceOptions())
    publish_manifest(spec["dest"], revised)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "removed": revised.num_removed, "samples": revised.num_samples,
            "uss_growth_mb": _uss_mb() - base, "peak_rss_mb": _maxrss_mb(),
            "table_mb": len(revised.table.encode()) / 1e6}  # fmt: skip


def open_cell(spec: dict[str, Any]) -> dict[str, Any]:
    import shardkit  # noqa: F401 - imported before the clock starts
    from shardkit import ShardDataset

    base = _uss_mb()
    started = time.perf_counter()
    ds = ShardDataset(spec["dest"], seed=0)
    length = len(ds)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "len": length, "uss_growth_mb": _uss_mb() - base}


def _count(batch: list[Any]) -> int:
    return len(batch)


def read_cell(spec: dict[str, Any]) -> dict[str, Any]:
    from shardkit import ShardDataset, make_loader

    ds = ShardDataset(spec["dest"], seed=spec.get("seed", 0), batch_size=BATCH, collate=_count)
    loader = make_loader(ds, batch_size=None, num_workers=2)
    samples = batches = 0
    started = time.perf_counter()
    for count in loader:
        samples += int(count)
        batches += 1
        if spec.get("max_batches") and batches >= spec["max_batches"]:
            break
    seconds = time.perf_counter() - started
    return {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds}


CELLS = {"find": find_cell, "revise": revise_cell, "open": open_cell, "read": read_cell}


# ------------------------------------------------------------------ the run


def _cell(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    done = run_cell(__file__, spec, answer=CELL_ANSWER, python=sys.executable, timeout_s=args.timeout_s)
    print(json.dumps({**spec, **done}), flush=True)
    return done


def measure(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {"commit": git_commit(), "machine": machine(), "preset": preset}
    real = _ensure(args, f"real-{preset['find_samples']}", lambda p: write_real(p, preset["find_samples"]))
    real_removed = os.path.join(args.workdir, "real-removed")
    _clone(real, real_removed)
    record["find"] = _cell(args, {"cell": "find", "dest": real_removed, "samples": preset["find_samples"]})
    base = _ensure(args, "base", lambda p: write_real(p, SHARD_SAMPLES))
    synthetic = _ensure(args, f"synthetic-{preset['shards']}", lambda p: write_synthetic(p, preset["shards"], base))
    synthetic_removed = os.path.join(args.workdir, "synthetic-removed")
    _clone(synthetic, synthetic_removed)
    record["revise"] = _cell(args, {"cell": "revise", "dest": synthetic_removed, "removals": preset["removals"]})
    record["open"] = {name: [_cell(args, {"cell": "open", "dest": path}) for _ in range(preset["repeats"])]
                      for name, path in (("plain", synthetic), ("removed", synthetic_removed))}  # fmt: skip
    record["read"] = {}
    big = f"{preset['shards'] * SHARD_SAMPLES:,} samples, {preset['removals']:,} removed"
    for label, plain, removed, limit in (("real, 1% removed", real, real_removed, None),
                                         (big, synthetic, synthetic_removed, preset["read_batches"])):  # fmt: skip
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], "removed": []}
        for repeat in range(preset["repeats"]):
            for name, path in (("plain", plain), ("removed", removed)):
                runs[name].append(_cell(args, {"cell": "read", "dest": path, "seed": repeat, "max_batches": limit}))
        record["read"][label] = runs
    record["targets"] = targets(record)
    return record


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    opened = _median(record["open"]["removed"], "seconds")
    if opened is not None:
        p = record["preset"]
        what = f"{p['shards'] * SHARD_SAMPLES:,} samples with {p['removals']:,} removed"
        out.append({"target": f"open {what}", "value": opened, "unit": " s", "limit": 1.0,
                    "met": opened <= 1.0})  # fmt: skip
    revise = record["revise"]
    if "peak_rss_mb" in revise:
        p = record["preset"]
        what = f"removing {p['removals']:,} of {p['shards'] * SHARD_SAMPLES:,}"
        out.append({"target": f"{what}: peak memory of the process", "value": revise["peak_rss_mb"],
                    "unit": " MB", "limit": 1000, "met": revise["peak_rss_mb"] <= 1000})  # fmt: skip
    for label, runs in record["read"].items():
        plain, removed = _median(runs["plain"], "samples_per_s"), _median(runs["removed"], "samples_per_s")
        if plain and removed:
            ratio = removed / plain
            out.append({"target": f"throughput with removals / without ({label})", "value": ratio, "unit": "x",
                        "limit": 0.97, "met": ratio >= 0.97})  # fmt: skip
    return out


def markdown(record: dict[str, Any]) -> str:
    p = record["preset"]
    find, revise = record["find"], record["revise"]
    lines = ["# Removing samples without rewriting shards", "",
             f"At commit {record['commit']}, {record['machine']['cpus']} CPUs. " + __doc__.split("\n\n")[1].replace("\n", " "),
             "", "## Finding the keys", "",
             f"{p['find_samples']:,} samples, 1% removed: " + (
                 f"{find['seconds']:.1f} s, {find['samples_per_s']:,.0f} samples scanned/s with 2 workers; peak "
                 f"memory {find['peak_rss_mb']:.0f} MB." if "seconds" in find else f"error: {find.get('error')}"),
             "", f"## {p['shards']:,} shards of {SHARD_SAMPLES:,} samples, {p['removals']:,} removed", ""]  # fmt: skip
    if "seconds" in revise:
        lines.append(f"Revising and publishing the table: {revise['seconds']:.2f} s, peak memory "
                     f"{revise['peak_rss_mb']:.0f} MB (+{revise['uss_growth_mb']:.0f} MB private), table "
                     f"{revise['table_mb']:.1f} MB.")  # fmt: skip
    else:
        lines.append(f"Revising: error: {revise.get('error')}")
    lines += ["", "| dataset | open s (median) | private memory after opening, MB |", "| --- | ---: | ---: |"]
    for name, runs in record["open"].items():
        lines.append(f"| {name} | {_median(runs, 'seconds') or float('nan'):.2f} | "
                     f"{_median(runs, 'uss_growth_mb') or float('nan'):.1f} |")  # fmt: skip
    lines += ["", "## Reader throughput (batches of 64, 2 workers, page cache)", "",
              "| dataset | without removals, samples/s | with | ratio |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for label, runs in record["read"].items():
        plain, removed = _median(runs["plain"], "samples_per_s"), _median(runs["removed"], "samples_per_s")
        ratio = f"{removed / plain:.3f}" if plain and removed else "–"
        lines.append(f"| {label} | {plain or 0:,.0f} | {removed or 0:,.0f} | {ratio} |")
    lines += ["", "## Targets (issue #41 part 3)", "", "| target | value | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in record["targets"]:
        lines.append(f"| {t['target']} | {t['value']:.3f}{t['unit']} | {t['limit']}{t['unit']} | "
                     f"{'yes' if t['met'] else 'no'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(record["read"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for k, name in enumerate(("plain", "removed")):
        values = [(_median(record["read"][label][name], "samples_per_s") or 0) / 1e3 for label in labels]
        ax.bar([i + k * 0.4 for i in range(len(labels))], values, 0.4, label="without removals" if k == 0 else "with")
    ax.set_xticks([i + 0.2 for i in range(len(labels))])
    ax.set_xticklabels(labels)
    ax.set_ylabel("thousand samples / s")
    ax.set_title("Reader throughput with and without removed samples")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return bench_main(argv, __doc__, "remove", answer=CELL_ANSWER, cells=CELLS, measure=measure, presets=(FULL, QUICK),
                      markdown=markdown, plot=plot)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
