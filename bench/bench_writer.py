#!/usr/bin/env python3
"""Writer benchmark: webdataset's ShardWriter vs shardkit with 1 and 2 workers.

One run writes the same generated ImageFolder set (~5,000 JPEGs of ~110 KB by
default) three ways, from a warm page cache, and prints samples/s, MB/s and
the ratios against webdataset. Runs are interleaved and repeated; the median
is reported. Results go to ``bench/results/writer.json`` and ``writer.md``.

    python bench/bench_writer.py              # full size
    python bench/bench_writer.py --quick      # 600 images, for a smoke run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, os.path.dirname(HERE))

from gen_images import generate  # noqa: E402

import shardkit  # noqa: E402
from bench.common import machine, save_record  # noqa: E402
from shardkit.write.parallel import WriteOptions, write_dataset  # noqa: E402

SAMPLES_PER_SHARD = 250


def warm(root: str) -> int:
    """Read every file once so all runs start from the page cache."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                total += len(f.read())
    return total


def run_webdataset(root: str, dest: str, samples_per_shard: int) -> int:
    import webdataset as wds

    classes = sorted(os.listdir(root))
    os.makedirs(dest)
    count = 0
    # The way its docs show: read each file, write a dict, ShardWriter rolls.
    with wds.ShardWriter(os.path.join(dest, "shard-%06d.tar"), maxcount=samples_per_shard, verbose=0) as sink:
        for label, name in enumerate(classes):
            folder = os.path.join(root, name)
            for file in sorted(os.listdir(folder)):
                with open(os.path.join(folder, file), "rb") as f:
                    data = f.read()
                sink.write({"__key__": f"{name}/{file.rsplit('.', 1)[0]}", "jpg": data, "cls": label})
                count += 1
    return count


def run_shardkit(root: str, dest: str, workers: int, samples_per_shard: int) -> int:
    options = WriteOptions(max_samples=samples_per_shard, workers=workers)
    return write_dataset(root, dest, options=options).manifest.num_samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--target-kb", type=float, default=110)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "writer"))
    parser.add_argument("--samples-per-shard", type=int, default=SAMPLES_PER_SHARD)
    parser.add_argument("--quick", action="store_true", help="600 images, 60 per shard, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats, args.samples_per_shard = 600, 2, 60
    classes = 100 if args.images >= 1000 else 10
    per_class = args.images // classes
    source = os.path.join(args.workdir, f"images-{classes}x{per_class}-{args.target_kb:g}kb")
    if not os.path.isdir(source):
        print(f"generating {classes * per_class} JPEGs in {source} ...", flush=True)
        generate(source + ".tmp", classes=classes, per_class=per_class, target_kb=args.target_kb)
        os.replace(source + ".tmp", source)
    total_bytes = warm(source)
    count = classes * per_class
    per_shard = args.samples_per_shard

    runners = {
        "webdataset ShardWriter": lambda dest: run_webdataset(source, dest, per_shard),
        "shardkit --workers 1": lambda dest: run_shardkit(source, dest, 1, per_shard),
        "shardkit --workers 2": lambda dest: run_shardkit(source, dest, 2, per_shard),
    }
    times: dict[str, list[float]] = {name: [] for name in runners}
    durable: dict[str, list[float]] = {name: [] for name in runners}
    dest = os.path.join(args.workdir, "out")
    for runner in runners.values():  # untimed warm-up: imports, process pools
        shutil.rmtree(dest, ignore_errors=True)
        runner(dest)
    for repeat in range(args.repeats):
        for name, runner in runners.items():  # interleaved, so drift hits all alike
            shutil.rmtree(dest, ignore_errors=True)
            os.sync()
            warm(source)  # this machine reclaims idle page cache: re-warm every run
            started = time.perf_counter()
            written = runner(dest)
            times[name].append(time.perf_counter() - started)
            os.sync()  # until durable: webdataset's bytes may still sit in the page cache
            durable[name].append(time.perf_counter() - started)
            assert written == count, (name, written, count)
        print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()), flush=True)
    shutil.rmtree(os.path.join(args.workdir, "out"), ignore_errors=True)

    base = statistics.median(times["webdataset ShardWriter"])
    base_durable = statistics.median(durable["webdataset ShardWriter"])
    rows = []
    for name, values in times.items():
        seconds = statistics.median(values)
        durable_s = statistics.median(durable[name])
        rows.append(
            {
                "writer": name,
                "seconds_median": seconds,
                "seconds_all": values,
                "samples_per_s": count / seconds,
                "mb_per_s": total_bytes / seconds / 1e6,
                "ratio_vs_webdataset": base / seconds,
                "durable_seconds_median": durable_s,
                "durable_samples_per_s": count / durable_s,
                "durable_ratio_vs_webdataset": base_durable / durable_s,
            }
        )
    lines = [
        f"Writer benchmark: {count} JPEGs, {total_bytes / 1e6:.0f} MB ({total_bytes / count / 1e3:.0f} KB avg), "
        f"{per_shard} samples/shard, warm cache, median of {args.repeats}, {os.cpu_count()} cores",
        "",
        "'until return' stops the clock when the writer returns (webdataset does not fsync, so its bytes",
        "may still be in the page cache); 'until durable' adds a sync() so every writer's bytes are on disk.",
        "",
        "| writer | samples/s (until return) | MB/s | vs webdataset | samples/s (until durable) | vs webdataset |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['writer']} | {r['samples_per_s']:.0f} | {r['mb_per_s']:.0f} | {r['ratio_vs_webdataset']:.2f}x "
            f"| {r['durable_samples_per_s']:.0f} | {r['durable_ratio_vs_webdataset']:.2f}x |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    record = {
        "benchmark": "writer",
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": machine(),
        "versions": {"shardkit": shardkit.__version__, "webdataset": _version("webdataset")},
        "images": count,
        "bytes": total_bytes,
        "samples_per_shard": per_shard,
        "repeats": args.repeats,
        "rows": rows,
    }
    save_record(os.path.join(HERE, "results", "writer.json"), record, table + "\n")
    return 0


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
