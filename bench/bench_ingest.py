#!/usr/bin/env python3
"""From a table of image URLs to shards: img2dataset against shardkit's downloader + resize.

The same Parquet list of URLs (photo-like JPEGs from tools/gen_photos.py, of
ImageNet size or 1,600x1,200), 10% of them bad (404s, answers that hang past
the timeout, HTML pages served as ``image/jpeg``), is served by the
object-store emulation of ``bench/remote_emulation.sh`` (nginx in a network
namespace of its own, 20 MB/s per connection, no aggregate cap) and a socket
that never answers, as ``bench/ingest_servers.py`` explains. Both tools turn it into tar
shards with images resized so that the shorter side is 256 (keep_ratio), at
the same process and thread counts, and the same timeout and no retries:

- img2dataset (``--output_format webdataset``), from its own virtual
  environment (``--img2dataset PATH``: it pins pandas and webdataset below
  what the project's venv holds);
- shardkit: ``shardkit write urls.parquet OUT --field jpg=url --field
  txt=caption --resize 256`` with ``--workers`` and ``--download-threads``
  set to the same counts, 1,000 samples per shard as img2dataset's run.

Reported per tool: samples/s, CPU seconds per 1,000 images (the tool's
processes, from ``getrusage`` of the children), stored and failed counts
(every row accounted for), and the samples read back with ``ShardDataset``
(img2dataset's output indexed first with ``shardkit index``).

    make bench-ingest   # img2dataset in a venv of its own (.venv-i2d), then this script
    python bench/bench_ingest.py --img2dataset .venv-i2d/bin/img2dataset
    python bench/bench_ingest.py --quick   # 200 ImageNet-size images, 1 process, 8 threads

The servers run in processes of their own (nginx's CPU time is recorded
apart, as ``server_cpu_s``), so their work is counted as neither tool's.
Only when the emulation cannot start (not root, or the script fails) does a
Python server stand in; the record's ``server`` says which one served. Tools
run in sessions of their own: on Ctrl-C or SIGTERM the run's processes are
killed and the servers stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import git_commit, machine, save_record  # noqa: E402
from bench.ingest_servers import URLServers, write_site  # noqa: E402

#: Share of bad URLs, by kind.
BAD_KINDS = (("missing", 0.04), ("hang", 0.03), ("html", 0.03))
#: Timeout both tools get, in seconds (the hanging answers exceed it).
TIMEOUT_S = 3


# --- the inputs ----------------------------------------------------------------


def make_photos(work: str, preset: str, count: int, seed: int = 0) -> str:
    """``count`` photos in a folder of ``work`` (made once per preset and count); returns the folder."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    from gen_photos import photo_jpegs  # noqa: PLC0415

    images = os.path.join(work, f"images-{preset}-{count}")
    if not os.path.isdir(images):
        os.makedirs(images + ".tmp", exist_ok=True)
        for i, data in enumerate(photo_jpegs(preset, count, seed=seed)):
            with open(os.path.join(images + ".tmp", f"{i:06d}.jpg"), "wb") as f:
                f.write(data)
        os.rename(images + ".tmp", images)
    return images


def draw_kinds(count: int, seed: int = 0) -> list[str]:
    """The kind of each row's URL: ``ok`` or one of :data:`BAD_KINDS`, drawn with their shares."""
    rng = random.Random(seed)
    kinds = []
    for _ in range(count):
        roll, kind = rng.random(), "ok"
        for name, share in BAD_KINDS:
            if roll < share:
                kind = name
                break
            roll -= share
        kinds.append(kind)
    return kinds


