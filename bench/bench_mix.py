#!/usr/bin/env python3
"""Weighted dataset mixing (issue #14): how close each batch comes to the
chosen shares, and what mixing costs in throughput. Peers in the same run.

**Per-batch mixing error.** Small synthetic streams (~2 KB samples, 16 shards
each) mixed with weights 0.5/0.5, 0.7/0.3, 0.9/0.1 and 0.5/0.3/0.2, read
through a DataLoader with 0 and 2 workers in batches of 64 made in the
workers (the batch a training step gets):

- ``shardkit``: ``ShardDataset([Stream(a, weight=...), ...],
  samples_per_epoch=N, mode="balanced", buffer_size=1000)``, one whole
  epoch; each sample's ``__stream__`` says where it came from;
- ``webdataset``: ``RandomMix([WebDataset(a, shardshuffle=...).shuffle(1000)
  .map(tag), ...], probs=...)`` over the same shards, the first N samples
  (``RandomMix`` stops when its first source runs out; the sets are large
  enough that it does not before N).

For each stream, the deviation of its count per full batch from 64 × share:
max and mean of its absolute value; partial batches (a worker's last) are
left out. The reference is independent draws: mean |dev| of
Binomial(64, share) (exact; ≈ sqrt(2·64·p(1−p)/π)), and the expected max
|dev| over as many batches (simulated). Also each stream's total over the
epoch against its exact share.

**Throughput.** Two streams of ~100 KB samples (7:3 in size) mixed with
weights 0.7/0.3 and ``samples_per_epoch`` = their total, so the mixture
reads every sample once: the same bytes as ``single``, one ``ShardDataset``
over a dataset written from the same samples (their union). Balanced mode,
a 1,000-sample buffer, batches of 64 collated to counts inside the workers
(nothing but counts crosses to the main process), DataLoader with 2 and 4
workers; samples/s over a whole pass from ``iter(loader)`` (worker start-up
included), best of the repeats (9 for shardkit, 3 for webdataset), peers
alternating; also the rate after the first batch and the time to it, to
tell start-up from streaming. For reference, webdataset over the union and
``RandomMix(longest=True)`` over the two streams (so it too reads every
sample once). The shards are on local disk and read once before timing:
page-cache-hot. Target: the shardkit mixture keeps ≥ 95% of ``single``'s
rate.

Writes ``bench/results/mix.json`` / ``.md`` / ``.png``::

    .venv/bin/python bench/bench_mix.py            # ~4 GB of shards (made once), ~6 minutes on 2 cores
    .venv/bin/python bench/bench_mix.py --quick    # smaller, under a minute
"""

from __future__ import annotations

import argparse
import functools
import glob
import math
import os
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import shardkit  # noqa: E402
from bench.common import git_commit, machine, plot_path, save_record  # noqa: E402

BATCH = 64
BUFFER = 1000
#: Weight settings of the mixing-error table (a name per setting for the tables).
SETTINGS: tuple[tuple[float, ...], ...] = ((0.5, 0.5), (0.7, 0.3), (0.9, 0.1), (0.5, 0.3, 0.2))
ERROR_WORKERS = (0, 2)
THROUGHPUT_WORKERS = (2, 4)
THROUGHPUT_WEIGHTS = (0.7, 0.3)
PEERS = ("shardkit single", "shardkit mix", "webdataset single", "webdataset RandomMix")


# --------------------------------------------------------------------------- data


