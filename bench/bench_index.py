#!/usr/bin/env python3
"""``shardkit index`` (issue #27) against wids' ``widsindex`` and against resharding with ``shardkit write``.

**Real shards.** ``webdataset.ShardWriter`` writes ``--samples`` samples of
JPEG-size payloads (``--payload`` bytes of random data as ``jpg``, a class
as ``cls``, a JSON line) in shards of ``--per-shard`` samples, with
img2dataset-style ``NNNNN.parquet`` sidecars beside them. On those same
shards, each tool runs once the page cache holds them (every tool and the
baseline read the same bytes, first with these files evicted from the page
cache before each run (cold: the disk), then hot):

* ``cat SHARDS > /dev/null``: the plain sequential read of the same bytes;
* ``shardkit index SRC --out IDX`` with 1 and with N workers (a subprocess,
  so its peak RSS is the driver's own: the pool's workers are other processes);
* ``widsindex create SHARDS`` (wids: one process, MD5 + a tar scan per shard);
* ``shardkit write SRC DEST --format tar`` (resharding: copies every byte);

then the first epoch read afterwards (``ShardDataset(mode="exact")``, 0
DataLoader workers) over the index and over the resharded copy.

**Many shards.** ``--shards N`` (100,000) names hard-linked to a few tiny real
shards (at most 65,000 links per file): ``shardkit index`` at 1,000, 10,000
and N shards, to show the driver's memory flat in the shard count; a rerun
(nothing changed: listing and stat only); ``widsindex`` on the first
``--wids-shards`` of them (its rate; the whole would take long).

**Object store.** The real shards served by the emulation of
``bench/remote_emulation.sh`` (root only): ``shardkit index`` over http with
1, N and 4 workers, ``widsindex create`` over the same URLs, then the first
epoch read over http.

``--only SECTION...`` runs some of ``real``, ``disk``, ``many``, ``remote``
and keeps the others from the existing record (each marked with the commit
it was measured at).

Writes ``bench/results/index.json`` / ``.md`` / ``.png``::

    .venv/bin/python bench/bench_index.py                  # ~300 MB + 100,000 shards, a few minutes
    .venv/bin/python bench/bench_index.py --quick
    .venv/bin/python bench/bench_index.py --only remote many   # the object store and the driver's memory
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.bench_reader import evict  # noqa: E402
from bench.common import git_commit, machine, plot_path, save_record  # noqa: E402

RESULT = os.path.join(HERE, "results", "index.json")
#: Most hard links one file gets (ext4 allows 65,000).
MAX_LINKS = 60_000

#: Runs index_dataset in a fresh process and prints its figures as JSON, with
#: the driver's own peak RSS (VmHWM: pool workers are other processes, and
#: unlike ru_maxrss it does not inherit the forking parent's peak), its peak
#: anonymous memory (sampled), and at the end anonymous and file-backed RSS.
_INDEX_CHILD = """
import json, sys, threading, time
from shardkit import IndexOptions, index_dataset

def status(field):
    with open("/proc/self/status") as f:
        return [int(l.split()[1]) / 1024 for l in f if l.startswith(field)][0]

peak_anon, done = [0.0], threading.Event()

def sample():  # the kernel keeps no peak of anonymous memory alone: sampled every 2 ms
    while not done.wait(0.002):
        peak_anon[0] = max(peak_anon[0], status("RssAnon:"))

threading.Thread(target=sample, daemon=True).start()
src, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
report = index_dataset(src, out=out, options=IndexOptions(workers=workers))
seconds = time.perf_counter() - start
done.set()
print(json.dumps({
    "seconds": seconds, "shards": report.manifest.num_shards, "samples": report.manifest.num_samples,
    "bytes": report.manifest.num_bytes, "bytes_read": report.bytes_read, "read": report.num_indexed,
    "unchanged": report.num_unchanged, "skipped": len(report.skipped),
    "driver_peak_rss_mb": status("VmHWM:"), "driver_peak_anon_mb": max(peak_anon[0], status("RssAnon:")),
    "driver_end_anon_mb": status("RssAnon:"), "driver_end_file_mb": status("RssFile:"),
}))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_index(src: str, out: str, workers: int, **kwargs) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    return rerun_index(src, out, workers, **kwargs)


