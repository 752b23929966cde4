#!/usr/bin/env python3
"""Remote-read benchmark: shardkit over HTTP or s3:// vs webdataset's curl or aws-cli pipe.

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

With ``--scheme s3`` the same nginx poses as S3: it serves the dataset's
folder as the bucket ``data`` path-style (``/data/KEY``, Range honoured;
the request signature is not checked), shardkit reads ``s3://data/`` with
``SourceOptions(s3_endpoint_url=...)`` and throwaway credentials in the
environment (boto3's standard configuration), and webdataset reads in two
forms: ``pipe:aws s3 cp --endpoint-url ... s3://data/KEY -``, the form its
documentation gives for S3 (one AWS CLI process per shard, ``webdataset``),
and ``s3://data/KEY`` through an opener that streams boto3's GetObject body
(``webdataset_boto3``; see :func:`open_s3_with_boto3`). The record goes to
``bench/results/remote-s3.{json,md,png}``.

Reports MB/s (10^6 bytes of shard files per second, first request to last
sample), the fraction of the aggregate cap reached, and shardkit's ratio to
webdataset at the same worker count (over s3://, webdataset's better form
there: the AWS CLI pipe, or ``webdataset_boto3``, an opener registered for
``s3://`` that streams boto3's GetObject body, one client per worker). Each cell runs ``--repeats`` times (3),
the tools taking turns so that a burst of load on the shared machine hits
both; the table gives each figure's median and the record keeps every run.
Writes ``bench/results/remote.json``,
``bench/results/remote.md`` and ``bench/results/remote.png`` and prints the Markdown table.

Needs root (network namespace, tc, apt-get for nginx if missing):

    .venv/bin/python bench/bench_remote.py                 # ~12 minutes, 0.9 GB
    .venv/bin/python bench/bench_remote.py --quick         # smaller dataset
    .venv/bin/python bench/bench_remote.py --url http://host:port   # a server you run
    .venv/bin/python bench/bench_remote.py --scheme s3     # nginx posing as S3, ~15 minutes
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
from bench.common import git_commit, plot_path, save_record  # noqa: E402
from shardkit.io.base import SourceOptions  # noqa: E402

EMULATION = os.path.join(HERE, "remote_emulation.sh")
MB = 1_000_000
#: The bucket the emulation serves over ``--scheme s3``: the dataset's folder, path-style.
BUCKET = "data"
#: What boto3 and the AWS CLI are given against the emulation, whose nginx
#: checks no signature: throwaway values, never real credentials.
EMULATION_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "shardkit-bench",
    "AWS_SECRET_ACCESS_KEY": "shardkit-bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


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

#: What reads, in the order of the table; ``webdataset_boto3`` over s3:// only.
TOOLS = ("shardkit", "make_loader", "webdataset", "webdataset_boto3")


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


def shardkit_dataset(
    dataset_url: str, requests: int | None, part_mib: int | None, s3_endpoint_url: str | None = None
) -> Any:
    defaults = SourceOptions()
    options = SourceOptions(
        max_concurrent_requests=requests or defaults.max_concurrent_requests,
        part_bytes=(part_mib << 20) if part_mib else defaults.part_bytes,
        s3_endpoint_url=s3_endpoint_url,
    )
    return shardkit.ShardDataset(dataset_url + "/", mode="exact", shuffle=False, source_options=options)


def webdataset_dataset(urls: list[str]) -> Any:
    import webdataset as wds

    return wds.WebDataset(urls, shardshuffle=False, empty_check=False)


_wds_clients: dict[tuple[int, str | None], Any] = {}


def boto3_s3_client() -> Any:
    """A boto3 S3 client of this process, made on first use from boto3's own
    configuration (``AWS_ENDPOINT_URL`` and the credentials in the
    environment): what webdataset's and wids' s3:// handlers here share;
    one per endpoint, and never across a fork (a client's connection pool
    is not)."""
    import boto3

    key = (os.getpid(), os.environ.get("AWS_ENDPOINT_URL"))
    client = _wds_clients.get(key)
    if client is None:
        client = _wds_clients[key] = boto3.session.Session().client("s3")
    return client


def open_s3_with_boto3(url: str, mode: str = "rb", bufsize: int = 8192) -> Any:
    """webdataset's opener for ``s3://`` in the ``webdataset_boto3`` runs:
    GetObject's streaming body, one boto3 client per process (what a user
    registers in ``webdataset.gopen.gopen_schemes`` instead of a CLI pipe)."""
    client = boto3_s3_client()
    bucket, _, key = url.split("://", 1)[1].partition("/")
    return client.get_object(Bucket=bucket, Key=key)["Body"]


def webdataset_urls(scheme: str, base: str, paths: list[str], s3_endpoint_url: str | None) -> list[str]:
    """The shards as webdataset opens them: ``http://`` (its curl pipe), or
    for S3 the AWS CLI streaming each object to stdout."""
    if scheme == "http" or s3_endpoint_url is None:  # s3:// as it is: open_s3_with_boto3
        return [f"{base}/{path}" for path in paths]
    endpoint = f"--endpoint-url {s3_endpoint_url} " if s3_endpoint_url else ""
    return [f"pipe:aws s3 cp {endpoint}--quiet {base}/{path} -" for path in paths]


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
    parser.add_argument("--tools", nargs="+", choices=TOOLS, help="default: all (webdataset_boto3 over s3 only)")
    parser.add_argument("--scheme", choices=("http", "s3"), default="http",
                        help="read over http:// or s3:// (nginx posing as S3, the bucket 'data')")
    parser.add_argument("--url", help="use this server (serving --workdir/data; for s3, the S3 endpoint whose "
                        "bucket 'data' holds it) instead of starting the emulation")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each cell, the tools taking turns; medians reported")
    parser.add_argument("--quick", action="store_true", help="8 shards of 16 MB")
    parser.add_argument("--out", help="record path (default bench/results/remote.json, remote-s3.json for s3)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = os.path.join(HERE, "results", "remote.json" if args.scheme == "http" else "remote-s3.json")
    if args.quick:
        args.shards, args.shard_mb = 8, 16
    if args.tools is None:
        args.tools = [t for t in TOOLS if args.scheme == "s3" or t != "webdataset_boto3"]
    if args.scheme == "http" and "webdataset_boto3" in args.tools:
        parser.error("webdataset_boto3 reads s3:// only: add --scheme s3")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    load_before = os.getloadavg()[0]  # the box may be shared: say how busy it was
    data_dir = os.path.join(args.workdir, "data")
    manifest = make_dataset(data_dir, num_shards=args.shards, shard_mb=args.shard_mb, sample_kb=args.sample_kb)
    total = manifest.num_bytes
    # Over S3 nginx serves the dataset's parent folder: the dataset is the bucket BUCKET.
    served = data_dir if args.scheme == "http" else args.workdir
    server = args.url or emulation_up(served, args.per_conn_mbps, args.aggregate_mbps)
    # No cap when we did not start the server, or the emulation could not make
    # its namespace and fell back to 127.0.0.1 (per-connection cap only).
    capped = not args.url and args.aggregate_mbps and "://127.0.0.1:" not in server
    aggregate = args.aggregate_mbps if capped else None
    s3_endpoint = server if args.scheme == "s3" else None
    base = server if args.scheme == "http" else f"s3://{BUCKET}"
    if args.scheme == "s3" and not args.url:
        os.environ.update(EMULATION_AWS_ENV)  # before any worker or aws process starts
    paths = [s.path for s in manifest.shards]
    urls = webdataset_urls(args.scheme, base, paths, s3_endpoint)
    if s3_endpoint:
        # boto3's own configuration reaches the endpoint (forked workers inherit it).
        os.environ["AWS_ENDPOINT_URL"] = s3_endpoint
        import importlib

        # The module, not the function webdataset's __init__ exports under the same name.
        importlib.import_module("webdataset.gopen").gopen_schemes["s3"] = open_s3_with_boto3
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        for workers in args.workers:
            for _ in range(args.repeats):
                for tool in args.tools:
                    if tool == "webdataset":
                        dataset = webdataset_dataset(urls)
                    elif tool == "webdataset_boto3":
                        dataset = webdataset_dataset(webdataset_urls(args.scheme, base, paths, None))
                    else:
                        dataset = shardkit_dataset(base, args.requests, args.part_mib, s3_endpoint)
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
    compare_with_webdataset(rows)
    result = {
        "benchmark": "remote",
        "command": "bench/bench_remote.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "setup": {
            "scheme": args.scheme,
            "server": "nginx (Debian) in a network namespace behind a veth pair" if not args.url else args.url,
            "webdataset_opens": urls[0],
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
    plot(result, plot_path(args.out))
    print(table)
    return 0


def compare_with_webdataset(rows: list[dict[str, Any]]) -> None:
    """Give each row ``vs_webdataset`` (its MB/s over webdataset's) and
    ``first_batch_vs_webdataset`` (its first-batch seconds over webdataset's),
    against webdataset's best form at the row's worker count: the fastest
    and the quickest to its first batch of the ``webdataset*`` rows (over
    s3://, the CLI pipe and the boto3 opener); None without one."""
    for r in rows:
        peers = [p for p in rows if p["tool"].startswith("webdataset") and p["workers"] == r["workers"]]
        fastest = max(peers, key=lambda p: p["MB_per_s"], default=None)
        quickest = min(peers, key=lambda p: p["first_batch_s"], default=None)
        r["vs_webdataset"] = round(r["MB_per_s"] / fastest["MB_per_s"], 2) if fastest else None
        r["first_batch_vs_webdataset"] = round(r["first_batch_s"] / quickest["first_batch_s"], 2) if quickest else None


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
        f"## Remote reads: {setup['dataset_MB']} MB in {setup['shards']} shards over "
        + ("s3:// (nginx posing as S3; webdataset through the AWS CLI), " if setup.get("scheme") == "s3" else "HTTP, ")
        + f"{setup['per_connection_limit_MiB_per_s']} MiB/s per connection, "
        + (f"{cap} MB/s aggregate cap" if cap else "no aggregate cap"),
        "",
        f"| tool | workers | MB/s | of cap | vs webdataset | first sample (s) | first {FIRST_BATCH} samples (s) "
        "| its time / webdataset's | client CPU s/GB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        frac = "-" if r["fraction_of_cap"] is None else f"{r['fraction_of_cap']:.0%}"
        ratio = "-" if r["vs_webdataset"] is None else f"{r['vs_webdataset']:.2f}x"
        first_ratio = "-" if r.get("first_batch_vs_webdataset") is None else f"{r['first_batch_vs_webdataset']:.2f}"
        cells = [r["tool"], r["workers"], f"{r['MB_per_s']:.1f}", frac, ratio]
        cells += [f"{r['first_sample_s']:.2f}", f"{r.get('first_batch_s', float('nan')):.2f}", first_ratio]
        cells += [f"{r['cpu_s_per_GB']:.1f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "vs webdataset: MB/s over webdataset's at the same worker count; its time / webdataset's: "
              f"seconds to the first {FIRST_BATCH} samples over webdataset's (below 1 is sooner). Over s3:// "
              "both take webdataset's better form at that count: the AWS CLI pipe or a boto3 opener."]
    repeats = result.get("repeats", 1)
    if repeats > 1:
        lines += ["", f"Medians of {repeats} runs per cell, the tools taking turns. Every run, "
                  f"MB/s / first {FIRST_BATCH} samples (s):", ""]
        for r in result["rows"]:
            every = ", ".join(f"{run['MB_per_s']:.1f} / {run['first_batch_s']:.3f}" for run in r["runs"])
            lines.append(f"- {r['tool']}, {r['workers']} workers: {every}")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """MB/s and seconds to the first batch against workers, one line per tool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for tool in dict.fromkeys(r["tool"] for r in result["rows"]):
        rows = sorted((r for r in result["rows"] if r["tool"] == tool), key=lambda r: r["workers"])
        xs = [r["workers"] for r in rows]
        left.plot(xs, [r["MB_per_s"] for r in rows], marker="o", label=tool)
        right.plot(xs, [r["first_batch_s"] for r in rows], marker="o", label=tool)
    cap = result["setup"]["aggregate_cap_MB_per_s"]
    if cap:
        left.axhline(cap, color="grey", linestyle="--", linewidth=1, label="cap")
    scheme = result["setup"].get("scheme", "http")
    left.set(xscale="log", xlabel="DataLoader workers", ylabel="MB/s over the epoch", title=f"Throughput ({scheme})")
    right.set(xscale="log", xlabel="DataLoader workers", ylabel="seconds",
              title=f"First {FIRST_BATCH} samples ({scheme}), worker start-up included")
    for ax in (left, right):
        ax.set_xticks(sorted({r["workers"] for r in result["rows"]}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