def write_set(
    dest: str, items: Iterable[tuple[str, int, int]], *, num_samples: int, per_shard: int, sample_kb: float
) -> str:
    """Shards of the samples ``(key, seed, index)`` in ``items``: each an
    incompressible ``.bin`` of about ``sample_kb`` KB (a slice of one random
    buffer, its size and place from ``(seed, index)``) and a ``cls``. A folder
    whose manifest already counts ``num_samples`` samples is reused."""
    if os.path.exists(os.path.join(dest, "manifest.json")) and shardkit.load_manifest(dest).num_samples == num_samples:
        return dest
    payload = np.random.default_rng(0).bytes(int(sample_kb * 1000 * 2.6))
    with shardkit.ShardWriter(dest, max_samples=per_shard, max_bytes=None, overwrite=True) as writer:
        for key, seed, index in items:
            rng = np.random.default_rng([seed, index])
            size = int(sample_kb * 1000 * rng.uniform(0.7, 1.3))
            cut = int(rng.integers(0, len(payload) - size))
            writer.write({"__key__": key, "bin": payload[cut : cut + size], "cls": str(index % 100).encode()})
    assert shardkit.load_manifest(dest).num_samples == num_samples
    return dest


def stream_items(name: str, seed: int, count: int) -> list[tuple[str, int, int]]:
    return [(f"{name}{i:07d}", seed, i) for i in range(count)]


def make_error_sets(workdir: str, *, num_samples: int, num_shards: int) -> list[str]:
    """Three streams of ``num_samples`` ~2 KB samples each."""
    per_shard = -(-num_samples // num_shards)
    return [
        write_set(
            os.path.join(workdir, f"err-{name}-{num_samples}"),
            stream_items(name, seed, num_samples),
            num_samples=num_samples,
            per_shard=per_shard,
            sample_kb=2,
        )
        for seed, name in enumerate("abc", start=10)
    ]


def make_throughput_sets(workdir: str, *, num_samples: int, per_shard: int, sample_kb: float) -> dict[str, str]:
    """Streams ``a`` and ``b`` (7:3 of ``num_samples``) and ``union``, the
    same samples as one dataset (in a seeded random order)."""
    sizes = {"a": num_samples * 7 // 10, "b": num_samples - num_samples * 7 // 10}
    items = {name: stream_items(name, seed, sizes[name]) for seed, name in enumerate("ab", start=20)}
    paths = {
        name: write_set(
            os.path.join(workdir, f"tp-{name}-{num_samples}"),
            items[name],
            num_samples=sizes[name],
            per_shard=per_shard,
            sample_kb=sample_kb,
        )
        for name in "ab"
    }
    union = items["a"] + items["b"]
    order = np.random.default_rng(3).permutation(len(union))
    paths["union"] = write_set(
        os.path.join(workdir, f"tp-union-{num_samples}"),
        (union[int(i)] for i in order),
        num_samples=num_samples,
        per_shard=per_shard,
        sample_kb=sample_kb,
    )
    return paths


def shard_urls(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "*.tar")))


def warm(paths: Iterable[str]) -> int:
    """Read every shard once so the page cache holds them; returns the bytes."""
    total = 0
    for path in paths:
        for name in shard_urls(path):
            with open(name, "rb") as f:
                while block := f.read(16 << 20):
                    total += len(block)
    return total


def has_mixing() -> bool:
    """Whether the installed shardkit has ``Stream`` (issue #14)."""
    try:
        shardkit.Stream  # noqa: B018
    except AttributeError:
        return False
    return True


# --------------------------------------------------------------------------- loaders


def _tag(index: int, sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "__stream__": index}


def _stream_labels(batch: list[dict[str, Any]]) -> list[Any]:
    return [sample["__stream__"] for sample in batch]


def _count(batch: list[dict[str, Any]]) -> tuple[int, int]:
    return len(batch), sum(len(sample["bin"]) for sample in batch)


def shardkit_mix(
    paths: Sequence[str],
    weights: Sequence[float],
    *,
    samples_per_epoch: int,
    workers: int,
    seed: int,
    collate: Callable[[list[Any]], Any],
) -> Any:
    streams = [shardkit.Stream(path, weight=w) for path, w in zip(paths, weights)]
    dataset = shardkit.ShardDataset(
        streams,
        samples_per_epoch=samples_per_epoch,
        mode="balanced",
        seed=seed,
        buffer_size=BUFFER,
        batch_size=BATCH,
        collate=collate,
    )
    return shardkit.make_loader(dataset, num_workers=workers, persistent_workers=False)