def rerun_index(src: str, out: str, workers: int, **kwargs) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _INDEX_CHILD, src, out, str(workers)],
        capture_output=True, text=True, env=_env(), check=True, **kwargs,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def timed(command: list[str], **kwargs) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    return time.perf_counter() - start


def cat_seconds(shards: list[str], *, cold: bool = False) -> float:
    best = float("inf")
    for _ in range(3):
        if cold:
            evict(os.path.dirname(shards[0]))
        start = time.perf_counter()
        with open(os.devnull, "wb") as sink:
            subprocess.run(["cat", *shards], stdout=sink, check=True)
        best = min(best, time.perf_counter() - start)
    return best


def on_disk(src: str, work: str, workers: int, profile_name: str) -> dict:
    """``cat`` and ``shardkit index`` of the shards placed on an emulated
    disk (``bench/profiles``: root only), each run cold and inside the
    profile's throttled cgroup: the "plain sequential read of the same
    bytes on local disk" the index is compared with."""
    from bench.profiles import mounted

    with mounted(profile_name, os.path.join(work, "profile")) as profile:
        placed = profile.place("src", src)
        profile.start()
        shards = sorted(os.path.join(placed, n) for n in os.listdir(placed) if n.endswith(".tar"))
        rows = {}
        profile.cold()
        rows["cat > /dev/null"] = {"seconds": timed(["cat", *shards], preexec_fn=profile.join), "workers": 1}
        for w in sorted({1, workers}):
            profile.cold()
            res = run_index(placed, os.path.join(work, "idx-disk"), w, preexec_fn=profile.join)
            rows[f"shardkit index, {w} worker{'s' if w > 1 else ''}"] = {
                "seconds": res["seconds"], "workers": w, "driver_peak_rss_mb": res["driver_peak_rss_mb"]
            }
        total = sum(os.path.getsize(x) for x in shards)
        for row in rows.values():
            row["gb_s"] = total / row["seconds"] / 1e9
        return {"profile": profile_name, "description": profile.spec.description, "rows": rows}


