"""Changing a dataset without copies (issue #54): what a revision costs.

- **append**: the same new data (10 shards of 10,000 samples of ~1 KB,
  from a JSONL; 2 shards with ``--quick``) appended with ``shardkit.append`` to datasets
  of 5x10^3 and 5x10^5 shards (5x10^7 and 5x10^9 samples; synthetic
  metadata, as ``bench_remove.py`` makes it: one real shard hard-linked
  under every name, a table saying so), named as the writer names shards
  and with irregular names (a table of stored paths, as ``shardkit index``
  makes for another tool's shards). Each append runs on a fresh clone (the
  shards hard-linked, manifest and table copied) in a fresh process: the
  whole append's time and peak memory, and the publish step's own time (the
  table built from the old columns and written, the manifest replaced). The
  claim: an append costs what its new data costs, not what the dataset
  holds; the ratio of the large dataset's time to the small one's says
  how far that holds.

Then extensions and views (``bench/revisions_derived.py`` says what each
cell measures): extend against a rewrite, reading a joined dataset and its
new field alone, a 50% view against a rewritten copy, and opening a 2%
split of 5x10^9 samples.

Writes ``bench/results/revisions.{json,md,png}``; ``--quick`` a small run's
record under ``bench/work``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_remove import (  # noqa: E402
    SHARD_SAMPLES, _clone, _ensure, _maxrss_mb, _median, write_real, write_synthetic,
)
from bench.common import bench_main, git_commit, machine, run_cell  # noqa: E402
from bench import revisions_derived as derived  # noqa: E402

CELL_ANSWER = "@@bench-revisions "
FULL = {"sizes": [5_000, 500_000], "new_shards": 10, "repeats": 3, "derived": derived.FULL}
QUICK = {"sizes": [500, 5_000], "new_shards": 2, "repeats": 1, "derived": derived.QUICK}


def irregular(dest: str, shards: int, base: str) -> None:
    """A synthetic dataset whose table stores a path per shard, not a
    naming pattern: the names another tool's shards have. (Its own links:
    a file of ext4 takes 65,000, and every run adds a clone's.)"""
    from shardkit.format.manifest import load_manifest
    from shardkit.format.table import build_table
    from shardkit.write.publish import publish_manifest

    write_synthetic(dest, shards, base)
    manifest = load_manifest(dest)
    table = manifest.table
    n = table.num_shards
    paths = np.array([table.path(i).encode() for i in range(n)])
    index_paths = np.array([table.index_path(i).encode() for i in range(n)])
    stored = build_table(table.counts, table.num_bytes, table.sha256, paths=paths, index_paths=index_paths,
                         naming=None)  # fmt: skip
    publish_manifest(dest, dataclasses.replace(manifest, shards=stored, stored_fingerprint=None))
    assert load_manifest(dest).table.naming is None


# ------------------------------------------------------------------ cells


def append_cell(spec: dict[str, Any]) -> dict[str, Any]:
    import shardkit.revise.append as append
    from shardkit.revise import publish as revise_publish
    from shardkit.write.options import WriteOptions

    published: list[float] = []
    real_publish = revise_publish.publish_revision

    def timed_publish(*args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        real_publish(*args, **kwargs)
        published.append(time.perf_counter() - started)

    append.publish_revision = timed_publish  # the same call, timed
    started = time.perf_counter()
    report = append.append(spec["dest"], spec["source"],
                                   options=WriteOptions(max_samples=SHARD_SAMPLES, max_bytes=None, workers=2))  # fmt: skip
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "publish_s": published[0], "appended_samples": report.num_samples,
            "num_shards": report.manifest.num_shards, "peak_rss_mb": _maxrss_mb()}  # fmt: skip


CELLS = {**derived.CELLS, "append": append_cell}


# ------------------------------------------------------------------ the run


def _cell(args: argparse.Namespace, spec: dict[str, Any], *, python: str = sys.executable,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    done = run_cell(__file__, spec, answer=CELL_ANSWER, python=python, timeout_s=args.timeout_s, env=env)
    print(json.dumps({**spec, **done}), flush=True)
    return done


def new_data(dest: str, shards: int) -> None:
    """A JSONL of ``shards`` x 10,000 rows of ~1 KB: the data every append adds."""
    rng = np.random.default_rng(3)
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "rows.jsonl"), "w") as f:
        for i in range(shards * SHARD_SAMPLES):
            f.write(json.dumps({"__key__": f"new{i:09d}", "txt": rng.bytes(500).hex()}) + "\n")