def shardkit_single(path: str, *, workers: int, seed: int, collate: Callable[[list[Any]], Any]) -> Any:
    dataset = shardkit.ShardDataset(
        path, mode="balanced", seed=seed, buffer_size=BUFFER, batch_size=BATCH, collate=collate
    )
    return shardkit.make_loader(dataset, num_workers=workers, persistent_workers=False)


def webdataset_stream(path: str, *, seed: int, tag: int | None = None) -> Any:
    import webdataset as wds

    urls = shard_urls(path)
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(BUFFER)
    return dataset if tag is None else dataset.map(functools.partial(_tag, tag))


def webdataset_mix(
    paths: Sequence[str],
    weights: Sequence[float],
    *,
    workers: int,
    seed: int,
    collate: Callable[[list[Any]], Any],
    longest: bool = False,
) -> Any:
    import webdataset as wds
    from torch.utils.data import DataLoader

    sources = [webdataset_stream(path, seed=seed + i, tag=i) for i, path in enumerate(paths)]
    mix = wds.RandomMix(sources, probs=list(weights), longest=longest)
    return DataLoader(mix, batch_size=BATCH, num_workers=workers, collate_fn=collate)


def webdataset_single(path: str, *, workers: int, seed: int, collate: Callable[[list[Any]], Any]) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(webdataset_stream(path, seed=seed), batch_size=BATCH, num_workers=workers, collate_fn=collate)


# --------------------------------------------------------------------------- mixing error


def stream_counts(
    batches: Iterable[list[Any]], num_streams: int, *, limit: int | None = None
) -> tuple[np.ndarray, list[int]]:
    """Per full batch, the samples of each stream: an array (batches,
    streams); and each stream's samples in all batches read, partial ones
    included. Labels are stream indices (or names ``"0"``, ``"1"``, ...);
    batches shorter than :data:`BATCH` are left out of the array; at most
    ``limit`` samples are read."""
    rows = []
    totals = np.zeros(num_streams, dtype=np.int64)
    seen = 0
    for labels in batches:
        if limit is not None and seen >= limit:
            break
        seen += len(labels)
        row = np.bincount([int(label) for label in labels], minlength=num_streams)
        totals += row
        if len(labels) == BATCH:
            rows.append(row)
    assert rows, "no full batch"
    counts = np.stack(rows)
    assert counts.shape[1] == num_streams, counts.shape
    return counts, totals.tolist()


def binomial_mean_abs_dev(n: int, p: float) -> float:
    """E|X − np| for X ~ Binomial(n, p), exactly."""
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) * abs(k - n * p) for k in range(n + 1))


def binomial_expected_max(n: int, p: float, num_batches: int, *, trials: int = 2000) -> float:
    """The expected max over ``num_batches`` batches of |X − np|, X ~
    Binomial(n, p) (simulated, seeded)."""
    draws = np.random.default_rng(0).binomial(n, p, size=(trials, num_batches))
    return float(np.abs(draws - n * p).max(axis=1).mean())


def deviation_stats(counts: np.ndarray, weights: Sequence[float]) -> dict[str, Any]:
    shares = np.asarray(weights) / sum(weights)
    dev = counts - BATCH * shares
    streams = []
    for i, p in enumerate(shares):
        streams.append(
            {
                "share": float(p),
                "expected": float(BATCH * p),
                "max_abs_dev": float(np.abs(dev[:, i]).max()),
                "mean_abs_dev": float(np.abs(dev[:, i]).mean()),
                "min_count": int(counts[:, i].min()),
                "max_count": int(counts[:, i].max()),
                "binomial_mean_abs_dev": binomial_mean_abs_dev(BATCH, float(p)),
                "binomial_expected_max_abs_dev": binomial_expected_max(BATCH, float(p), len(counts)),
            }
        )
    return {
        "num_full_batches": len(counts),
        "streams": streams,
        # The first stream's count per batch, for the plot.
        "counts_stream0": counts[:, 0].tolist(),
    }


