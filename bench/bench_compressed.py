#!/usr/bin/env python3
"""Streaming throughput of gzip and zstandard shards against plain ones.

Writes one synthetic dataset (moderately compressible samples: an ``npy``-like
array of small integers and a text caption) as plain shards, then compresses
each shard whole with gzip (level 6, what ``tar -czf`` uses) and zstandard
(level 3, the ``zstd`` default). Every sample of each variant is then read
with ``shardkit.ShardDataset`` (raw bytes, no decoding, no shuffling), in the
calling process and through a DataLoader with 2 workers, after one untimed
pass so the page cache is warm.

Reports per variant and worker count: MB/s of uncompressed tar bytes (the
plain shards' size; the same samples for every variant), samples/s, and
samples per CPU-second (user + system time of the process and its
DataLoader workers: the cost per core, which is what decompression adds).
Memory (``--rss``): one ``.tar.gz`` shard of zero-filled 1 MiB members per
size in ``--rss-mb`` (100 MB to 5 GB uncompressed; a few MB stored), each
streamed to the end by shardkit (``ShardDataset``, in process) and by
webdataset (``WebDataset``), every run in a child process of its own that
reports its peak RSS (``ru_maxrss``) and its RSS after imports. shardkit
inflates in bounded pieces, so its peak should stay flat as the shard grows.

Writes ``bench/results/compressed.json``, ``.md`` and ``.png``.

    .venv/bin/python bench/bench_compressed.py            # ~2 minutes, 192 MB
    .venv/bin/python bench/bench_compressed.py --quick    # 24 MB, 2 repeats
    .venv/bin/python bench/bench_compressed.py --rss-only # the memory rows only, kept beside the rest
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import zlib
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import shardkit  # noqa: E402
from bench.common import machine, plot_path, save_record  # noqa: E402
from shardkit.format.compression import stream_compressor  # noqa: E402

MB = 1_000_000
VARIANTS = ("plain", "gzip", "zstd")
SUFFIX = {"gzip": ".tar.gz", "zstd": ".tar.zst"}


def make_dataset(dest: str, *, num_shards: int, shard_mb: int, sample_kb: int) -> shardkit.Manifest:
    """Plain shards of samples that compress about 2-3x (4-bit values, text)."""
    per_shard = max(shard_mb * 1000 // sample_kb, 1)
    if os.path.exists(os.path.join(dest, "manifest.json")):
        manifest = shardkit.load_manifest(dest)
        if manifest.num_shards == num_shards and manifest.shards[0].num_samples == per_shard:
            return manifest
    rng = np.random.default_rng(0)
    with shardkit.ShardWriter(dest, max_samples=per_shard, max_bytes=None, overwrite=True) as writer:
        for i in range(num_shards * per_shard):
            # Fresh 4-bit values per sample: no repeats for a long-window compressor to find.
            values = rng.integers(0, 16, size=sample_kb * 1000, dtype=np.uint8).tobytes()
            caption = f"sample {i}: a photo of a {['cat', 'dog', 'eel'][i % 3]} on a {i % 17} coloured mat. ".encode()
            writer.write({"__key__": f"{i:08d}", "npy": values, "txt": caption * 8})
    return shardkit.load_manifest(dest)


def compress_shards(manifest: shardkit.Manifest, dest: str, kind: str) -> list[str]:
    """Each shard compressed whole into ``dest``; returns the paths."""
    os.makedirs(dest, exist_ok=True)
    out = []
    for entry in manifest.shards:
        src = manifest.resolve(entry.path)
        path = os.path.join(dest, os.path.basename(src)[: -len(".tar")] + SUFFIX[kind])
        if not os.path.exists(path):
            comp = stream_compressor(kind)  # type: ignore[arg-type]
            with open(src, "rb") as f, open(path + ".tmp", "wb") as g:
                while block := f.read(4 << 20):
                    g.write(comp.compress(block))
                g.write(comp.flush())
            os.replace(path + ".tmp", path)
        out.append(path)
    return out


def zero_shard(path: str, size_mb: int) -> str:
    """A ``.tar.gz`` of ``size_mb`` zero-filled 1 MiB members (MB = 10^6:
    ``size_mb * 10^6 // 2^20`` members), compressed as it is written."""
    import tarfile

    if os.path.exists(path):
        return path
    zeros = bytes(1 << 20)
    comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(path + ".tmp", "wb") as f:
        for i in range(max(size_mb * MB // len(zeros), 1)):
            info = tarfile.TarInfo(f"{i:08d}.bin")
            info.size = len(zeros)
            f.write(comp.compress(info.tobuf(format=tarfile.USTAR_FORMAT) + zeros))
        f.write(comp.compress(bytes(1024)) + comp.flush())
    os.replace(path + ".tmp", path)
    return path


def rss_child(reader: str, path: str) -> None:
    """In a child process: stream ``path`` with ``reader`` and print one
    JSON line: samples, seconds, RSS after imports and peak RSS (MB)."""
    if reader == "webdataset":
        import webdataset as wds
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if reader == "shardkit":
        count = sum(1 for _ in shardkit.ShardDataset(path, mode="exact", shuffle=False))
    else:
        count = sum(1 for _ in wds.WebDataset(path, shardshuffle=False))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"samples": count, "seconds": seconds, "baseline_rss_mb": base, "peak_rss_mb": peak}))


