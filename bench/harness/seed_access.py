"""The seed's random-access scenario (issue #45): a read-only SQLite file
opened after the fork (field note 5 of BACKGROUND.md), webdataset's wids and
shardkit.IndexedDataset, each read through a DataLoader with a seeded
``RandomSampler`` over tiny samples (a key, a caption, a label).

Data, built once under a root folder and reused:

* the shards: one real shard of :data:`SAMPLES_PER_SHARD` samples written by
  shardkit's writer (with its ``.idx``), hard-linked under N names (see
  :class:`bench.harness.scale_data.Linker`), and a manifest listing the N;
  samples repeat from shard to shard, which timing does not mind;
* wids's shard index (``wids-shard-index-v1`` JSON: ``url`` and ``nsamples``
  of the same N shards);
* the SQLite file, the seed's design: ``samples(id INTEGER PRIMARY KEY, key,
  caption, label)`` holding the same samples in the same order, one row per
  sample, written with ``executemany`` in one transaction under
  ``journal_mode=OFF, synchronous=OFF``.

Each cell (tool, size, workers) runs in a fresh interpreter
(``python -m bench.harness.seed_access SPEC``): the time from ``iter()``
to the last batch (worker start included, dataset construction not), and the
private memory (USS) of each worker once half the batches are in; with no
workers, the growth of the main process's written private memory
(Private_Dirty) from before the dataset was made.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.harness.memory import ReadOnlySqlite, smaps

SAMPLES_PER_SHARD = 10_000
TOOLS = ("sqlite", "wids", "shardkit", "shardkit-open")
#: The two ways shardkit runs: as opened (each worker opens a shard on its
#: first read of it), and with ``open_shards()`` called before the loader
#: (the main process opens every shard once; forked workers inherit them),
#: that call timed with the reads.
SHARDKIT_TOOLS = ("shardkit", "shardkit-open")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WORDS = ("a", "dog", "cat", "runs", "on", "the", "red", "beach", "under", "blue", "sky", "with", "two", "small",
          "birds", "near", "an", "old", "wooden", "boat")


def base_samples() -> list[tuple[str, str, int]]:
    """The :data:`SAMPLES_PER_SHARD` samples of the one real shard:
    ``(key, caption, label)``, captions of 4 to 16 words."""
    rng = random.Random(0)
    return [
        (f"s{j:07d}", " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))), j % 1000)
        for j in range(SAMPLES_PER_SHARD)
    ]


def _write_base(folder: str) -> None:
    from shardkit import ShardWriter

    with ShardWriter(folder, max_samples=SAMPLES_PER_SHARD, max_bytes=None, overwrite=True) as writer:
        for key, caption, label in base_samples():
            writer.write({"__key__": key, "txt": caption, "cls": label})


def _link_shards(base: str, folder: str, num_shards: int) -> None:
    from bench.harness.scale_data import Linker
    from shardkit.format.manifest import Manifest, ShardEntry, load_manifest
    from shardkit.write.publish import publish_manifest

    (entry,) = load_manifest(base).shards
    copies = os.path.join(base, "copies")
    tars, idxs = Linker(os.path.join(base, entry.path), copies), Linker(os.path.join(base, entry.index), copies)
    names = [f"shard-{s:06d}" for s in range(num_shards)]
    for name in names:
        tars.link(os.path.join(folder, name + ".tar"))
        idxs.link(os.path.join(folder, name + ".idx"))
    entries = tuple(
        ShardEntry(path=n + ".tar", index=n + ".idx", num_samples=entry.num_samples, num_bytes=entry.num_bytes,
                   sha256=entry.sha256)
        for n in names
    )
    publish_manifest(folder, Manifest(shards=entries, extensions=("cls", "txt"), source={"format": "synthetic"}))


def _write_wids_index(folder: str, num_shards: int, path: str) -> None:
    shards = [
        {"url": os.path.join(folder, f"shard-{s:06d}.tar"), "nsamples": SAMPLES_PER_SHARD} for s in range(num_shards)
    ]
    with open(path + ".tmp", "w") as f:
        json.dump({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shards}, f)
    os.rename(path + ".tmp", path)


def _write_sqlite(path: str, num_samples: int) -> None:
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    keys, captions, labels = zip(*base_samples())
    con = sqlite3.connect(tmp)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute("CREATE TABLE samples (id INTEGER PRIMARY KEY, key TEXT NOT NULL, caption TEXT NOT NULL, "
                "label INTEGER NOT NULL)")
    # Row i holds sample i % SAMPLES_PER_SHARD, as shard i // SAMPLES_PER_SHARD does.
    rows = zip(range(num_samples), itertools.cycle(keys), itertools.cycle(captions), itertools.cycle(labels))
    with con:
        con.executemany("INSERT INTO samples VALUES (?, ?, ?, ?)", rows)
    con.close()
    os.rename(tmp, path)


def ensure_seed_data(root: str, num_samples: int) -> dict[str, Any]:
    """Build (or reuse) the shards, wids index and SQLite file of
    ``num_samples`` samples under ``root``; returns their paths and the
    seconds each part took to build (None: built before build times were
    kept) and the SQLite size."""
    if num_samples <= 0 or num_samples % SAMPLES_PER_SHARD:
        raise ValueError(f"num_samples must be a positive multiple of {SAMPLES_PER_SHARD}, not {num_samples}")
    num_shards = num_samples // SAMPLES_PER_SHARD
    root = os.path.abspath(root)
    base = os.path.join(root, "base")
    folder = os.path.join(root, f"shards-{num_samples}")
    paths = {
        "shards": folder,
        "wids": os.path.join(root, f"wids-{num_samples}.json"),
        "sqlite": os.path.join(root, f"samples-{num_samples}.sqlite"),
    }
    # Build times are kept beside the data, so a run that reuses it still reports them.
    log = os.path.join(root, f"build-{num_samples}.json")
    build_s: dict[str, Any] = {}
    if os.path.exists(log):
        with open(log) as f:
            build_s = json.load(f)
    for part, done, make in (
        ("base", os.path.join(base, "manifest.json"), lambda: _write_base(base)),
        ("shards", os.path.join(folder, "manifest.json"), lambda: _link_shards(base, folder, num_shards)),
        ("wids", paths["wids"], lambda: _write_wids_index(folder, num_shards, paths["wids"])),
        ("sqlite", paths["sqlite"], lambda: _write_sqlite(paths["sqlite"], num_samples)),
    ):
        if not os.path.exists(done):
            started = time.perf_counter()
            os.makedirs(folder, exist_ok=True)
            make()
            build_s[part] = round(time.perf_counter() - started, 2)
            with open(log, "w") as f:
                json.dump(build_s, f)
        build_s.setdefault(part, None)
    return {**paths, "num_shards": num_shards, "build_s": build_s, "sqlite_mb": os.path.getsize(paths["sqlite"]) / 1e6}


# ------------------------------------------------------------------ the datasets


class SqliteSamples(ReadOnlySqlite):
    """The seed's map-style dataset: ``__getitem__(i)`` looks row ``i`` up
    on a read-only connection opened lazily in each process (after the fork)."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        key, caption, label = self.fetch("SELECT key, caption, label FROM samples WHERE id = ?", index)
        return {"__key__": key, "txt": caption, "cls": label}