def measure_errors(paths: Sequence[str], *, samples_per_epoch: int, mixing: bool) -> list[dict[str, Any]]:
    rows = []
    for weights in SETTINGS:
        streams = paths[: len(weights)]
        for workers in ERROR_WORKERS:
            row: dict[str, Any] = {"weights": list(weights), "num_workers": workers, "peers": {}}
            if mixing:
                loader = shardkit_mix(
                    streams,
                    weights,
                    samples_per_epoch=samples_per_epoch,
                    workers=workers,
                    seed=0,
                    collate=_stream_labels,
                )
                counts, totals = stream_counts(loader, len(weights))
                row["peers"]["shardkit"] = {**deviation_stats(counts, weights), "epoch_totals": totals}
            random.seed(0)  # RandomMix draws from the global `random` (with workers, torch seeds each)
            loader = webdataset_mix(streams, weights, workers=workers, seed=0, collate=_stream_labels)
            counts, totals = stream_counts(loader, len(weights), limit=samples_per_epoch)
            row["peers"]["webdataset"] = {**deviation_stats(counts, weights), "epoch_totals": totals}
            rows.append(row)
            print(error_line(row), flush=True)
    return rows


def setting_name(weights: Sequence[float]) -> str:
    return "/".join(f"{w:g}" for w in weights)


def error_line(row: dict[str, Any]) -> str:
    parts = [f"{setting_name(row['weights'])}, {row['num_workers']} workers:"]
    for peer, stats in row["peers"].items():
        cells = ", ".join(f"{s['max_abs_dev']:.1f}/{s['mean_abs_dev']:.2f}" for s in stats["streams"])
        parts.append(f"{peer} max/mean |dev| {cells}")
    binom = ", ".join(
        f"{s['binomial_expected_max_abs_dev']:.1f}/{s['binomial_mean_abs_dev']:.2f}"
        for s in next(iter(row["peers"].values()))["streams"]
    )
    parts.append(f"binomial {binom}")
    return "  ".join(parts)


# --------------------------------------------------------------------------- throughput


def timed_pass(loader: Any) -> dict[str, float]:
    """One pass over a loader of ``(samples, bytes)`` batches, timed from
    ``iter``, and from its first batch."""
    samples = num_bytes = 0
    first_s = after_first = None
    cpu_start = cpu_seconds()
    start = time.perf_counter()
    for count, size in loader:
        if first_s is None:
            first_s = time.perf_counter() - start
            after_first = samples + int(count)
        samples += int(count)
        num_bytes += int(size)
    seconds = time.perf_counter() - start
    del loader  # its workers were joined at the end of the pass (not persistent), so their time is counted
    cpu = cpu_seconds() - cpu_start
    assert first_s is not None and after_first is not None
    return {
        "samples": samples,
        "bytes": num_bytes,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "first_batch_s": first_s,
        # After the first batch: the rate without worker start-up and buffer fill.
        "steady_samples_per_s": (samples - after_first) / (seconds - first_s),
        # CPU time of this process and its finished workers: what the pass cost, whatever else ran.
        "cpu_s": cpu,
        "samples_per_cpu_s": samples / cpu,
        "load_1min": os.getloadavg()[0],
    }


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def build_throughput(peer: str, paths: dict[str, str], *, workers: int, seed: int, num_samples: int) -> Any:
    mixed = [paths["a"], paths["b"]]
    if peer == "shardkit single":
        return shardkit_single(paths["union"], workers=workers, seed=seed, collate=_count)
    if peer == "shardkit mix":
        return shardkit_mix(
            mixed, THROUGHPUT_WEIGHTS, samples_per_epoch=num_samples, workers=workers, seed=seed, collate=_count
        )
    if peer == "webdataset single":
        return webdataset_single(paths["union"], workers=workers, seed=seed, collate=_count)
    if peer == "webdataset RandomMix":
        return webdataset_mix(mixed, THROUGHPUT_WEIGHTS, workers=workers, seed=seed, collate=_count, longest=True)
    raise ValueError(peer)