def measure(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {"commit": git_commit(), "machine": machine(), "preset": preset, "append": {}}
    base = _ensure(args, "base", lambda p: write_real(p, SHARD_SAMPLES))
    source = os.path.join(args.workdir, f"new-{preset['new_shards']}")
    if not os.path.exists(os.path.join(source, "rows.jsonl")):
        new_data(source, preset["new_shards"])
    for size in preset["sizes"]:
        ours = _ensure(args, f"synthetic-{size}", lambda p, n=size: write_synthetic(p, n, base))
        theirs = _ensure(args, f"irregular-{size}", lambda p, n=size: irregular(p, n, base))
        for naming, dataset in (("writer's names", ours), ("irregular names", theirs)):
            runs = []
            for _ in range(preset["repeats"]):
                clone = os.path.join(args.workdir, "clone")
                _clone(dataset, clone)
                os.sync()  # the clone's 10^6 new links reach the disk now, not during the append's fsyncs
                runs.append(_cell(args, {"cell": "append", "dest": clone,
                                         "source": os.path.join(source, "rows.jsonl")}))  # fmt: skip
                shutil.rmtree(clone, ignore_errors=True)
            record["append"].setdefault(naming, {})[str(size)] = runs
    synthetic = _ensure(args, f"synthetic-{preset['derived']['split_shards']}",
                        lambda p: write_synthetic(p, preset["derived"]["split_shards"], base))  # fmt: skip
    record["derived"] = derived.measure_derived(args, preset, lambda spec: _cell(args, spec), _ensure, synthetic,
                                                lambda spec, env: _cell(args, spec, python=derived.LITDATA_PYTHON, env=env))
    record["targets"] = targets(record)
    return record


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    small, large = (str(s) for s in record["preset"]["sizes"])
    for naming, by_size in record["append"].items():
        a, b = _median(by_size[small], "seconds"), _median(by_size[large], "seconds")
        if a and b:
            ratio = b / a
            out.append({"target": f"append time, {int(large):,} shards / {int(small):,} ({naming})", "value": ratio,
                        "unit": "x", "limit": 1.5, "met": ratio <= 1.5})  # fmt: skip
    if "derived" in record:
        out += derived.derived_targets(record["derived"], record["preset"]["derived"]["read_workers"])
    return out


def markdown(record: dict[str, Any]) -> str:
    p = record["preset"]
    lines = ["# Changing a dataset without copies", "",
             f"At commit {record['commit']}, {record['machine']['cpus']} CPUs. " + __doc__.split("\n\n")[1].replace("\n", " "),
             "", f"## Appending {p['new_shards'] * SHARD_SAMPLES:,} samples ({p['new_shards']} shards)", "",
             "| dataset | shards before | append s (median) | of which publish s | peak memory MB |",
             "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for naming, by_size in record["append"].items():
        for size, runs in by_size.items():
            lines.append(f"| {naming} | {int(size):,} | {_median(runs, 'seconds') or float('nan'):.2f} | "
                         f"{_median(runs, 'publish_s') or float('nan'):.3f} | "
                         f"{_median(runs, 'peak_rss_mb') or float('nan'):.0f} |")  # fmt: skip
    if "derived" in record:
        lines += derived.derived_markdown(record["derived"])
    lines += ["", "## Targets (issue #54)", "", "| target | value | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in record["targets"]:
        lines.append(f"| {t['target']} | {t['value']:.3f}{t['unit']} | {t['limit']}{t['unit']} | "
                     f"{'yes' if t['met'] else 'no'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ratios) = plt.subplots(1, 2, figsize=(13, 4))
    sizes = [str(s) for s in record["preset"]["sizes"]]
    for k, (naming, by_size) in enumerate(record["append"].items()):
        total = [_median(by_size[s], "seconds") or 0 for s in sizes]
        publish = [_median(by_size[s], "publish_s") or 0 for s in sizes]
        xs = [i + k * 0.4 for i in range(len(sizes))]
        ax.bar(xs, total, 0.4, label=f"append, {naming}")
        ax.bar(xs, publish, 0.4, color="black", alpha=0.4, label="of which publish" if k == 0 else None)
    ax.set_xticks([i + 0.2 for i in range(len(sizes))])
    ax.set_xticklabels([f"{int(s):,} shards" for s in sizes])
    ax.set_ylabel("seconds")
    ax.set_title(f"Appending the same {record['preset']['new_shards'] * SHARD_SAMPLES:,} samples")
    ax.legend()
    shown = [t for t in record["targets"] if t["unit"] == "x" and not t["target"].startswith("append")]
    ratios.barh([t["target"] for t in shown], [t["value"] for t in shown],
                color=["tab:green" if t["met"] else "tab:red" for t in shown])  # fmt: skip
    ratios.set_xscale("log")
    ratios.set_title("extensions and views: ratio (green: target met)")
    ratios.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return bench_main(argv, __doc__, "revisions", answer=CELL_ANSWER, cells=CELLS, measure=measure, presets=(FULL, QUICK),
                      markdown=markdown, plot=plot)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
