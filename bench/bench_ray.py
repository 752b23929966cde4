#!/usr/bin/env python3
"""Ray benchmark: the Ray writer engine, shardkit.ray.write_shards and read_shards, each beside its peer.

One run, on a Ray cluster of this machine started in a network namespace of
its own (only loopback up, so Ray stays on 127.0.0.1; a head node with two
CPUs; needs root), measures:

1. ``write_dataset(..., engine="ray")`` vs ``engine="local"`` with 2 workers on
   the writer set of ``bench_writer.py`` (~5,000 JPEGs of ~110 KB, 250 per
   shard), interleaved, median of the repeats, with the outputs checked byte
   for byte against each other. Target: Ray keeps >= 85% of the local rate.
   The driver is connected to the cluster once, before the timed runs (the
   cost of connecting is reported on its own).
2. ``shardkit.ray.write_shards`` vs Ray Data's ``Dataset.write_webdataset`` on
   the same materialized Ray Dataset (the shards of step 1 read back):
   throughput, and what each output has (manifest, checksums, index, bytes
   that a second write reproduces).
3. ``shardkit.ray.read_shards`` vs ``ray.data.read_webdataset(decoder=None)``
   over the same shards: rows/s, consuming every row as Arrow batches.
   Target: >= 1.5x.
4. The driver's footprint when planning many JSONL inputs: peak RSS of a
   fresh process that scans and plans N text-only JSONL samples (the state the
   driver holds while it dispatches), and of a real Ray-engine write of a
   smaller N end to end.

Results go to ``bench/results/ray.json`` with ``ray.md`` and ``ray.png``
beside it (``--quick``: ``bench/work/results-quick/``).

    sudo .venv/bin/python bench/bench_ray.py            # full (~10 min)
    sudo .venv/bin/python bench/bench_ray.py --quick    # 600 images, 10^6-line plan (~3 min)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, ROOT)

from bench.bench_writer import warm  # noqa: E402  (the writer set is bench_writer's, warmed its way)
from bench.common import machine, peak_rss_mb, plot_path, save_record  # noqa: E402

HEAD_PORT = 6379
SAMPLES_PER_SHARD = 250


# ------------------------------------------------------------ the namespace


def _in_namespace(args: argparse.Namespace) -> int:
    """Start a one-node, two-CPU Ray cluster in a fresh network namespace, run this script inside, stop it all."""
    if os.geteuid() != 0:
        print("bench_ray.py needs root: it runs Ray in a network namespace of its own (ip netns add)", file=sys.stderr)
        return 2
    name = f"skbench-{uuid.uuid4().hex[:6]}"
    temp_dir = f"/tmp/rskb-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": ROOT}
    env.pop("RAY_ADDRESS", None)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        netns = ["ip", "netns", "exec", name]
        subprocess.run([*netns, "ip", "link", "set", "lo", "up"], check=True)
        subprocess.run(
            [*netns, ray_bin, "start", "--head", f"--port={HEAD_PORT}", "--num-cpus=2", f"--temp-dir={temp_dir}",
             "--include-dashboard=false", "--disable-usage-stats"],
            check=True, env=env, stdout=subprocess.DEVNULL,
        )
        inner = [a for a in sys.argv[1:]]
        done = subprocess.run(
            [*netns, sys.executable, os.path.abspath(__file__), *inner, "--inside", f"127.0.0.1:{HEAD_PORT}"], env=env
        )
        return done.returncode
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split():
                try:
                    os.kill(int(pid), sig)
                except ProcessLookupError:
                    pass
            time.sleep(2)
        subprocess.run(["ip", "netns", "delete", name])
        shutil.rmtree(temp_dir, ignore_errors=True)


# ------------------------------------------------------------ helpers


def tree_hashes(root: str, suffixes: tuple[str, ...] = (".tar",)) -> dict[str, str]:
    return {
        name: hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(root))
        if name.endswith(suffixes)
    }


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# ------------------------------------------------------------ 1. the engine


def bench_engine(source: str, workdir: str, repeats: int, per_shard: int, address: str) -> dict:
    from shardkit.write.parallel import WriteOptions, write_dataset

    options = {
        "local, 2 workers": WriteOptions(max_samples=per_shard, workers=2),
        "ray, 2 CPUs": WriteOptions(max_samples=per_shard, engine="ray", ray_address=address),
    }
    outputs = {name: os.path.join(workdir, f"engine-{i}") for i, name in enumerate(options)}
    times: dict[str, list[float]] = {name: [] for name in options}
    first_run: dict[str, float] = {}  # the job's first write: Ray starts and warms its workers then
    count = 0
    for repeat in range(repeats + 1):  # the first round is an untimed warm-up
        for name, opts in options.items():
            shutil.rmtree(outputs[name], ignore_errors=True)
            os.sync()
            warm(source)
            started = time.perf_counter()
            count = write_dataset(source, outputs[name], options=opts).manifest.num_samples
            if repeat:
                times[name].append(time.perf_counter() - started)
            else:
                first_run[name] = time.perf_counter() - started
        if repeat:
            print(f"engine repeat {repeat}/{repeats}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()), flush=True)
    first, second = outputs.values()
    identical = tree_hashes(first, (".tar", ".idx", ".json")) == tree_hashes(second, (".tar", ".idx", ".json"))
    rows = {name: {"seconds_median": statistics.median(t), "seconds_all": t, "samples_per_s": count / statistics.median(t),
                   "first_run_s": first_run[name]}
            for name, t in times.items()}
    local, ray_row = rows["local, 2 workers"], rows["ray, 2 CPUs"]
    return {"samples": count, "rows": rows, "identical_bytes": identical,
            "ray_vs_local": ray_row["samples_per_s"] / local["samples_per_s"], "shards_dir": first}


# ------------------------------------------------------------ 2. write_shards vs write_webdataset


def _outputs_have(dest: str) -> dict:
    names = os.listdir(dest)
    manifest = os.path.join(dest, "manifest.json")
    checksums = False
    if os.path.exists(manifest):
        with open(manifest) as f:
            checksums = all("sha256" in s for s in json.load(f)["shards"])
    return {
        "files": sum(n.endswith(".tar") for n in names),
        "manifest": os.path.exists(manifest),
        "checksums": checksums,
        "index": any(n.endswith(".idx") for n in names),
    }


def bench_write(shards_dir: str, workdir: str, repeats: int, per_shard: int) -> dict:
    import ray

    import shardkit.ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds = shardkit.ray.read_shards(shards_dir).materialize()
    rows = ds.count()
    nbytes = ds.size_bytes()
    writers = {
        "shardkit.ray.write_shards": lambda dest: shardkit.ray.write_shards(ds, dest, max_samples=per_shard),
        "Dataset.write_webdataset": lambda dest: ds.write_webdataset(dest, encoder=None),  # bytes as they are
    }
    times: dict[str, list[float]] = {name: [] for name in writers}
    hashes: dict[str, list[dict]] = {name: [] for name in writers}
    have = {}
    for repeat in range(repeats + 1):
        for i, (name, write) in enumerate(writers.items()):
            dest = os.path.join(workdir, f"write-{i}")
            shutil.rmtree(dest, ignore_errors=True)
            seconds = timed(lambda: write(dest))
            if repeat:
                times[name].append(seconds)
            hashes[name].append(tree_hashes(dest))
            have[name] = _outputs_have(dest)
    out = {"rows": rows, "bytes": nbytes, "writers": {}}
    for name in writers:
        median = statistics.median(times[name])
        out["writers"][name] = {
            **have[name],
            "reproducible_bytes": all(h == hashes[name][0] for h in hashes[name]),
            "seconds_median": median,
            "seconds_all": times[name],
            "rows_per_s": rows / median,
            "mb_per_s": nbytes / median / 1e6,
        }
    return out


# ------------------------------------------------------------ 3. read_shards vs read_webdataset


def _consume(ds) -> int:
    return sum(batch.num_rows for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"))


def bench_read(shards_dir: str, repeats: int) -> dict:
    import ray

    import shardkit.ray

    paths = sorted(os.path.join(shards_dir, n) for n in os.listdir(shards_dir) if n.endswith(".tar"))
    readers = {
        "shardkit.ray.read_shards": lambda: shardkit.ray.read_shards(shards_dir),
        "ray.data.read_webdataset(decoder=None)": lambda: ray.data.read_webdataset(paths, decoder=None),
    }
    times: dict[str, list[float]] = {name: [] for name in readers}
    counts = {}
    for repeat in range(repeats + 1):
        for name, make in readers.items():
            warm(shards_dir)
            started = time.perf_counter()
            counts[name] = _consume(make())
            if repeat:
                times[name].append(time.perf_counter() - started)
    rows = {name: {"rows": counts[name], "seconds_median": statistics.median(t), "seconds_all": t,
                   "rows_per_s": counts[name] / statistics.median(t)} for name, t in times.items()}
    ours, theirs = rows.values()
    return {"rows": rows, "ratio": ours["rows_per_s"] / theirs["rows_per_s"]}


# ------------------------------------------------------------ 4. the driver's footprint


def make_jsonl(path: str, num_samples: int) -> None:
    if os.path.exists(path):
        return
    with open(path + ".tmp", "w") as f:
        for i in range(num_samples):
            f.write(f'{{"__key__": "k{i:09d}", "cls": {i % 1000}}}\n')
    os.replace(path + ".tmp", path)


def _plan_only(jsonl: str) -> dict:
    """In a fresh process: scan and plan like the driver does; report peak RSS."""
    from shardkit.write.dry_run import plan_dataset
    from shardkit.write.parallel import WriteOptions

    base = peak_rss_mb()
    started = time.perf_counter()
    plan = plan_dataset(jsonl, options=WriteOptions(format="jsonl", max_samples=10_000, max_bytes=None))
    return {"samples": plan.num_samples, "shards": plan.num_shards, "seconds": time.perf_counter() - started,
            "peak_rss_mb": peak_rss_mb(), "rss_before_mb": base}


def _ray_write(jsonl: str, dest: str, address: str) -> dict:
    """In a fresh process: a real Ray-engine write; report the driver's peak RSS."""
    from shardkit.write.parallel import WriteOptions, write_dataset

    started = time.perf_counter()
    opts = WriteOptions(engine="ray", ray_address=address, max_samples=10_000, max_bytes=None)
    report = write_dataset(jsonl, dest, options=opts)
    return {"samples": report.manifest.num_samples, "shards": report.manifest.num_shards,
            "seconds": time.perf_counter() - started, "peak_rss_mb": peak_rss_mb()}


