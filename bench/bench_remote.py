#!/usr/bin/env python3
"""Remote-read benchmark: shardkit over HTTP vs webdataset's curl pipe.

Starts the object-store emulation of ``bench/remote_emulation.sh`` (Debian's
nginx with a per-connection ``limit_rate``, in a network namespace whose veth
end is shaped by ``tc tbf`` to an aggregate cap), serves a synthetic dataset
from it (28 shards of 32 MB: ~8,300 samples of 110 KB, like 8,000 JPEGs) and
reads every sample of it through a DataLoader with 1, 2, 4 and 8
workers, with ``shardkit.ShardDataset`` over ``http://`` in a plain
DataLoader (``shardkit``) and in ``shardkit.make_loader``'s (``make_loader``:
out-of-order delivery, its default), and with
``webdataset.WebDataset`` over the same URLs (which opens each shard with
``curl``). Raw bytes, no decoding, no shuffling: this measures transport.

Reports MB/s (10^6 bytes of shard files per second, first request to last
sample), the fraction of the aggregate cap reached, and shardkit's ratio to
webdataset at the same worker count. Each cell runs ``--repeats`` times (3),
the tools taking turns so that a burst of load on the shared machine hits
both; the table gives each figure's median and the record keeps every run.
Writes ``bench/results/remote.json`` and
``bench/results/remote.md`` and prints the Markdown table.

Needs root (network namespace, tc, apt-get for nginx if missing):

    .venv/bin/python bench/bench_remote.py                 # ~12 minutes, 0.9 GB
    .venv/bin/python bench/bench_remote.py --quick         # smaller dataset
    .venv/bin/python bench/bench_remote.py --url http://host:port   # a server you run
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import shardkit  # noqa: E402
from bench.common import save_record  # noqa: E402
from shardkit.io.base import SourceOptions  # noqa: E402

EMULATION = os.path.join(HERE, "remote_emulation.sh")
MB = 1_000_000


def make_dataset(dest: str, *, num_shards: int, shard_mb: int, sample_kb: int) -> shardkit.Manifest:
    """Random-payload samples (incompressible), ``num_shards`` shards of about ``shard_mb``."""
    manifest_path = os.path.join(dest, "manifest.json")
    per_shard = max(shard_mb * 1024 // sample_kb, 1)
    if os.path.exists(manifest_path):
        manifest = shardkit.load_manifest(dest)
        if manifest.num_shards == num_shards and manifest.shards[0].num_samples == per_shard:
            return manifest
    payload = os.urandom(sample_kb * 1024)
    with shardkit.ShardWriter(dest, max_samples=per_shard, max_bytes=None, overwrite=True) as writer:
        for i in range(num_shards * per_shard):
            # Distinct bytes per sample without generating them all: rotate.
            cut = (i * 7919) % len(payload)
            writer.write({"__key__": f"{i:08d}", "bin": payload[cut:] + payload[:cut], "cls": str(i % 10).encode()})
    return shardkit.load_manifest(dest)


def emulation_up(root: str, per_conn_mbps: int, aggregate_mbps: int) -> str:
    out = subprocess.run(
        ["bash", EMULATION, "up", root, str(per_conn_mbps), str(aggregate_mbps)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def emulation_down() -> None:
    subprocess.run(["bash", EMULATION, "down"], check=False)


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (DataLoader workers,
    and their curl processes)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


#: Samples of the batch whose arrival is timed as the "first batch".
FIRST_BATCH = 64

#: What reads, in the order of the table.
TOOLS = ("shardkit", "make_loader", "webdataset")


def run_loader(dataset: Any, workers: int, *, helper: bool = False) -> tuple[int, int, float, float, float]:
    """Iterate a DataLoader over ``dataset`` (``helper``: the one
    ``shardkit.make_loader`` builds); returns (samples, payload bytes,
    seconds to the first sample, seconds to the first :data:`FIRST_BATCH`
    samples, seconds in all)."""
    from torch.utils.data import DataLoader

    if helper:
        loader = shardkit.make_loader(dataset, num_workers=workers, prefetch_factor=4, persistent_workers=False)
    else:
        loader = DataLoader(dataset, batch_size=None, num_workers=workers, prefetch_factor=4)
    count = nbytes = 0
    first = batch = 0.0
    start = time.perf_counter()
    for sample in loader:
        count += 1
        if count == 1:
            first = time.perf_counter() - start
        if count == FIRST_BATCH:
            batch = time.perf_counter() - start
        nbytes += len(sample["bin"])
    return count, nbytes, first, batch, time.perf_counter() - start


def shardkit_dataset(base_url: str, requests: int | None, part_mib: int | None) -> Any:
    defaults = SourceOptions()
    options = SourceOptions(
        max_concurrent_requests=requests or defaults.max_concurrent_requests,
        part_bytes=(part_mib << 20) if part_mib else defaults.part_bytes,
    )
    return shardkit.ShardDataset(base_url + "/", mode="exact", shuffle=False, source_options=options)


def webdataset_dataset(urls: list[str]) -> Any:
    import webdataset as wds

    return wds.WebDataset(urls, shardshuffle=False, empty_check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "remote"))
    parser.add_argument("--shards", type=int, default=28)
    parser.add_argument("--shard-mb", type=int, default=32)
    parser.add_argument("--sample-kb", type=int, default=110)
    parser.add_argument("--per-conn-mbps", type=int, default=20, help="nginx limit_rate per connection, MiB/s")
    parser.add_argument("--aggregate-mbps", type=int, default=160, help="tc tbf cap for all connections, MB/s")
    parser.add_argument("--requests", type=int, help="shardkit max_concurrent_requests (default: SourceOptions')")
    parser.add_argument("--part-mib", type=int, help="shardkit part_bytes in MiB (default: SourceOptions')")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--url", help="use this server (serving --workdir/data) instead of starting the emulation")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each cell, the tools taking turns; medians reported")
    parser.add_argument("--quick", action="store_true", help="8 shards of 16 MB")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "remote.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.shard_mb = 8, 16
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    load_before = os.getloadavg()[0]  # the box may be shared: say how busy it was
    data_dir = os.path.join(args.workdir, "data")
    manifest = make_dataset(data_dir, num_shards=args.shards, shard_mb=args.shard_mb, sample_kb=args.sample_kb)
    total = manifest.num_bytes
    base = args.url or emulation_up(data_dir, args.per_conn_mbps, args.aggregate_mbps)
    # No cap when we did not start the server, or the emulation could not make
    # its namespace and fell back to 127.0.0.1 (per-connection cap only).
    capped = not args.url and args.aggregate_mbps and "://127.0.0.1:" not in base
    aggregate = args.aggregate_mbps if capped else None
    urls = [f"{base}/{s.path}" for s in manifest.shards]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        for workers in args.workers:
            for _ in range(args.repeats):
                for tool in args.tools:
                    dataset = (
                        webdataset_dataset(urls)
                        if tool == "webdataset"
                        else shardkit_dataset(base, args.requests, args.part_mib)
                    )
                    cpu_before = cpu_seconds()
                    count, payload, first, batch, seconds = run_loader(
                        dataset, workers, helper=tool == "make_loader"
                    )
                    cpu = cpu_seconds() - cpu_before
                    if count != manifest.num_samples:
                        raise SystemExit(f"{tool} with {workers} workers read {count} of {manifest.num_samples} samples")
                    mbps = total / seconds / MB
                    runs.setdefault((tool, workers), []).append(
                        {
                            "seconds": round(seconds, 3),
                            "first_sample_s": round(first, 3),
                            "first_batch_s": round(batch, 3),
                            "MB_per_s": round(mbps, 1),
                            "cpu_s_per_GB": round(cpu / (total / 1e9), 2),
                        }
                    )
                    print(f"{tool:12s} workers={workers}: {mbps:7.1f} MB/s ({seconds:.1f} s, first {FIRST_BATCH} "
                          f"samples {batch:.3f} s)", file=sys.stderr)
    finally:
        if not args.url:
            emulation_down()

    rows = [_median_row(tool, workers, cell, aggregate, manifest.num_samples) for (tool, workers), cell in runs.items()]
    by = {(r["tool"], r["workers"]): r for r in rows}
    for r in rows:
        other = by.get(("webdataset", r["workers"]))
        r["vs_webdataset"] = round(r["MB_per_s"] / other["MB_per_s"], 2) if other else None
    result = {
        "benchmark": "remote",
        "command": "bench/bench_remote.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "setup": {
            "server": "nginx (Debian) in a network namespace behind a veth pair" if not args.url else args.url,
            "per_connection_limit_MiB_per_s": args.per_conn_mbps,
            "aggregate_cap_MB_per_s": aggregate,
            "shards": manifest.num_shards,
            "dataset_MB": round(total / MB, 1),
            "sample_KiB": args.sample_kb,
            "shardkit_requests_per_worker": args.requests or SourceOptions().max_concurrent_requests,
            "shardkit_part_MiB": args.part_mib or SourceOptions().part_bytes >> 20,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1min_before": round(load_before, 2),
        },
        "repeats": args.repeats,
        "rows": rows,
    }
    table = markdown(result)
    save_record(args.out, result, table)
    print(table)
    return 0


def _median_row(tool: str, workers: int, cell: list[dict[str, Any]], aggregate: float | None, samples: int) -> dict[str, Any]:
    """One table row: each figure's median over the cell's runs, and the runs."""
    row: dict[str, Any] = {"tool": tool, "workers": workers}
    for name in ("seconds", "first_sample_s", "first_batch_s", "MB_per_s", "cpu_s_per_GB"):
        row[name] = round(statistics.median(run[name] for run in cell), 3)
    row["fraction_of_cap"] = None if aggregate is None else round(row["MB_per_s"] / aggregate, 3)
    row["samples"] = samples
    row["runs"] = cell
    return row


def markdown(result: dict[str, Any]) -> str:
    setup = result["setup"]
    cap = setup["aggregate_cap_MB_per_s"]
    lines = [
        f"## Remote reads: {setup['dataset_MB']} MB in {setup['shards']} shards over HTTP, "
        f"{setup['per_connection_limit_MiB_per_s']} MiB/s per connection, "
        + (f"{cap} MB/s aggregate cap" if cap else "no aggregate cap"),
        "",
        f"| tool | workers | MB/s | of cap | vs webdataset | first sample (s) | first {FIRST_BATCH} samples (s) "
        "| client CPU s/GB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        frac = "-" if r["fraction_of_cap"] is None else f"{r['fraction_of_cap']:.0%}"
        ratio = "-" if r["vs_webdataset"] is None else f"{r['vs_webdataset']:.2f}x"
        cells = [r["tool"], r["workers"], f"{r['MB_per_s']:.1f}", frac, ratio]
        cells += [f"{r['first_sample_s']:.2f}", f"{r.get('first_batch_s', float('nan')):.2f}", f"{r['cpu_s_per_GB']:.1f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    repeats = result.get("repeats", 1)
    if repeats > 1:
        lines += ["", f"Medians of {repeats} runs per cell, the tools taking turns. Every run, "
                  f"MB/s / first {FIRST_BATCH} samples (s):", ""]
        for r in result["rows"]:
            every = ", ".join(f"{run['MB_per_s']:.1f} / {run['first_batch_s']:.3f}" for run in r["runs"])
            lines.append(f"- {r['tool']}, {r['workers']} workers: {every}")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