def measure_throughput(
    paths: dict[str, str], *, num_samples: int, repeats: int, reference_repeats: int, mixing: bool
) -> dict[str, dict[str, Any]]:
    """Per worker count, per peer: the passes and the best rate. The shardkit
    peers run ``repeats`` times, the webdataset reference the first
    ``reference_repeats`` of them; the order alternates each repeat."""
    peers = [p for p in PEERS if mixing or p != "shardkit mix"]
    out: dict[str, dict[str, Any]] = {}
    for workers in THROUGHPUT_WORKERS:
        for peer in peers:  # one untimed pass each: imports, page cache, allocator
            timed_pass(build_throughput(peer, paths, workers=workers, seed=99, num_samples=num_samples))
        runs: dict[str, list[dict[str, float]]] = {p: [] for p in peers}
        for r in range(repeats):
            order = [p for p in peers if p.startswith("shardkit") or r < reference_repeats]
            for peer in order if r % 2 == 0 else order[::-1]:  # alternating, so drift hits all alike
                runs[peer].append(
                    timed_pass(build_throughput(peer, paths, workers=workers, seed=r, num_samples=num_samples))
                )
        row: dict[str, Any] = {
            peer: {
                "best_samples_per_s": max(run["samples_per_s"] for run in v),
                "median_samples_per_s": statistics.median(run["samples_per_s"] for run in v),
                "best_mb_per_s": max(run["bytes"] / run["seconds"] / 1e6 for run in v),
                "best_steady_samples_per_s": max(run["steady_samples_per_s"] for run in v),
                "median_first_batch_s": statistics.median(run["first_batch_s"] for run in v),
                "best_samples_per_cpu_s": max(run["samples_per_cpu_s"] for run in v),
                "median_samples_per_cpu_s": statistics.median(run["samples_per_cpu_s"] for run in v),
                "runs": v,
            }
            for peer, v in runs.items()
        }
        out[str(workers)] = row
        line = ", ".join(f"{p} {v['best_samples_per_s']:,.0f}" for p, v in row.items())
        print(f"throughput, {workers} workers, samples/s (best of runs): {line}", flush=True)
    return out