def write_url_list(work: str, urls: list[str]) -> str:
    """``work/urls.parquet``: one row per URL with a caption; returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"url": urls, "caption": [f"photo number {i}" for i in range(len(urls))]})
    path = os.path.join(work, "urls.parquet")
    pq.write_table(table, path, row_group_size=max(len(urls) // 16, 1))
    return path


# --- the runs ------------------------------------------------------------------


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(command: list[str], *, env: dict[str, str] | None = None, quiet: bool = False) -> None:
    """Run one tool's command in a session of its own. Whatever ends the wait
    (Ctrl-C, SIGTERM) kills the session's processes first, and none outlives
    the run (img2dataset's multiprocessing workers included).

    Raises:
        SystemExit: the tool failed; with the end of its output when ``quiet``.
    """
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE if quiet else None, stderr=subprocess.STDOUT if quiet else None,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate()
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    if process.returncode:
        raise SystemExit(f"{os.path.basename(command[0])} failed (exit {process.returncode}):\n{(output or '')[-2000:]}")


def run_img2dataset(binary: str, parquet: str, out: str, processes: int, threads: int) -> dict:
    cpu, started = _children_cpu_s(), time.monotonic()
    run_tool(
        [
            binary, "--url_list", parquet, "--input_format", "parquet", "--url_col", "url",
            "--caption_col", "caption", "--output_format", "webdataset", "--output_folder", out,
            "--processes_count", str(processes), "--thread_count", str(threads), "--image_size", "256",
            "--resize_mode", "keep_ratio", "--timeout", str(TIMEOUT_S), "--retries", "0",
            "--number_sample_per_shard", "1000", "--distributor", "multiprocessing",
            "--enable_wandb", "False", "--compute_hash", "None",
        ],
        env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"}, quiet=True,
    )  # fmt: skip
    wall, cpu = time.monotonic() - started, _children_cpu_s() - cpu
    failures: Counter = Counter()
    stored = 0
    for name in sorted(os.listdir(out)):
        if name.endswith("_stats.json"):
            with open(os.path.join(out, name)) as f:
                stats = json.load(f)
            stored += stats.get("successes", 0)
            for message, n in stats.get("status_dict", {}).items():
                if message != "success":
                    failures[message[:60]] += n
    return {"wall_s": wall, "cpu_s": cpu, "stored": stored, "failed": dict(failures), "read_back": read_back(out)}


def run_shardkit(parquet: str, out: str, processes: int, threads: int) -> dict:
    """``shardkit write`` of the table, as a user runs it (its own process)."""
    cpu, started = _children_cpu_s(), time.monotonic()
    run_tool(
        [
            sys.executable, "-m", "shardkit", "write", parquet, out, "--field", "jpg=url", "--field", "txt=caption",
            "--resize", "256", "--resize-mode", "keep_ratio", "--image-format", "jpg", "--image-quality", "95",
            "--workers", str(processes), "--download-threads", str(threads), "--max-connections-per-host", str(threads),
            "--connect-timeout", str(TIMEOUT_S), "--read-timeout", str(TIMEOUT_S), "--retries", "0",
            "--max-samples", "1000", "-q",
        ],
    )  # fmt: skip
    wall, cpu = time.monotonic() - started, _children_cpu_s() - cpu
    from shardkit.format.manifest import load_manifest, skip_category

    manifest = load_manifest(out)
    failures = Counter(skip_category(item.reason) for item in manifest.skipped)
    return {"wall_s": wall, "cpu_s": cpu, "stored": manifest.num_samples, "failed": dict(failures),
            "read_back": read_back(out)}  # fmt: skip


def read_back(folder: str) -> int:
    """Samples with a ``jpg`` read back with ``ShardDataset`` (a folder without a
    manifest, img2dataset's, is indexed first with ``shardkit index``)."""
    import shardkit

    if not os.path.exists(os.path.join(folder, "manifest.json")):
        subprocess.run([sys.executable, "-m", "shardkit", "index", folder, "-q"], check=True)
    return sum("jpg" in sample for sample in shardkit.ShardDataset(folder, shuffle=False))


# --- the report ----------------------------------------------------------------


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the upper one of an even count)."""
    return sorted(runs, key=lambda run: run["wall_s"])[len(runs) // 2]


def table_markdown(record: dict) -> str:
    server = record.get("server", {})
    lines = [
        f"# bench_ingest: {record['preset']}, {record['count']} URLs ({record['bad']} bad), "
        f"{record['processes']} processes x {record['threads']} threads, {record['per_connection_mbps']} MB/s per connection",
        "",
    ]
    if server:
        lines += [
            f"Served by {server['how']}: {server['per_connection_mbps']} MB/s per connection "
            f"(measured {server['per_connection_measured_mbps']:.1f} MB/s, one connection), no aggregate cap; "
            f"hanging URLs: {server['hang']}. Load average before the runs: {record['load_before']:.2f}"
            + (f", after: {record['load_after']:.2f}" if "load_after" in record else "") + ".",
            "",
        ]
    lines += [
        "| tool | samples/s | CPU s / 1000 images | stored | failed (by reason) | read back | server CPU s |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for tool, run in record["runs"].items():
        rate = run["stored"] / run["wall_s"] if run["wall_s"] else 0.0
        per_1000 = 1000 * run["cpu_s"] / max(record["count"], 1)
        failed = ", ".join(f"{k} {v}" for k, v in sorted(run["failed"].items()))
        server_cpu = f"{run['server_cpu_s']:.1f}" if "server_cpu_s" in run else ""
        lines.append(
            f"| {tool} | {rate:.1f} | {per_1000:.1f} | {run['stored']} | {failed} | {run['read_back']} | {server_cpu} |"
        )
    every = record.get("every_run", {})
    if every:
        lines += ["", f"Median of {record['repeats']} runs per tool, the tools taking turns; samples/s of every run:"]
        lines += [f"- {tool}: " + ", ".join(f"{r['stored'] / r['wall_s']:.1f}" for r in done) for tool, done in every.items()]
    runs = record["runs"]
    if {"shardkit", "img2dataset"} <= set(runs):
        sk, i2d = (runs[t]["stored"] / runs[t]["wall_s"] for t in ("shardkit", "img2dataset"))
        lines += ["", f"shardkit / img2dataset, samples/s of the medians: **{sk / i2d:.2f}x**"]
    return "\n".join(lines) + "\n"


def plot(json_paths: list[str], png: str) -> None:
    """Samples/s and CPU s per 1,000 images of each tool, one group per saved run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = []
    for path in json_paths:
        with open(path) as f:
            records.append(json.load(f))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    tools = sorted({tool for r in records for tool in r["runs"]})
    width = 0.8 / max(len(tools), 1)
    for axis, (label, value) in zip(axes, [
        ("stored samples/s", lambda r, run: run["stored"] / run["wall_s"]),
        ("CPU s per 1,000 URLs", lambda r, run: 1000 * run["cpu_s"] / r["count"]),
    ]):  # fmt: skip
        for t, tool in enumerate(tools):
            xs = [i + t * width for i, r in enumerate(records) if tool in r["runs"]]
            ys = [value(r, r["runs"][tool]) for r in records if tool in r["runs"]]
            axis.bar(xs, ys, width, label=tool)
        axis.set_xticks([i + width * (len(tools) - 1) / 2 for i in range(len(records))])
        axis.set_xticklabels([f"{r['preset']}\n{r['count']} URLs, {r['processes']}x{r['threads']}" for r in records])
        axis.set_title(label)
        axis.legend()
    fig.suptitle("URL table to shards, resize 256 (10% bad URLs), shared 2-core machine")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:  # plot PNG JSON...
        plot(argv[2:], argv[1])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=("imagenet", "highres"), default="highres")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--per-connection-mbps", type=float, default=20.0)
    parser.add_argument("--python-server", action="store_true",
                        help="serve from the Python server even where the emulation could start (to compare)")  # fmt: skip
    parser.add_argument("--img2dataset", help="the img2dataset command of its own venv (skipped when not given)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardkit-bench-ingest"))
    parser.add_argument("--out", default="bench/results/ingest.json")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each tool, taking turns; the median is reported")
    parser.add_argument("--quick", action="store_true", help="200 ImageNet-size images, 1 process, 8 threads")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.count, args.processes, args.threads, args.repeats = "imagenet", 200, 1, 8, 1
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    os.makedirs(args.work, exist_ok=True)
    # SIGTERM ends the run as Ctrl-C does: tools killed, servers stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    images_dir = make_photos(args.work, args.preset, args.count)
    kinds = draw_kinds(args.count)
    site = write_site(args.work, images_dir, [row for row, kind in enumerate(kinds) if kind == "html"])
    load_before = os.getloadavg()[0]
    with URLServers(site, args.per_connection_mbps, emulation=not args.python_server) as servers:
        if kinds.count("hang") > servers.hang.capacity:
            raise SystemExit(f"{kinds.count('hang')} hanging URLs, more than the listener's queue holds")
        urls = [servers.url(kind, row) for row, kind in enumerate(kinds)]
        parquet = write_url_list(args.work, urls)
        server = servers.describe()
        server["per_connection_measured_mbps"] = servers.measure_per_connection(
            [url for url, kind in zip(urls, kinds) if kind == "ok"][:8]
        )
        tools = [("shardkit", lambda out: run_shardkit(parquet, out, args.processes, args.threads))]
        if args.img2dataset:
            tools.insert(0, ("img2dataset", lambda out: run_img2dataset(args.img2dataset, parquet, out, args.processes, args.threads)))
        every: dict[str, list[dict]] = {name: [] for name, _ in tools}
        for _ in range(args.repeats):  # the tools take turns, so a burst of load hits both
            for name, run in tools:
                out = os.path.join(args.work, f"out-{name}")
                shutil.rmtree(out, ignore_errors=True)
                servers.renew()
                server_cpu = servers.cpu_s()
                every[name].append(run(out))
                every[name][-1]["server_cpu_s"] = servers.cpu_s() - server_cpu
        runs = {name: median_run(done) for name, done in every.items()}
    record = {
        "benchmark": "ingest", "machine": machine(), "commit": git_commit(), "preset": args.preset,
        "count": args.count, "bad": args.count - kinds.count("ok"), "bad_by_kind": dict(Counter(kinds)),
        "processes": args.processes, "threads": args.threads, "per_connection_mbps": args.per_connection_mbps,
        "timeout_s": TIMEOUT_S, "load_before": load_before, "load_after": os.getloadavg()[0], "server": server,
        "repeats": args.repeats, "runs": runs, "every_run": every,
    }  # fmt: skip
    table = table_markdown(record)
    save_record(args.out, record, table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("bench_ingest: interrupted; the tools' processes killed, the servers stopped", file=sys.stderr)
        raise SystemExit(130) from None
