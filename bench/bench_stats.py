#!/usr/bin/env python3
"""What loader statistics cost (issue #56): ``make_loader(..., stats=True)``
against off, on the same shards, in the same run.

Two datasets, where per-sample overhead shows most and where it shows
least: captions (a ~100-byte ``txt`` and a ``cls`` per sample) and
20 KB binary samples. Each is read one epoch at a time through
``make_loader`` (2 workers, batches of 64 as lists, page cache hot), off
and on alternating, ``--repeats`` times; medians of samples/s.

Writes ``bench/results/stats.json`` / ``.md`` / ``.png``::

    .venv/bin/python bench/bench_stats.py            # ~1 minute
    .venv/bin/python bench/bench_stats.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import shardkit  # noqa: E402
from bench.common import git_commit, machine, plot_path, save_record  # noqa: E402

RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "stats.json")
DATASETS = {
    "captions": lambda i: {"__key__": f"c{i:08d}", "txt": f"a photo of item {i} " * 5, "cls": str(i % 1000)},
    "20 KB samples": lambda i: {"__key__": f"b{i:08d}", "bin": bytes([i % 251]) * 20_000},
}


def epoch(path: str, stats: bool) -> float:
    loader = shardkit.make_loader(shardkit.ShardDataset(path, seed=0), batch_size=64, num_workers=2,
                                  collate_fn=list, stats=stats)  # fmt: skip
    next(iter(loader))  # workers started: the epoch below is timed whole
    started = time.perf_counter()
    n = sum(len(batch) for batch in loader)
    return n / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples, 3 repeats")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--workdir", default=os.path.join("bench", "work", "stats"))
    args = parser.parse_args(argv)
    count = 20_000 if args.quick else 100_000
    repeats = args.repeats or (3 if args.quick else 5)
    rows: dict[str, Any] = {}
    for name, make in DATASETS.items():
        size = count if name == "captions" else count // 10
        path = os.path.join(args.workdir, f"{name.replace(' ', '-')}-{size}")
        if not os.path.exists(os.path.join(path, "manifest.json")):
            shardkit.write_dataset([make(i) for i in range(size)], path, options=shardkit.WriteOptions(max_samples=size // 8))
        runs: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(repeats):
            for mode in ("off", "on"):
                runs[mode].append(epoch(path, mode == "on"))
        off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
        rows[name] = {"samples": size, "off": runs["off"], "on": runs["on"], "ratio": on / off}
        print(f"{name}: off {off:,.0f} samples/s, on {on:,.0f} ({on / off:.2f}x)", flush=True)
    record = {"commit": git_commit(), "machine": machine(), "repeats": repeats, "rows": rows}
    lines = ["# Loader statistics: on against off", "",
             f"At commit {record['commit']}, {machine()['cpus']} CPUs; 2 workers, batches of 64, page cache hot, "
             f"medians of {repeats} epochs each, alternating.", "",
             "| dataset | samples | off samples/s | on samples/s | on / off |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, row in rows.items():
        off, on = statistics.median(row["off"]), statistics.median(row["on"])
        spread = (max(row["off"]) - min(row["off"])) / off
        lines.append(f"| {name} | {row['samples']:,} | {off:,.0f} | {on:,.0f} | {row['ratio']:.2f}x (off's own spread {spread:.0%}) |")
    out = os.path.join(args.workdir, "stats-quick.json") if args.quick else RESULT
    save_record(out, record, "\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(rows)
    for j, mode in enumerate(("off", "on")):
        ax.bar([i + 0.4 * j for i in range(len(names))], [statistics.median(rows[n][mode]) for n in names], 0.4,
               label=f"stats {mode}")  # fmt: skip
    ax.set_xticks([i + 0.2 for i in range(len(names))])
    ax.set_xticklabels(names)
    ax.set_ylabel("samples / s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_path(out), dpi=100)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