def ratios(throughput: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Best rate over best rate for the pairs of interest; for shardkit mix
    over single also the median of the ratios within a repeat (the two ran
    back to back, so a busy moment hits both)."""
    out = {}
    for workers, peers in throughput.items():
        row = {}

        def best(name: str, peers: dict[str, Any] = peers) -> float:
            return peers[name]["best_samples_per_s"]

        if "shardkit mix" in peers:
            row["shardkit mix / single"] = best("shardkit mix") / best("shardkit single")
            row["shardkit mix / single, median paired"] = statistics.median(
                m["samples_per_s"] / s["samples_per_s"]
                for m, s in zip(peers["shardkit mix"]["runs"], peers["shardkit single"]["runs"])
            )
            row["shardkit mix / single, samples per CPU-s (median)"] = (
                peers["shardkit mix"]["median_samples_per_cpu_s"] / peers["shardkit single"]["median_samples_per_cpu_s"]
            )
        row["webdataset RandomMix / single"] = best("webdataset RandomMix") / best("webdataset single")
        if "shardkit mix" in peers:
            row["shardkit mix / webdataset RandomMix"] = best("shardkit mix") / best("webdataset RandomMix")
        out[workers] = row
    return out


# --------------------------------------------------------------------------- report


def table(record: dict[str, Any]) -> str:
    lines = [
        f"# Weighted mixing (issue #14){'' if record['mixing'] else ' — shardkit.Stream not available: webdataset only'}",
        "",
        (
            f"`{record['command']}` at `{record['git_commit']}`, {record['machine']['cpus']} CPUs, "
            f"{record['machine']['platform']}, Python {record['machine']['python']}, "
            + ", ".join(f"{k} {v}" for k, v in record["versions"].items())
            + "."
        ),
        "",
        f"## Per-batch mixing error (batches of {BATCH}, made in the workers)",
        "",
        (
            f"Streams of {record['error_set_samples']:,} ~2 KB samples in {record['error_set_shards']} shards each; "
            f"shardkit reads one epoch of `samples_per_epoch={record['error_epoch']:,}` (balanced, buffer "
            f"{BUFFER:,}), webdataset `RandomMix` (each stream shard-shuffled + `.shuffle({BUFFER})`) its first "
            f"{record['error_epoch']:,} samples. Per stream: max |dev| / mean |dev| of its count per full batch "
            f"from {BATCH} × share; binomial = independent draws (expected max over as many batches / exact mean)."
        ),
        "",
        (
            "| weights | workers | stream (expected) | shardkit max / mean | webdataset max / mean "
            "| binomial max / mean | full batches (shardkit, webdataset) |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for row in record["mixing_error"]:
        peers = row["peers"]
        ref = peers["webdataset"]["streams"]
        for i, s in enumerate(ref):
            cells = []
            for peer in ("shardkit", "webdataset"):
                if peer in peers:
                    p = peers[peer]["streams"][i]
                    cells.append(f"{p['max_abs_dev']:.1f} / {p['mean_abs_dev']:.2f}")
                else:
                    cells.append("—")
            nb = ", ".join(str(peers[p]["num_full_batches"]) if p in peers else "—" for p in ("shardkit", "webdataset"))
            lines.append(
                f"| {setting_name(row['weights'])} | {row['num_workers']} | {i} ({s['expected']:.1f}) | "
                f"{cells[0]} | {cells[1]} | {s['binomial_expected_max_abs_dev']:.1f} / "
                f"{s['binomial_mean_abs_dev']:.2f} | {nb} |"
            )
    lines += [
        "",
        "Samples per stream over the epoch (all batches, partial ones too):",
        "",
        "| weights | workers | expected | shardkit | webdataset |",
        "|---|---|---|---|---|",
    ]
    for row in record["mixing_error"]:
        shares = np.asarray(row["weights"]) / sum(row["weights"])
        expected = ", ".join(f"{record['error_epoch'] * p:,.0f}" for p in shares)
        cells = [
            ", ".join(f"{t:,}" for t in row["peers"][peer]["epoch_totals"]) if peer in row["peers"] else "—"
            for peer in ("shardkit", "webdataset")
        ]
        lines.append(f"| {setting_name(row['weights'])} | {row['num_workers']} | {expected} | {cells[0]} | {cells[1]} |")
    tp = record["throughput"]
    lines += [
        "",
        (
            f"## Throughput, samples/s (best of {record['repeats']} for shardkit, {record['reference_repeats']} "
            "for webdataset; page-cache-hot)"
        ),
        "",
        (
            f"Streams a and b: {record['throughput_samples'] * 7 // 10:,} and "
            f"{record['throughput_samples'] - record['throughput_samples'] * 7 // 10:,} samples of "
            f"~{record['sample_kb']} KB ({record['throughput_gb']:.2f} GB together, {record['per_shard']} samples "
            f"per shard), on local disk, read once before timing (page-cache-hot); `single` = one dataset holding "
            f"both sets' samples. Mixtures weigh 0.7/0.3 over `samples_per_epoch` = the total (shardkit) or run "
            f"`longest=True` (webdataset), so every peer reads the same samples once. Balanced mode, buffer "
            f"{BUFFER:,}, batches of {BATCH} collated to counts in the workers; samples/s over a whole pass from "
            f"`iter(loader)` (worker start-up included); {record['machine']['cpus']} CPUs, so 4 workers "
            f"oversubscribe them. 1-min load average {record['load_before']:.1f} before the run, "
            f"{record['load_after']:.1f} after (other work on the machine makes single passes vary); the ratio "
            "rows are best over best, and for shardkit also the median of the ratios of back-to-back passes."
        ),
        "",
        (
            "Without start-up: samples/s after the first batch (best), seconds to the first batch (median); "
            "and what a pass costs whatever else ran: samples per CPU-second of the loader's processes "
            "(main + workers, user + system; median)."
        ),
        "",
        "| peer | " + " | ".join(f"{w} workers: steady / first batch / per CPU-s" for w in tp) + " |",
        "|---|" + "---|" * len(tp),
    ]
    for peer in next(iter(tp.values())):
        cells = [
            f"{tp[w][peer]['best_steady_samples_per_s']:,.0f} / {tp[w][peer]['median_first_batch_s']:.2f} s / "
            f"{tp[w][peer]['median_samples_per_cpu_s']:,.0f}"
            for w in tp
        ]
        lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Rates over whole passes, and their ratios:",
        "",
        "| peer | " + " | ".join(f"{w} workers" for w in tp) + " |",
        "|---|" + "---|" * len(tp),
    ]
    for peer in next(iter(tp.values())):
        cells = [
            f"{tp[w][peer]['best_samples_per_s']:,.0f} ({tp[w][peer]['best_mb_per_s']:,.0f} MB/s)" for w in tp
        ]
        lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    for name in next(iter(record["throughput_ratios"].values())):
        lines.append(
            f"| *{name}* | " + " | ".join(f"{record['throughput_ratios'][w][name]:.3f}" for w in tp) + " |"
        )
    if record["mixing"]:
        ok = all(r["shardkit mix / single"] >= 0.95 for r in record["throughput_ratios"].values())
        lines += [
            "",
            f"Target: shardkit mix ≥ 95% of single (best over best): {'met' if ok else 'NOT met'} ("
            + ", ".join(
                f"{w} workers {100 * r['shardkit mix / single']:.1f}% (median paired "
                f"{100 * r['shardkit mix / single, median paired']:.1f}%, per CPU-s "
                f"{100 * r['shardkit mix / single, samples per CPU-s (median)']:.1f}%)"
                for w, r in record["throughput_ratios"].items()
            )
            + ").",
        ]
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    # 1. Distribution of stream 0's count per batch, 0.7/0.3 with 2 workers.
    ax = axes[0]
    row = next(r for r in record["mixing_error"] if r["weights"] == [0.7, 0.3] and r["num_workers"] == 2)
    expected = BATCH * 0.7
    bins = np.arange(math.floor(expected) - 15, math.floor(expected) + 17) - 0.5
    for peer, color in (("webdataset", "C1"), ("shardkit", "C0")):
        if peer in row["peers"]:
            ax.hist(row["peers"][peer]["counts_stream0"], bins=bins, alpha=0.6, color=color, label=peer, density=True)
    ax.axvline(expected, color="k", lw=0.8, ls="--", label=f"64 × 0.7 = {expected:.1f}")
    ax.set_xlabel(f"stream 0 samples per batch of {BATCH}")
    ax.set_ylabel("fraction of batches")
    ax.set_title("0.7/0.3, 2 workers: stream 0's count per batch")
    ax.legend()
    # 2. Max and mean |dev| (the worst stream) per setting, 2 workers.
    ax = axes[1]
    rows = [r for r in record["mixing_error"] if r["num_workers"] == 2]
    names = [setting_name(r["weights"]) for r in rows]
    x = np.arange(len(rows))
    width = 0.13
    series = []
    for peer, color in (("shardkit", "C0"), ("webdataset", "C1")):
        if peer in rows[0]["peers"]:
            series.append((f"{peer} max", color, [max(s["max_abs_dev"] for s in r["peers"][peer]["streams"]) for r in rows], None))
            series.append((f"{peer} mean", color, [max(s["mean_abs_dev"] for s in r["peers"][peer]["streams"]) for r in rows], "//"))
    ref = [r["peers"]["webdataset"]["streams"] for r in rows]
    series.append(("binomial max", "C7", [max(s["binomial_expected_max_abs_dev"] for s in st) for st in ref], None))
    series.append(("binomial mean", "C7", [max(s["binomial_mean_abs_dev"] for s in st) for st in ref], "//"))
    for k, (label, color, values, hatch) in enumerate(series):
        bars = ax.bar(
            x + (k - (len(series) - 1) / 2) * width,
            values,
            width,
            label=label,
            color=color,
            hatch=hatch,
            edgecolor="white" if hatch else None,
        )
        ax.bar_label(bars, fmt="%.1f", fontsize=6)
    ax.set_xticks(x, names)
    ax.set_ylabel(f"|count − {BATCH}·share| (worst stream)")
    ax.set_title(f"per-batch mixing error, 2 workers, batches of {BATCH}")
    ax.legend(fontsize=7, ncol=2)
    # 3. Throughput.
    ax = axes[2]
    tp = record["throughput"]
    peers = list(next(iter(tp.values())))
    x = np.arange(len(tp))
    width = 0.8 / len(peers)
    for k, peer in enumerate(peers):
        ax.bar(x + (k - (len(peers) - 1) / 2) * width, [tp[w][peer]["best_samples_per_s"] for w in tp], width, label=peer,
               color=f"C{k}")
    ax.set_xticks(x, [f"{w} workers" for w in tp])
    ax.set_ylabel("samples/s (best of runs)")
    ax.set_title(f"~{record['sample_kb']} KB samples, page-cache-hot")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def versions() -> dict[str, str]:
    import torch
    import webdataset

    return {"shardkit": shardkit.__version__, "torch": torch.__version__, "webdataset": webdataset.__version__}



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "mix"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "mix.json"))
    parser.add_argument("--repeats", type=int, default=None, help="throughput runs of shardkit (default 9, quick 1)")
    parser.add_argument(
        "--reference-repeats", type=int, default=None, help="throughput runs of webdataset (default 3, quick 1)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sets and one throughput run")
    args = parser.parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (1 if quick else 9)
    reference_repeats = min(repeats, args.reference_repeats or (1 if quick else 3))
    error_epoch = BATCH * (50 if quick else 200)
    error_shards = 8 if quick else 16
    throughput_samples = 2_000 if quick else 20_000
    per_shard = 100 if quick else 250
    sample_kb = 100
    mixing = has_mixing()
    if not mixing:
        print("shardkit.Stream is not available: measuring webdataset only", flush=True)

    error_paths = make_error_sets(args.workdir, num_samples=error_epoch, num_shards=error_shards)
    tp_paths = make_throughput_sets(args.workdir, num_samples=throughput_samples, per_shard=per_shard, sample_kb=sample_kb)
    warm(error_paths)
    tp_bytes = warm([tp_paths["a"], tp_paths["b"]])
    warm([tp_paths["union"]])

    record: dict[str, Any] = {
        "load_before": os.getloadavg()[0],
        "command": " ".join(["bench/bench_mix.py", *(argv if argv is not None else sys.argv[1:])]),
        "git_commit": git_commit(),
        "machine": machine(),
        "versions": versions(),
        "mixing": mixing,
        "batch_size": BATCH,
        "buffer_size": BUFFER,
        "error_epoch": error_epoch,
        "error_set_samples": error_epoch,
        "error_set_shards": error_shards,
        "throughput_samples": throughput_samples,
        "throughput_gb": tp_bytes / 1e9,
        "per_shard": per_shard,
        "sample_kb": sample_kb,
        "repeats": repeats,
        "reference_repeats": reference_repeats,
    }
    record["mixing_error"] = measure_errors(error_paths, samples_per_epoch=error_epoch, mixing=mixing)
    record["throughput"] = measure_throughput(
        tp_paths, num_samples=throughput_samples, repeats=repeats, reference_repeats=reference_repeats, mixing=mixing
    )
    record["throughput_ratios"] = ratios(record["throughput"])
    record["load_after"] = os.getloadavg()[0]
    save_record(args.out, record, table(record))
    plot(record, plot_path(args.out))
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