def keep_list(batch: list[Any]) -> list[Any]:
    """Collate for every tool: the samples as they are."""
    return batch


def import_tool(tool: str) -> None:
    """Import what ``tool`` reads with, before the memory baseline: the
    library's code is the same whatever the dataset, and SQLite's module is
    imported with this harness."""
    if tool == "wids":
        import wids  # noqa: F401
    elif tool in SHARDKIT_TOOLS:
        from shardkit import IndexedDataset  # noqa: F401 - shardkit imports its parts as they are named


def open_tool(tool: str, paths: dict[str, Any], num_samples: int) -> Any:
    if tool == "sqlite":
        return SqliteSamples(paths["sqlite"], num_samples)
    if tool == "wids":
        import wids

        return wids.ShardListDataset(paths["wids"], localname=lambda url: url, transformations=[])
    if tool in SHARDKIT_TOOLS:
        import shardkit

        return shardkit.IndexedDataset(paths["shards"])
    raise ValueError(f"unknown tool {tool!r}")


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """One cell in this process: ``spec`` holds tool, paths, num_samples,
    workers, reads, batch_size, seed and budget_s (a run past it stops at
    the next batch and its time is extrapolated from the reads done)."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from bench.bench_scale import worker_pids

    workers = spec["workers"]
    load = os.getloadavg()[0]
    import_tool(spec["tool"])
    before = smaps(os.getpid())["private_dirty_mb"]
    dataset = open_tool(spec["tool"], spec["paths"], spec["num_samples"])
    assert len(dataset) == spec["num_samples"], (len(dataset), spec["num_samples"])
    sampler = RandomSampler(
        dataset, num_samples=spec["reads"], generator=torch.Generator().manual_seed(spec["seed"])
    )
    loader = DataLoader(dataset, sampler=sampler, batch_size=spec["batch_size"], num_workers=workers,
                        collate_fn=keep_list)
    batches = -(-spec["reads"] // spec["batch_size"])
    start = time.perf_counter()
    if spec["tool"] == "shardkit-open":
        dataset.open_shards()
    memory: list[float] = []
    dirty: list[float] = []
    reads = 0
    paused = 0.0
    first = 0.0
    for number, batch in enumerate(loader, 1):
        reads += len(batch)
        if number == 1:
            first = time.perf_counter() - start
        stop = time.perf_counter() - start - paused > spec["budget_s"] and number < batches
        if not memory and (number >= batches // 2 or stop):
            # Measured with the workers warm; the time it takes is not the tool's.
            began = time.perf_counter()
            if workers:
                snaps = [smaps(pid) for pid in worker_pids()]
                memory, dirty = [m["uss_mb"] for m in snaps], [m["private_dirty_mb"] for m in snaps]
            else:
                memory = dirty = [smaps(os.getpid())["private_dirty_mb"] - before]
            paused += time.perf_counter() - began
        if stop:
            break
    seconds = time.perf_counter() - start - paused
    del loader
    result = {
        **{k: spec[k] for k in ("tool", "num_samples", "workers", "reads", "batch_size", "seed")},
        "reads_done": reads,
        "seconds": seconds if reads == spec["reads"] else seconds * spec["reads"] / reads,
        "extrapolated": reads < spec["reads"],
        "first_batch_s": first,
        "per_read_us": seconds / reads * 1e6,
        "uss_mb": statistics.fmean(memory) if memory else None,
        "uss_mb_max": max(memory) if memory else None,
        "dirty_mb": statistics.fmean(dirty) if dirty else None,
        "num_measured": len(memory),
        "load_before": round(load, 2),
    }
    return result


def measure_cell(spec: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """:func:`run_cell` in a fresh interpreter."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.harness.seed_access", json.dumps(spec)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        return {**spec, "error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def warm_page_cache(paths: dict[str, Any]) -> None:
    """Read the SQLite file and the one real shard once, so every tool starts warm."""
    for path in (paths["sqlite"], os.path.join(paths["shards"], "shard-000000.tar")):
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def sampler_seconds(num_samples: int, reads: int, seed: int = 0) -> float:
    """The time the ``RandomSampler`` alone takes to give ``reads`` indices
    of ``num_samples`` (it draws a permutation of all ``num_samples``): a
    part of every tool's time at that size."""
    import torch
    from torch.utils.data import RandomSampler

    start = time.perf_counter()
    sampler = RandomSampler(range(num_samples), num_samples=reads, generator=torch.Generator().manual_seed(seed))
    count = sum(1 for _ in sampler)
    assert count == reads
    return time.perf_counter() - start


def measure(
    root: str,
    sizes: list[int],
    workers: list[int],
    *,
    reads: int,
    batch_size: int,
    budget_s: float,
    repeats: int,
    repeat_cells: list[tuple[int, int]],
    tools: tuple[str, ...] = TOOLS,
    progress: Any = None,
) -> dict[str, Any]:
    """Every tool at every size and worker count, each cell once, and
    ``repeats`` times (the median kept) at the (size, workers) of
    ``repeat_cells``; tools side by side, their order rotated per cell."""
    data: dict[str, Any] = {}
    cells: list[dict[str, Any]] = []
    for size in sizes:
        paths = ensure_seed_data(root, size)
        data[str(size)] = {**paths, "sampler_s": round(sampler_seconds(size, reads), 3)}
        warm_page_cache(paths)
        for w in workers:
            runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
            for repeat in range(repeats if (size, w) in repeat_cells else 1):
                shift = (len(cells) + repeat) % len(tools)
                for tool in tools[shift:] + tools[:shift]:
                    spec = {"tool": tool, "paths": paths, "num_samples": size, "workers": w, "reads": reads,
                            "batch_size": batch_size, "seed": repeat, "budget_s": budget_s}
                    result = measure_cell(spec, timeout_s=budget_s + 600)
                    runs[tool].append(result)
                    if progress is not None:
                        progress(result)
            for tool in tools:
                cells.append(_median_cell(runs[tool]))
    return {"data": data, "cells": cells}


def _median_cell(results: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in results if "error" not in r]
    if not good:
        return results[0]
    cell = min(good, key=lambda r: abs(r["seconds"] - statistics.median(g["seconds"] for g in good)))
    return {**cell, "seconds_runs": [round(r["seconds"], 3) for r in good]}


# ------------------------------------------------------------------ report


def print_cell(cell: dict[str, Any]) -> None:
    """One line per measured cell, as the run goes."""
    said = cell.get("error", "").strip().splitlines()[-1:] or [
        f"{cell['seconds']:8.2f} s{' (extrapolated)' if cell['extrapolated'] else ''}  "
        f"USS {cell['uss_mb'] or 0:6.1f} MB  first batch {cell['first_batch_s']:.2f} s  load {cell['load_before']:.1f}"
    ]
    print(f"  {cell['tool']:8s} {cell['num_samples']:>10,} samples {cell['workers']:2d} workers  {said[0]}", flush=True)


def find(cells: list[dict[str, Any]], tool: str, size: int, workers: int) -> dict[str, Any] | None:
    return next((c for c in cells if c["tool"] == tool and c["num_samples"] == size and c["workers"] == workers
                 and "error" not in c), None)


def targets(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue #45 part 2's targets, shardkit against the seed's SQLite: time
    at 5x10^6 no more than SQLite's (1.5x at 5x10^7), worker USS no more
    than 1.2x, with the most workers measured and with none."""
    rows = []
    most = max((c["workers"] for c in cells), default=0)
    for tool in SHARDKIT_TOOLS:
        how = "" if tool == "shardkit" else ", open_shards()"
        for workers in sorted({0, most}):
            for size, limit in ((5_000_000, 1.0), (50_000_000, 1.5)):
                sk, sq = find(cells, tool, size, workers), find(cells, "sqlite", size, workers)
                if sk is None or sq is None:
                    continue
                time_ratio = sk["seconds"] / sq["seconds"]
                rows.append({"what": f"time, {size:.0e} samples, {workers} workers{how}",
                             "ratio": round(time_ratio, 2), "limit": limit, "met": time_ratio <= limit})
                if sk["uss_mb"] is not None and sq["uss_mb"] is not None and sq["uss_mb"] > 0:
                    uss_ratio = sk["uss_mb"] / sq["uss_mb"]
                    rows.append({"what": f"private memory, {size:.0e} samples, {workers} workers{how}",
                                 "ratio": round(uss_ratio, 2), "limit": 1.2, "met": uss_ratio <= 1.2})
    return rows


#: What the memory column holds with no workers (records before it was Private_Dirty have no key).
SINGLE_PROCESS_MEMORY = {
    "uss_growth": "the growth of the process's USS from before the dataset was made; it can go negative under "
    "memory pressure, the kernel dropping clean pages of torch's libraries",
    "private_dirty_growth": "the growth of the process's written private memory, Private_Dirty, from before the "
    "dataset was made (shardkit's and wids's imports counted in it, SQLite's not)",
    "private_dirty_after_import": "the growth of the process's written private memory, Private_Dirty, from before "
    "the dataset was made, each tool's module imported before",
}


def _dirty(cell: dict[str, Any] | None) -> str:
    return "–" if cell is None or cell.get("dirty_mb") is None else f"{cell['dirty_mb']:.1f}"


def _time(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    text = f"{cell['seconds']:.2f}"
    if len(cell.get("seconds_runs", [])) > 1:
        text += f" [{min(cell['seconds_runs']):.2f}-{max(cell['seconds_runs']):.2f}]"
    return f"≈{text}*" if cell["extrapolated"] else text


def markdown(record: dict[str, Any]) -> str:
    cfg, cells = record["config"], record["cells"]
    lines = [
        "# Random access, the seed's scenario: SQLite vs wids vs shardkit.IndexedDataset",
        "",
        f"At commit {record['commit']}, {record['machine']['cpus']} CPUs, load average "
        f"{record.get('load_before', ['?'])[0]} before. A DataLoader with a `RandomSampler` of "
        f"{cfg['reads']:,} samples (seeded), batches of {cfg['batch_size']}, one collate for all (keeps the list), "
        "over tiny samples (a key, a caption of 4-16 words, a label). Time from `iter()` to the last batch, worker "
        "start included; private memory (USS) per worker once half the batches are in (with no workers: "
        + SINGLE_PROCESS_MEMORY[cfg.get("single_process_memory", "uss_growth")]
        + "). Per read: time / samples with no workers. "
        "Private_Dirty: the written part of USS (a worker's USS also counts clean pages of a shard file it "
        "alone maps, which the page cache holds for every process; records before this column have none). "
        "Load: the highest 1-minute load average at the start of the row's runs (2 cores: above 2, other work "
        "shared the machine; being an average over a minute, it also counts the previous cell's workers).",
        "",
        f"Shards: {SAMPLES_PER_SHARD:,} samples each, one real shard hard-linked under every name (samples repeat "
        "from shard to shard: one shard's pages in the page cache, where SQLite's file is as large as its rows). "
        "SQLite: one row per sample, the seed's read-only connection opened in each worker. wids: "
        "`ShardListDataset` with its default LRU of 10 open shards, raw fields; each miss maps the shard and "
        f"scans its {3 * SAMPLES_PER_SHARD:,} headers in Python. * = the run passed the {cfg['budget_s']:g} s "
        "budget and stopped: its time is extrapolated from the reads done. A range in brackets: the "
        f"median of {cfg['repeats']} runs, and their range.",
        "",
        "shardkit: `IndexedDataset` as opened; shardkit-open: `open_shards()` called before the loader, in "
        "the timed part (the main process opens and checks every shard once; forked workers inherit them).",
        "",
        "| samples | shards | workers | SQLite s | wids s | shardkit s | shardkit-open s | shardkit / SQLite "
        "| shardkit-open / SQLite | SQLite USS MB | wids USS MB | shardkit USS MB | shardkit-open USS MB "
        "| shardkit / SQLite USS | Private_Dirty MB (SQLite / shardkit / shardkit-open) "
        "| per read µs (SQLite / wids / shardkit / shardkit-open) | load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- "
        "| ---: |",
    ]
    for size in cfg["sizes"]:
        for workers in cfg["workers"]:
            found = [find(cells, t, size, workers) for t in TOOLS]
            sq, sk, so = found[0], found[2], found[3]
            ratios = [f"{c['seconds'] / sq['seconds']:.2f}x" if c and sq else "–" for c in (sk, so)]
            uss = [f"{c['uss_mb']:.1f}" if c and c["uss_mb"] is not None else "–" for c in found]
            uss_ratio = f"{sk['uss_mb'] / sq['uss_mb']:.2f}x" if sk and sq and sk["uss_mb"] and sq["uss_mb"] else "–"
            per_read = " / ".join(f"{c['per_read_us']:.0f}" if c else "–" for c in found) if workers == 0 else ""
            load = max((c.get("load_before", 0) for c in found if c), default=0)
            lines.append(
                f"| {size:,} | {size // SAMPLES_PER_SHARD:,} | {workers} | {' | '.join(_time(c) for c in found)} "
                f"| {' | '.join(ratios)} | {' | '.join(uss)} | {uss_ratio} "
                f"| {' / '.join(_dirty(c) for c in (sq, sk, so))} | {per_read} | {load:.1f} |"
            )
    left_out = [t for t in TOOLS if t not in cfg.get("tools", TOOLS)]
    if left_out:
        lines += ["", f"Not run in this record: {', '.join(left_out)} (`--tools`); see an earlier record."]
    lines += ["", "## Targets (issue #45 part 2)", "", "| target | shardkit / SQLite | limit | met |",
              "| --- | ---: | ---: | --- |"]
    lines += [f"| {t['what']} | {t['ratio']:.2f}x | {t['limit']:g}x | {'yes' if t['met'] else 'no'} |"
              for t in record["targets"]]
    lines += ["", "## Data built, and the sampler's own time", "",
              "| samples | SQLite MB | SQLite build s | shards link + manifest s | RandomSampler alone s |",
              "| ---: | ---: | ---: | ---: | ---: |"]
    for size, paths in record["data"].items():
        built = ["–" if paths["build_s"][p] is None else f"{paths['build_s'][p]:.1f}" for p in ("sqlite", "shards")]
        sampler = f"{paths['sampler_s']:.2f}" if "sampler_s" in paths else "–"
        lines.append(f"| {int(size):,} | {paths['sqlite_mb']:.0f} | {built[0]} | {built[1]} | {sampler} |")
    lines += ["", "Built once and reused by later runs (the times are those of the build); single process, "
              "`executemany` in one transaction, `journal_mode=OFF, synchronous=OFF`. The sampler draws a "
              "permutation of every sample before its first index (`torch.randperm`), in the main process: "
              "that time is in every tool's time at the size."]
    errors = [c for c in cells if "error" in c]
    if errors:
        lines += ["", "Failed cells: " + "; ".join(f"{c['tool']} {c['num_samples']} x {c['workers']}" for c in errors)]
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cfg, cells = record["config"], record["cells"]
    groups = [(s, w) for s in cfg["sizes"] for w in cfg["workers"]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(TOOLS)
    for t, tool in enumerate(TOOLS):
        found = [find(cells, tool, s, w) for s, w in groups]
        x = np.arange(len(groups)) + t * width
        axes[0].bar(x, [c["seconds"] if c else 0 for c in found], width, label=tool)
        axes[1].bar(x, [c["uss_mb"] or 0 if c else 0 for c in found], width, label=tool)
    labels = [f"{s:.0e}\n{w} w" for s, w in groups]
    for ax, title in ((axes[0], f"seconds for {cfg['reads']:,} random reads (log; wids extrapolated)"),
                      (axes[1], "private memory per worker, MB")):
        ax.set_xticks(np.arange(len(groups)) + width, labels, fontsize=7)
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one cell of the seed scenario (used by measure_cell())")
    parser.add_argument("spec", help="JSON: tool, paths, num_samples, workers, reads, batch_size, seed, budget_s")
    parser.add_argument("--report", action="store_true", help="SPEC is a record's JSON file: write its table "
                        "and plot again (targets recomputed)")
    args = parser.parse_args(argv)
    if args.report:
        from bench.common import markdown_path, plot_path

        with open(args.spec) as f:
            record = json.load(f)
        record["targets"] = targets(record["cells"])
        with open(args.spec, "w") as f:
            json.dump(record, f, indent=1)
        with open(markdown_path(args.spec), "w") as f:
            f.write(markdown(record))
        plot(record, plot_path(args.spec))
        return 0
    print(json.dumps(run_cell(json.loads(args.spec))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