def run_rss(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Peak RSS of each reader on each zero-filled shard, one child each."""
    os.makedirs(args.workdir, exist_ok=True)
    rows = []
    for size_mb in args.rss_mb:
        path = zero_shard(os.path.join(args.workdir, f"zeros-{size_mb}MB.tar.gz"), size_mb)
        for reader in ("shardkit", "webdataset"):
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--rss-child", reader, path],
                capture_output=True, text=True, check=True,
            )
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row.update(reader=reader, uncompressed_mb=size_mb, stored_mb=os.path.getsize(path) / MB)
            rows.append(row)
            print(f"rss {reader:10s} {size_mb:5d} MB: peak {row['peak_rss_mb']:.0f} MB "
                  f"(after imports {row['baseline_rss_mb']:.0f} MB)", file=sys.stderr)
    return rows


def cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def read_all(source: Any, workers: int) -> tuple[int, float, float]:
    """Read every sample; returns (samples, wall seconds, CPU seconds)."""
    dataset = shardkit.ShardDataset(source, mode="exact", shuffle=False)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    if workers == 0:
        count = sum(1 for _ in dataset)
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
        count = sum(1 for _ in loader)
        del loader
    return count, time.perf_counter() - t0, cpu_seconds() - cpu0


def run(args: argparse.Namespace) -> dict[str, Any]:
    manifest = make_dataset(
        os.path.join(args.workdir, "plain"), num_shards=args.shards, shard_mb=args.shard_mb, sample_kb=args.sample_kb
    )
    sources: dict[str, Any] = {"plain": os.path.join(args.workdir, "plain")}
    sizes = {"plain": manifest.num_bytes}
    for kind in ("gzip", "zstd"):
        # Keyed by the plain set, so a rerun with other sizes never reuses stale copies.
        paths = compress_shards(manifest, os.path.join(args.workdir, f"{kind}-{manifest.fingerprint[:12]}"), kind)
        sources[kind] = paths
        sizes[kind] = sum(os.path.getsize(p) for p in paths)
    rows = []
    for workers in args.workers:
        for variant in VARIANTS:
            read_all(sources[variant], workers)  # warm the page cache (and the workers' imports)
            best = None
            for _ in range(args.repeats):
                count, wall, cpu = read_all(sources[variant], workers)
                assert count == manifest.num_samples, (variant, count)
                if best is None or wall < best[0]:
                    best = (wall, cpu)
            assert best is not None
            wall, cpu = best
            rows.append(
                {
                    "variant": variant,
                    "workers": workers,
                    "samples": manifest.num_samples,
                    "stored_mb": sizes[variant] / MB,
                    "ratio": manifest.num_bytes / sizes[variant],
                    "seconds": wall,
                    "cpu_seconds": cpu,
                    "mb_per_s": manifest.num_bytes / MB / wall,
                    "samples_per_s": manifest.num_samples / wall,
                    "samples_per_cpu_s": manifest.num_samples / max(cpu, 1e-9),
                    "mb_per_cpu_s": manifest.num_bytes / MB / max(cpu, 1e-9),
                }
            )
            print(f"{variant:5s} workers={workers}: {rows[-1]['mb_per_s']:.0f} MB/s, "
                  f"{rows[-1]['samples_per_cpu_s']:.0f} samples/CPU-s", file=sys.stderr)
    return {
        "benchmark": "compressed",
        "machine": machine(),
        "dataset": {
            "shards": args.shards,
            "shard_mb": args.shard_mb,
            "sample_kb": args.sample_kb,
            "samples": manifest.num_samples,
            "uncompressed_mb": manifest.num_bytes / MB,
        },
        "repeats": args.repeats,
        "rows": rows,
    }


def markdown(record: dict[str, Any]) -> str:
    d = record["dataset"]
    lines = [
        f"Streaming read of {d['samples']} samples ({d['uncompressed_mb']:.0f} MB of uncompressed tar, "
        f"{d['sample_kb']} kB samples), warm page cache, best of {record['repeats']}; "
        f"{record['machine']['cpus']} CPUs. MB/s counts uncompressed tar bytes; per CPU-second counts "
        "user + system time of the process and its workers.",
        "",
        "| shards | DataLoader workers | stored MB (ratio) | MB/s | samples/s | samples per CPU-s "
        "| MB per CPU-s | vs plain, per CPU-s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    plain = {r["workers"]: r for r in record["rows"] if r["variant"] == "plain"}
    for r in record["rows"]:
        rel = r["samples_per_cpu_s"] / plain[r["workers"]]["samples_per_cpu_s"]
        lines.append(
            f"| {r['variant']} | {r['workers'] or 'none (in process)'} | {r['stored_mb']:.1f} ({r['ratio']:.2f}x) "
            f"| {r['mb_per_s']:.0f} | {r['samples_per_s']:.0f} | {r['samples_per_cpu_s']:.0f} "
            f"| {r['mb_per_cpu_s']:.0f} | {rel:.2f}x |"
        )
    if record.get("rss"):
        lines += [
            "",
            "Peak RSS streaming one `.tar.gz` of zero-filled 1 MiB members to the end, in process, one child "
            "process per run (RSS after imports in brackets).",
            "",
            "| uncompressed MB | stored MB | shardkit peak RSS MB | webdataset peak RSS MB | shardkit s | webdataset s |",
            "|---|---|---|---|---|---|",
        ]
        by = {(r["reader"], r["uncompressed_mb"]): r for r in record["rss"]}
        for size in sorted({r["uncompressed_mb"] for r in record["rss"]}):
            sk, wd = by[("shardkit", size)], by[("webdataset", size)]
            lines.append(
                f"| {size} | {sk['stored_mb']:.2f} | {sk['peak_rss_mb']:.0f} ({sk['baseline_rss_mb']:.0f}) "
                f"| {wd['peak_rss_mb']:.0f} ({wd['baseline_rss_mb']:.0f}) | {sk['seconds']:.1f} | {wd['seconds']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted({r["workers"] for r in record["rows"]})
    rss = record.get("rss") or []
    fig, axes = plt.subplots(1, 3 if rss else 2, figsize=(15 if rss else 10, 4))
    width = 0.8 / len(VARIANTS)
    for i, variant in enumerate(VARIANTS):
        rows = {r["workers"]: r for r in record["rows"] if r["variant"] == variant}
        xs = [j + i * width for j in range(len(workers))]
        axes[0].bar(xs, [rows[w]["mb_per_s"] for w in workers], width, label=variant)
        axes[1].bar(xs, [rows[w]["mb_per_cpu_s"] for w in workers], width, label=variant)
    for ax, title in zip(axes, ("MB/s (uncompressed tar)", "MB per CPU-second")):
        ax.set_xticks([j + width for j in range(len(workers))])
        ax.set_xticklabels(["in process" if w == 0 else f"{w} workers" for w in workers])
        ax.set_title(title)
        ax.legend()
    if rss:
        for reader in ("shardkit", "webdataset"):
            rows = sorted((r for r in rss if r["reader"] == reader), key=lambda r: r["uncompressed_mb"])
            axes[2].plot([r["uncompressed_mb"] for r in rows], [r["peak_rss_mb"] for r in rows], "o-", label=reader)
        axes[2].set_xscale("log")
        axes[2].set_xlabel("uncompressed shard MB (.tar.gz of zeros)")
        axes[2].set_title("peak RSS MB, streaming one shard")
        axes[2].legend()
    fig.suptitle("shardkit streaming: plain vs gzip vs zstd shards")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "compressed"))
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mb", type=int, default=24)
    parser.add_argument("--sample-kb", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="0: read in this process")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 shards of 6 MB, 2 repeats")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "compressed.json"))
    parser.add_argument("--rss-mb", type=int, nargs="+", default=[100, 1000, 5000], help="memory rows' shard sizes")
    parser.add_argument("--no-rss", dest="rss", action="store_false", help="skip the memory rows")
    parser.add_argument("--rss-only", action="store_true", help="only the memory rows; keep the other rows of --out")
    parser.add_argument("--rss-child", nargs=2, metavar=("READER", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(*args.rss_child)
        return 0
    if args.quick:
        args.shards, args.shard_mb, args.repeats = 4, 6, 2
    if args.rss_only:
        with open(args.out) as f:
            record = json.load(f)
    else:
        record = run(args)
    if args.rss or args.rss_only:
        record["rss"] = run_rss(args)
    table = markdown(record)
    save_record(args.out, record, table)
    plot(record, plot_path(args.out))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