def widsindex_seconds(shards: list[str], work: str) -> float:
    """``widsindex create`` over ``shards`` (names from stdin; URLs it
    downloads with ``curl`` one at a time), in ``work``."""
    widsindex = os.path.join(os.path.dirname(sys.executable), "widsindex")
    start = time.perf_counter()
    subprocess.run(
        [widsindex, "create", "-", "-o", os.path.join(work, "wids.json"), "-n", ""],
        input="\n".join(shards).encode(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work,
    )
    return time.perf_counter() - start


def epoch_seconds(dataset: str) -> tuple[float, int]:
    from shardkit import ShardDataset

    start = time.perf_counter()
    n = sum(1 for _ in ShardDataset(dataset, mode="exact", shuffle=False))
    return time.perf_counter() - start, n


def write_real(src: str, *, samples: int, per_shard: int, payload: int) -> list[str]:
    import webdataset

    os.makedirs(src)
    with webdataset.ShardWriter(os.path.join(src, "%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(samples):
            sink.write({"__key__": f"{i:09d}", "jpg": os.urandom(payload), "cls": str(i % 1000).encode(),
                        "json": json.dumps({"key": f"{i:09d}", "width": 500, "height": 375}).encode()})
    shards = sorted(os.path.join(src, n) for n in os.listdir(src) if n.endswith(".tar"))
    for n in range(len(shards)):  # img2dataset's sidecars: ignored by `index`
        with open(os.path.join(src, f"{n:05d}.parquet"), "wb") as f:
            f.write(b"PAR1")
    return shards


def write_many(folder: str, *, num_shards: int, real: int) -> list[str]:
    """``num_shards`` names hard-linked to ``real`` tiny webdataset shards."""
    import webdataset

    seeds = os.path.join(folder, "seeds")
    many = os.path.join(folder, "many")
    os.makedirs(seeds)
    os.makedirs(many)
    real = max(real, -(-num_shards // MAX_LINKS))
    bases = []
    for r in range(real):
        path = os.path.join(seeds, f"seed-{r}.tar")
        with webdataset.TarWriter(path) as sink:
            for i in range(4):
                sink.write({"__key__": f"s{r}_{i}", "jpg": os.urandom(2000), "cls": b"1"})
        bases.append(path)
    names = []
    for n in range(num_shards):
        name = os.path.join(many, f"{n:06d}.tar")
        os.link(bases[n % real], name)
        names.append(name)
    return names


SECTIONS = ("real", "disk", "many", "remote")


def index_row(rows: dict, name: str, suffix: str, src: str, out: str, workers: int, args: argparse.Namespace) -> None:
    """``shardkit index SRC --out OUT`` with ``workers``, as the row ``NAME, N workers SUFFIX``."""
    res = run_index(src, out, workers)
    assert res["samples"] == args.samples and res["skipped"] == 0, res
    rows[f"{name}, {workers} worker{'s' if workers > 1 else ''}{suffix}"] = {
        "seconds": res["seconds"], "workers": workers, "driver_peak_rss_mb": res["driver_peak_rss_mb"]
    }


def run_real(record: dict, args: argparse.Namespace, work: str, src: str, shards: list[str]) -> None:
    total = sum(os.path.getsize(s) for s in shards)
    rows = {}
    for cold in (True, False):  # cold: these files evicted from the page cache before each run
        temperature = "cold" if cold else "hot"
        rows[f"cat > /dev/null ({temperature})"] = {"seconds": cat_seconds(shards, cold=cold), "workers": 1}
        for workers in sorted({1, args.workers}):
            if cold:
                evict(src)
            index_row(rows, "shardkit index", f" ({temperature})", src, os.path.join(work, "idx"), workers, args)
    wids_work = os.path.join(work, "wids")
    os.makedirs(wids_work)
    rows["widsindex create (hot)"] = {"seconds": widsindex_seconds(shards, wids_work), "workers": 1}
    for workers in sorted({1, args.workers}):
        dest = os.path.join(work, f"resharded-{workers}")
        seconds = timed(
            [sys.executable, "-m", "shardkit", "write", src, dest, "--format", "tar", "--no-shuffle",
             "--workers", str(workers), "-q"],
            env=_env(),
        )
        rows[f"shardkit write (reshard), {workers} worker{'s' if workers > 1 else ''} (hot)"] = {
            "seconds": seconds, "workers": workers
        }
    for row in rows.values():
        row["shards_s"] = len(shards) / row["seconds"]
        row["gb_s"] = total / row["seconds"] / 1e9
        row["gb_s_per_worker"] = row["gb_s"] / row["workers"]
    epoch_index, n1 = epoch_seconds(os.path.join(work, "idx"))
    epoch_copy, n2 = epoch_seconds(os.path.join(work, f"resharded-{args.workers}"))
    assert n1 == n2 == args.samples
    record["real"] = {
        "shards": len(shards), "samples": args.samples, "bytes": total, "payload_bytes": args.payload,
        "rows": rows,
        "first_epoch_s": {"on the index": epoch_index, "on the resharded copy": epoch_copy},
    }
    shutil.rmtree(os.path.join(work, "resharded-1"), ignore_errors=True)
    shutil.rmtree(os.path.join(work, f"resharded-{args.workers}"), ignore_errors=True)


def run_many(record: dict, args: argparse.Namespace, work: str) -> None:
    """``shardkit index`` at 10^3, 10^4 and ``--shards`` hard-linked shards: the driver's memory."""
    names = write_many(os.path.join(work, "m"), num_shards=args.shards, real=4)
    many = os.path.dirname(names[0])
    smaller = {}
    for count in (1000, 10_000):
        if count < args.shards:
            folder = os.path.join(work, "m", f"first-{count}")
            os.makedirs(folder)
            for name in names[:count]:
                os.link(name, os.path.join(folder, os.path.basename(name)))
            smaller[count] = run_index(folder, os.path.join(work, f"idx-{count}"), args.workers)
            shutil.rmtree(os.path.join(work, f"idx-{count}"))
    at_n = run_index(many, os.path.join(work, "idx-n"), args.workers)
    again = rerun_index(many, os.path.join(work, "idx-n"), args.workers)
    assert at_n["shards"] == args.shards and again["read"] == 0, (at_n, again)
    shutil.rmtree(os.path.join(work, "idx-n"))
    wids_work = os.path.join(work, "wids-many")
    os.makedirs(wids_work)
    wids_s = widsindex_seconds(names[: args.wids_shards], wids_work)
    record["many"] = {
        "shards": args.shards,
        "shard_bytes": os.path.getsize(names[0]),
        **{f"index_{count // 1000}k": res for count, res in smaller.items()},
        "index_n": at_n,
        "rerun_n": again,
        "shardkit_shards_s": args.shards / at_n["seconds"],
        "rerun_shards_s": args.shards / again["seconds"],
        "widsindex_shards": args.wids_shards,
        "widsindex_shards_s": args.wids_shards / wids_s,
    }
    shutil.rmtree(os.path.join(work, "m"), ignore_errors=True)


def run_remote(record: dict, args: argparse.Namespace, work: str, src: str, shards: list[str]) -> None:
    """The same shards served by the object-store emulation of
    ``bench/remote_emulation.sh`` (nginx, ``--per-conn-mbps`` per connection,
    ``--aggregate-mbps`` for all, in a network namespace): ``shardkit index``
    over http (a brace pattern: an http folder cannot be listed) into a
    local ``--out``, ``widsindex create`` over the same URLs (it downloads
    each with curl, one at a time), then the first epoch read over http."""
    from bench.bench_remote import emulation_down, emulation_up

    if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split().count("skremote"):
        raise SystemExit("the remote emulation is up already (another benchmark is using it); try again later")
    total = sum(os.path.getsize(s) for s in shards)
    base = emulation_up(src, args.per_conn_mbps, args.aggregate_mbps)
    capped = "://127.0.0.1:" not in base
    try:
        width = len(os.path.basename(shards[0])) - len(".tar")
        pattern = f"{base}/{{{0:0{width}d}..{len(shards) - 1:0{width}d}}}.tar"
        urls = [f"{base}/{os.path.basename(s)}" for s in shards]
        rows = {}
        for workers in sorted({1, args.workers, 4}):
            index_row(rows, "shardkit index over http", "", pattern, os.path.join(work, "idx-http"), workers, args)
        wids_work = os.path.join(work, "wids-http")
        os.makedirs(wids_work)
        rows["widsindex create over http"] = {"seconds": widsindex_seconds(urls, wids_work), "workers": 1}
        for row in rows.values():
            row["shards_s"] = len(shards) / row["seconds"]
            row["gb_s"] = total / row["seconds"] / 1e9
            row["gb_s_per_worker"] = row["gb_s"] / row["workers"]
        epoch_s, n = epoch_seconds(os.path.join(work, "idx-http"))
        assert n == args.samples
    finally:
        emulation_down()
    record["remote"] = {
        "shards": len(shards), "samples": args.samples, "bytes": total,
        "per_connection_MiB_s": args.per_conn_mbps, "aggregate_cap_MB_s": args.aggregate_mbps if capped else None,
        "rows": rows, "first_epoch_s": epoch_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--payload", type=int, default=110_000, help="bytes per jpg (ImageNet's mean is ~110 KB)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--shards", type=int, default=100_000, help="the many-shards run")
    parser.add_argument("--wids-shards", type=int, default=2000)
    parser.add_argument("--per-conn-mbps", type=int, default=20, help="remote: nginx limit_rate per connection, MiB/s")
    parser.add_argument("--aggregate-mbps", type=int, default=160, help="remote: tc tbf cap for all connections, MB/s")
    parser.add_argument(
        "--only", nargs="+", choices=SECTIONS, default=list(SECTIONS),
        help="sections to run; the others are kept from the existing --out record (marked with their commit)",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--disk", default="hdd" if os.geteuid() == 0 else "", help="emulated disk profile for the cat comparison ('' skips)"
    )
    parser.add_argument("--out", default=RESULT)
    args = parser.parse_args()
    if args.quick:
        args.samples, args.shards, args.wids_shards = 600, 5000, 500
    sections = [s for s in SECTIONS if s in args.only and (s != "disk" or args.disk) and (s != "remote" or os.geteuid() == 0)]
    record: dict = {"machine": machine(), "commit": git_commit(), "workers": args.workers,
                    "load_average_1min_before": round(os.getloadavg()[0], 2)}
    if os.path.exists(args.out):  # sections not run this time stay as an earlier run measured them
        with open(args.out) as f:
            earlier = json.load(f)
        for section in SECTIONS:
            if section not in sections and section in earlier:
                record[section] = earlier[section]
                record.setdefault("section_commits", {})[section] = (
                    earlier.get("section_commits", {}).get(section, earlier.get("commit"))
                )
    work = tempfile.mkdtemp(prefix="shardkit-bench-index-")
    try:
        if {"real", "disk", "remote"} & set(sections):
            src = os.path.join(work, "src")
            shards = write_real(src, samples=args.samples, per_shard=args.per_shard, payload=args.payload)
            if "real" in sections:
                run_real(record, args, work, src, shards)
            if "disk" in sections:
                record["disk"] = on_disk(src, work, args.workers, args.disk)
            if "remote" in sections:
                run_remote(record, args, work, src, shards)
        if "many" in sections:
            run_many(record, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = render(record)
    save_record(args.out, record, table)
    plot(record, plot_path(args.out))
    print(table)


def _from(record: dict, section: str) -> str:
    commit = record.get("section_commits", {}).get(section)
    return f" (kept from the run at commit {commit})" if commit else ""


def render(record: dict) -> str:
    lines = [
        "# `shardkit index` vs `widsindex` vs resharding\n",
        f"Run at commit {record['commit']} (1-minute load average before: {record.get('load_average_1min_before', '?')};"
        " sections marked as kept come from an earlier run).\n",
    ]
    real = record.get("real")
    if real:
        lines += [
            f"{real['shards']} webdataset.ShardWriter shards, {real['samples']} samples of "
            f"{real['payload_bytes']:,}-byte JPEG-size payloads, {real['bytes'] / 1e6:.0f} MB, local disk; cold: the "
            "shards' pages evicted from the page cache before the run (posix_fadvise DONTNEED on these files only), "
            f"hot: in the page cache. {record['machine']['cpus']} cores (shared); 'vs cat' compares with `cat` at "
            f"the same temperature{_from(record, 'real')}.\n",
            "| run | seconds | shards/s | GB/s | GB/s per worker | vs cat | driver peak RSS |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in real["rows"].items():
            cat = real["rows"]["cat > /dev/null (cold)" if "(cold)" in name else "cat > /dev/null (hot)"]
            rss = f"{row['driver_peak_rss_mb']:.0f} MB" if "driver_peak_rss_mb" in row else ""
            lines.append(
                f"| {name} | {row['seconds']:.2f} | {row['shards_s']:.1f} | {row['gb_s']:.2f} | "
                f"{row['gb_s_per_worker']:.2f} | {100 * row['gb_s'] / cat['gb_s']:.0f}% | {rss} |"
            )
        epochs = real["first_epoch_s"]
        lines.append(
            "\nFirst epoch read afterwards (ShardDataset, mode=\"exact\", 0 workers): "
            + ", ".join(f"{k} {v:.2f} s" for k, v in epochs.items())
            + ".\n"
        )
    disk = record.get("disk")
    if disk:
        cat = disk["rows"]["cat > /dev/null"]["gb_s"]
        lines += [
            f"\n## On an emulated disk: `{disk['profile']}` ({disk['description']}), cold{_from(record, 'disk')}\n",
            "| run | seconds | GB/s | vs cat |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {name} | {row['seconds']:.2f} | {row['gb_s']:.3f} | {100 * row['gb_s'] / cat:.0f}% |"
            for name, row in disk["rows"].items()
        ]
    remote = record.get("remote")
    if remote:
        cap = remote["aggregate_cap_MB_s"]
        lines += [
            f"\n## Over an emulated object store{_from(record, 'remote')}\n",
            f"The same {remote['shards']} shards ({remote['bytes'] / 1e6:.0f} MB) served by nginx "
            f"(`bench/remote_emulation.sh`: {remote['per_connection_MiB_s']} MiB/s per connection, "
            + (f"{cap} MB/s for all connections, in a network namespace" if cap else "no aggregate cap")
            + "), indexed over http into a local `--out` (a brace pattern of URLs; an http folder cannot be "
            "listed). `widsindex create` takes the same URLs and downloads each with curl, one at a time.\n",
            "| run | seconds | shards/s | GB/s | GB/s per worker | driver peak RSS |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in remote["rows"].items():
            rss = f"{row['driver_peak_rss_mb']:.0f} MB" if "driver_peak_rss_mb" in row else ""
            lines.append(
                f"| {name} | {row['seconds']:.2f} | {row['shards_s']:.1f} | {row['gb_s']:.3f} | "
                f"{row['gb_s_per_worker']:.3f} | {rss} |"
            )
        lines.append(
            f"\nFirst epoch read afterwards over http (ShardDataset on the index, mode=\"exact\", 0 workers): "
            f"{remote['first_epoch_s']:.2f} s ({remote['bytes'] / remote['first_epoch_s'] / 1e6:.0f} MB/s).\n"
        )
    many = record.get("many")
    if many:
        lines += [
            f"\n## {many['shards']:,} shards (hard links to 4 real {many['shard_bytes']:,}-byte shards)"
            f"{_from(record, 'many')}\n",
            "Driver peak RSS is the indexing process's VmHWM (the pool's workers are other processes); its peak "
            "anonymous memory is sampled every 2 ms; at the end of the run its RSS is split into anonymous memory "
            "and file pages (mostly the shard table it maps: page cache, shared with every reader).\n",
            "| run | seconds | shards/s | driver peak RSS | peak anonymous | at the end: anonymous + file |",
            "|---|---|---|---|---|---|",
        ]

        def row(name: str, res: dict, shards: int) -> str:
            split = (
                f"{res['driver_end_anon_mb']:.1f} + {res['driver_end_file_mb']:.1f} MB"
                if "driver_end_anon_mb" in res else ""
            )
            anon = f"{res['driver_peak_anon_mb']:.1f} MB" if "driver_peak_anon_mb" in res else ""
            return (f"| {name} | {res['seconds']:.2f} | {shards / res['seconds']:.0f} | "
                    f"{res['driver_peak_rss_mb']:.1f} MB | {anon} | {split} |")

        for key, count in (("index_1k", 1000), ("index_10k", 10_000)):
            if key in many:
                lines.append(row(f"shardkit index, {count:,} shards", many[key], count))
        lines += [
            row(f"shardkit index, {many['shards']:,} shards", many["index_n"], many["shards"]),
            row("rerun, nothing changed", many["rerun_n"], many["shards"]),
            f"| widsindex create, first {many['widsindex_shards']:,} | "
            f"{many['widsindex_shards'] / many['widsindex_shards_s']:.2f} | {many['widsindex_shards_s']:.0f} | | | |",
        ]
    return "\n".join(lines) + "\n"


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = dict(record["real"]["rows"]) if "real" in record else {}
    rows.update(record.get("remote", {}).get("rows", {}))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    names = list(rows)
    colors = ["#888" if n.startswith("cat") else "#c63" if "http" in n else "#36c" for n in names]
    ax.barh(names, [rows[n]["gb_s"] for n in names], color=colors)
    ax.set_xscale("log")
    ax.set_xlabel("GB/s over the same shards (log scale; orange: emulated object store)")
    ax.invert_yaxis()
    ax.set_title("Indexing published shards")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