def _child(kind: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, *args],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def bench_footprint(workdir: str, plan_sizes: list[int], write_size: int, address: str) -> dict:
    plans = []
    for n in plan_sizes:
        jsonl = os.path.join(workdir, f"text-{n}.jsonl")
        make_jsonl(jsonl, n)
        plans.append(_child("plan", jsonl))
        print(f"plan {n}: {plans[-1]}", flush=True)
    jsonl = os.path.join(workdir, f"text-{write_size}.jsonl")
    make_jsonl(jsonl, write_size)
    dest = os.path.join(workdir, "footprint-out")
    shutil.rmtree(dest, ignore_errors=True)
    written = _child("ray-write", jsonl, dest, address)
    shutil.rmtree(dest, ignore_errors=True)
    print(f"ray write {write_size}: {written}", flush=True)
    return {"plan": plans, "ray_write": written}


# ------------------------------------------------------------ report


def table(record: dict) -> str:
    e, w, r, f = record["engine"], record["write"], record["read"], record["footprint"]
    lines = [
        f"Ray benchmark ({record['machine']['cpus']} cores; Ray {record['versions']['ray']}, one node with 2 CPUs in a "
        f"network namespace; median of {record['engine_repeats']} (step 1) and {record['repeats']} (steps 2, 3))",
        "",
        f"1. Writer engines on {e['samples']} JPEGs ({record['images_mb']:.0f} MB), {record['samples_per_shard']} "
        f"per shard; outputs byte-identical: {'yes' if e['identical_bytes'] else 'NO'}",
        "",
        "| engine | seconds | samples/s | vs local | first run of the job, s |",
        "|---|---:|---:|---:|---:|",
    ]
    local_rate = e["rows"]["local, 2 workers"]["samples_per_s"]
    for name, row in e["rows"].items():
        lines.append(f"| {name} | {row['seconds_median']:.2f} | {row['samples_per_s']:.0f} | "
                     f"{row['samples_per_s'] / local_rate:.0%} | {row['first_run_s']:.2f} |")
    lines += ["", f"Connecting the driver to the cluster (ray.init, once per job): {record['connect_s']:.2f} s.", "",
              f"2. Writing the same materialized Ray Dataset ({w['rows']} rows, {w['bytes'] / 1e6:.0f} MB)", "",
              "| writer | seconds | rows/s | MB/s | tar files | manifest | checksums | index | reproducible bytes |",
              "|---|---:|---:|---:|---:|---|---|---|---|"]
    yn = {True: "yes", False: "no"}
    for name, row in w["writers"].items():
        lines.append(f"| {name} | {row['seconds_median']:.2f} | {row['rows_per_s']:.0f} | {row['mb_per_s']:.0f} | "
                     f"{row['files']} | {yn[row['manifest']]} | {yn[row['checksums']]} | {yn[row['index']]} | "
                     f"{yn[row['reproducible_bytes']]} |")
    lines += ["", "3. Reading the shards of step 1 (every row, Arrow batches)", "",
              "| reader | seconds | rows/s |", "|---|---:|---:|"]
    for name, row in r["rows"].items():
        lines.append(f"| {name} | {row['seconds_median']:.2f} | {row['rows_per_s']:.0f} |")
    lines += ["", f"read_shards / read_webdataset: {r['ratio']:.2f}x", "",
              "4. Driver footprint (text-only JSONL inputs, 10,000 per shard; peak RSS of a fresh process)", "",
              "| what | samples | shards | seconds | peak RSS MB |", "|---|---:|---:|---:|---:|"]
    for p in f["plan"]:
        lines.append(f"| scan + plan | {p['samples']:,} | {p['shards']:,} | {p['seconds']:.1f} | {p['peak_rss_mb']:.0f} |")
    rw = f["ray_write"]
    lines.append(f"| Ray-engine write, end to end | {rw['samples']:,} | {rw['shards']:,} | {rw['seconds']:.1f} | "
                 f"{rw['peak_rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [
        ("writer engine (samples/s)", {n: r["samples_per_s"] for n, r in record["engine"]["rows"].items()}),
        ("Ray Dataset -> tar (rows/s)", {n.split(".")[-1]: r["rows_per_s"] for n, r in record["write"]["writers"].items()}),
        ("tar -> Ray Dataset (rows/s)", {n.split("(")[0].split(".")[-1]: r["rows_per_s"] for n, r in record["read"]["rows"].items()}),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (title, values) in zip(axes, parts):
        ax.bar(list(values), list(values.values()), color=["tab:blue", "tab:orange"])
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_inside(args: argparse.Namespace) -> int:
    import ray

    import shardkit
    from gen_images import generate

    os.makedirs(args.workdir, exist_ok=True)
    classes = 100 if args.images >= 1000 else 10
    per_class = args.images // classes
    source = os.path.join(HERE, "work", "writer", f"images-{classes}x{per_class}-{args.target_kb:g}kb")
    if not os.path.isdir(source):  # the set bench_writer.py makes, shared with it
        print(f"generating {classes * per_class} JPEGs in {source} ...", flush=True)
        generate(source + ".tmp", classes=classes, per_class=per_class, target_kb=args.target_kb)
        os.replace(source + ".tmp", source)
    images_bytes = warm(source)

    connect_s = timed(lambda: ray.init(address=args.inside, logging_level="WARNING", log_to_driver=False))
    ray.data.DataContext.get_current().enable_progress_bars = False
    engine = bench_engine(source, args.workdir, args.engine_repeats, args.samples_per_shard, args.inside)
    print(f"engine: ray/local = {engine['ray_vs_local']:.2f}, identical: {engine['identical_bytes']}", flush=True)
    write = bench_write(engine["shards_dir"], args.workdir, args.repeats, args.samples_per_shard)
    print("write:", {n: round(w["rows_per_s"]) for n, w in write["writers"].items()}, flush=True)
    read = bench_read(engine["shards_dir"], args.repeats)
    print(f"read: {read['ratio']:.2f}x", flush=True)
    ray.shutdown()
    footprint = bench_footprint(args.workdir, args.plan_sizes, args.write_size, args.inside)

    out = os.path.join(HERE, "work", "results-quick", "ray.json") if args.quick else os.path.join(HERE, "results", "ray.json")
    record = {
        "benchmark": "ray",
        "command": " ".join([os.path.basename(sys.executable), "bench/bench_ray.py", *args.argv]),
        "machine": machine(),
        "versions": {"shardkit": shardkit.__version__, "ray": ray.__version__},
        "repeats": args.repeats,
        "engine_repeats": args.engine_repeats,
        "images_mb": images_bytes / 1e6,
        "samples_per_shard": args.samples_per_shard,
        "connect_s": connect_s,
        "engine": {k: v for k, v in engine.items() if k != "shards_dir"},
        "write": write,
        "read": read,
        "footprint": footprint,
    }
    text = table(record)
    save_record(out, record, text)
    plot(record, plot_path(out))
    sys.stdout.write("\n" + text)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, *rest = argv[1:]
        result = _plan_only(*rest) if kind == "plan" else _ray_write(*rest)
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--target-kb", type=float, default=110)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine-repeats", type=int, default=5, help="repeats of step 1 (the noisiest)")
    parser.add_argument("--samples-per-shard", type=int, default=SAMPLES_PER_SHARD)
    parser.add_argument("--plan-sizes", type=lambda s: [int(float(x)) for x in s.split(",")], default=[10**6, 10**7])
    parser.add_argument("--write-size", type=int, default=10**6, help="samples of the end-to-end Ray write")
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "ray"))
    parser.add_argument("--quick", action="store_true", help="600 images, 60 per shard, 2 repeats, 10^6-line plan")
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # the cluster's address, once in the namespace
    args = parser.parse_args(argv)
    args.argv = [a for a in argv if a != "--inside" and a != args.inside]
    if args.quick:
        args.images, args.repeats, args.engine_repeats, args.samples_per_shard = 600, 2, 2, 60
        args.plan_sizes, args.write_size = [10**5, 10**6], 10**5
    if args.inside is None:
        return _in_namespace(args)
    return run_inside(args)


if __name__ == "__main__":
    sys.exit(main())
