"""Random access: shardkit.IndexedDataset against webdataset's wids.ShardListDataset.

Both read the same shards in the same uniformly shuffled index order through
a DataLoader (2 workers, batches of 32, raw bytes, no decoding):

* local files, page cache warm (every shard read once first) and cold
  (``echo 3 > /proc/sys/vm/drop_caches`` before each run; skipped with a
  message where that is not permitted): samples/s and time to the first batch.
  wids runs twice: with its default in-memory LRU of 10 open shards per
  worker (each miss re-opens the shard and re-scans its headers) and with an
  LRU holding every shard (its best case).
* HTTP and s3://, against a threaded Range-capable server on 127.0.0.1 run
  in a process of its own (not the nginx emulation of ``bench_remote.py``:
  it counts the bytes and requests it serves, which is what this comparison
  is about), run twice: ``localhost``, as fast as it goes, and ``object
  store``, with ``--store-latency-ms`` per request (an object store's
  first-byte latency) and ``--store-per-conn-mbps`` per connection.
  IndexedDataset with one ranged request per sample, with a shard cache
  (whole shards on first use), and with the cache plus
  :class:`shardkit.ShardWindowSampler` order; wids with its download cache
  (``curl`` of whole shards). Samples/s, bytes and requests per sample.
  Over ``s3://`` (``--schemes``, both by default) the same server answers
  as an S3 endpoint, path-style, the bucket ``data`` (as ``bench_remote.py
  --scheme s3`` has nginx do; no signature is checked): shardkit reads
  ``s3://data/`` with ``SourceOptions(s3_endpoint_url=...)``, wids
  ``s3://data/KEY`` through the AWS CLI (its handler for s3://, ``aws s3 cp``
  of whole shards), which ``AWS_ENDPOINT_URL`` points at the server; both
  with throwaway credentials in the environment.

The record also holds the window sampler's shuffle quality (see
:func:`shardkit.shuffle_quality`) on a worst case for locality, shards that
each hold one class. Writes JSON, a Markdown table and a PNG plot::

    python bench/bench_random_access.py            # about 4 minutes on 2 cores
    python bench/bench_random_access.py --quick    # smaller, for a smoke test

``--seed`` runs the seed's scenario instead (issue #45): a read-only SQLite
file opened after the fork, wids and IndexedDataset over tiny samples at
5x10^5, 5x10^6 and 5x10^7 samples with 0, 1, 4 and 16 workers, a
``RandomSampler`` of 51,200 samples; time and private memory per worker (see
:mod:`bench.harness.seed_access`)::

    python bench/bench_random_access.py --seed          # about 30 minutes on 2 cores, 4 GB of disk
    python bench/bench_random_access.py --seed --quick  # 5x10^5 samples, 0 and 4 workers
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock
from urllib.parse import unquote

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import shardkit  # noqa: E402
from bench.bench_remote import BUCKET, EMULATION_AWS_ENV, boto3_s3_client, cpu_seconds, make_dataset  # noqa: E402
from bench.common import git_commit, machine, plot_path, save_record  # noqa: E402
from bench.harness import seed_access  # noqa: E402
from shardkit.io.base import SourceOptions  # noqa: E402
from shardkit.io.s3 import split_s3_url  # noqa: E402

MB = 1_000_000
#: Remote schemes read, each over both networks (``--schemes``).
SCHEMES = ("http", "s3")
#: wids' remote rows: its download cache, over s3:// with its own handler
#: (the AWS CLI) and with boto3's; every remote row is compared with the
#: fastest on its network.
WIDS_REMOTE = "wids (download cache)"
WIDS_AWS = "wids (download cache, AWS CLI)"
WIDS_BOTO3 = "wids (download cache, boto3)"
#: wids' own s3:// handler, quietened: the AWS CLI prints a progress line
#: every 256 KiB otherwise.
WIDS_AWS_CLI = "aws s3 cp --quiet '{url}' '{local}'"
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


# ------------------------------------------------------------------ loaders


def as_list(batch: list[Any]) -> list[Any]:
    """Collate: keep the samples as they are (wids adds None fields)."""
    return batch


def same_path(url: str) -> str:
    """wids ``localname`` for local shards: read them in place, no copy."""
    return url


def payload_bytes(sample: dict[str, Any]) -> int:
    """Size of a sample's ``bin`` field: bytes (shardkit) or a BytesIO under
    ``.bin`` (wids)."""
    value = sample["bin"] if "bin" in sample else sample[".bin"]
    return len(value) if isinstance(value, bytes) else value.getbuffer().nbytes


def run_loader(dataset: Any, indices: list[int], *, workers: int, batch_size: int) -> dict[str, float]:
    """Read ``indices`` of ``dataset`` through a DataLoader; samples/s, seconds
    to the first batch, and CPU seconds (this process and reaped workers)."""
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset, sampler=indices, batch_size=batch_size, num_workers=workers, collate_fn=as_list, prefetch_factor=4
    )
    count = nbytes = 0
    first = 0.0
    cpu0 = cpu_seconds()
    start = time.perf_counter()
    for batch in loader:
        if count == 0:
            first = time.perf_counter() - start
        count += len(batch)
        nbytes += sum(payload_bytes(s) for s in batch)
    seconds = time.perf_counter() - start
    assert count == len(indices), (count, len(indices))
    return {
        "samples": count,
        "seconds": round(seconds, 3),
        "samples_per_s": round(count / seconds, 1),
        "first_batch_s": round(first, 3),
        "payload_mb_per_s": round(nbytes / seconds / MB, 1),
        "cpu_s": round(cpu_seconds() - cpu0, 2),
    }


def wids_dataset(manifest: shardkit.Manifest, urls: list[str], *, lru_size: int, cache_dir: str | None) -> Any:
    import wids

    shards = [{"url": u, "nsamples": s.num_samples} for u, s in zip(urls, manifest.shards)]
    if cache_dir is None:
        return wids.ShardListDataset(shards, lru_size=lru_size, localname=same_path, transformations=[])
    return wids.ShardListDataset(shards, lru_size=lru_size, cache_dir=cache_dir, transformations=[])


def download_s3_with_boto3(remote: str, local: str) -> None:
    """wids' download handler for ``s3://`` in the ``wids (download cache,
    boto3)`` runs: boto3's ``download_file`` (a HeadObject, then 8 MiB parts
    on threads, as the AWS CLI does, without a process per shard), what a
    user puts in ``wids.wids_dl.default_cmds`` instead of the CLI."""
    bucket, key = split_s3_url(remote)
    boto3_s3_client().download_file(bucket, key, local)


# ------------------------------------------------------------------ page cache


def drop_page_cache() -> bool:
    """Drop the kernel's page cache; False where that is not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm_page_cache(folder: str) -> None:
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


# ------------------------------------------------------------------ HTTP server


def _object_file(root: str, request_path: str) -> str | None:
    """The file of ``root`` that a request names, or None: ``/NAME`` as a
    plain HTTP server has it, or ``/BUCKET/NAME`` as an S3 endpoint
    addressed path-style has it (the bucket :data:`BUCKET` is ``root``)."""
    name = unquote(request_path.split("?", 1)[0]).lstrip("/")
    if name.startswith(BUCKET + "/"):
        name = name[len(BUCKET) + 1 :]
    path = os.path.join(root, name)
    # The dataset is one flat folder: nothing under it or above it is served.
    return path if "/" not in name and os.path.isfile(path) else None


def _serve(
    root: str, latency_s: float, bytes_per_s: float, port: Any, ready: Any, served_bytes: Any, requests: Any
) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _open(self) -> tuple[str, int] | None:
            """Count the request, wait out the store's latency, and answer
            a missing object with S3's 404 (its body names the error code,
            which S3 clients read; a plain HTTP client sees a 404)."""
            with requests.get_lock():
                requests.value += 1
            if latency_s:
                time.sleep(latency_s)
            path = _object_file(root, self.path)
            if path is None:
                body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchKey</Code></Error>"
                self.send_response(404)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return None
            return path, os.path.getsize(path)

        def _object_headers(self, path: str, length: int) -> None:
            # What S3's HeadObject and GetObject answers carry: the AWS CLI
            # sets a download's mtime from Last-Modified.
            stat = os.stat(path)
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Last-Modified", formatdate(stat.st_mtime, usegmt=True))
            self.send_header("ETag", f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"')
            self.end_headers()

        def do_HEAD(self) -> None:
            found = self._open()
            if found is not None:
                self.send_response(200)
                self._object_headers(*found)

        def do_GET(self) -> None:
            found = self._open()
            if found is None:
                return
            path, size = found
            start, end = 0, size
            match = _RANGE.match(self.headers.get("Range") or "")
            if match:
                start = int(match.group(1))
                end = min(int(match.group(2)) + 1, size) if match.group(2) else size
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            else:
                self.send_response(200)
            self._object_headers(path, end - start)
            began = time.perf_counter()
            with open(path, "rb") as f:
                f.seek(start)
                left = end - start
                while left > 0:
                    data = f.read(min(left, 256 << 10))
                    if not data:
                        break
                    self.wfile.write(data)
                    left -= len(data)
                    if bytes_per_s:
                        # Pace the connection: never ahead of its bandwidth cap.
                        ahead = (end - start - left) / bytes_per_s - (time.perf_counter() - began)
                        if ahead > 0:
                            time.sleep(ahead)
            with served_bytes.get_lock():
                served_bytes.value += end - start - left

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            # Clients hang up mid-response when a DataLoader worker exits with
            # a cache fill in flight: not the server's fault, nothing to print.
            if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    port.value = server.server_address[1]
    ready.set()
    server.serve_forever()


class LocalServer:
    """The Range server in a child process, with counters of what it served."""

    def __init__(self, root: str, *, latency_ms: float, per_conn_mbps: float):
        ctx = multiprocessing.get_context("fork")
        self.port = ctx.Value("i", 0)
        self.served_bytes = ctx.Value("q", 0)
        self.requests = ctx.Value("q", 0)
        ready = ctx.Event()
        self.process = ctx.Process(
            target=_serve,
            args=(root, latency_ms / 1000, per_conn_mbps * MB, self.port, ready, self.served_bytes, self.requests),
            daemon=True,
        )
        self.process.start()
        if not ready.wait(30):
            raise RuntimeError("the HTTP server did not start")
        self.url = f"http://127.0.0.1:{self.port.value}"

    def counters(self) -> tuple[int, int]:
        return int(self.served_bytes.value), int(self.requests.value)

    def close(self) -> None:
        self.process.terminate()
        self.process.join(10)


# ------------------------------------------------------------------ runs


class ConstantPayload:
    """A dataset that reads nothing: every sample is the same payload, the
    size of the benchmark's samples. Its rate is what the DataLoader itself
    (pickling, worker-to-main transfer) allows."""

    def __init__(self, num_samples: int, sample_bytes: int):
        self.num_samples = num_samples
        self.payload = bytes(sample_bytes)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, Any]:
        # A new object per sample, as a reader makes (pickle would send one
        # object that a batch holds many times only once).
        return {"__key__": str(index), "bin": self.payload[:-1] + b"x"}


def local_runs(manifest, urls, indices, args, *, cold: bool) -> list[dict[str, Any]]:
    tools = [
        ("DataLoader ceiling (no reads)", lambda: ConstantPayload(manifest.num_samples, args.sample_kb << 10)),
        ("shardkit IndexedDataset", lambda: shardkit.IndexedDataset(manifest)),
        ("wids (lru 10)", lambda: wids_dataset(manifest, urls, lru_size=10, cache_dir=None)),
        ("wids (lru all)", lambda: wids_dataset(manifest, urls, lru_size=manifest.num_shards, cache_dir=None)),
    ]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in tools}
    for repeat in range(args.repeats):
        for name, make in rotated(tools, repeat):
            if cold:
                drop_page_cache()
            else:
                warm_page_cache(manifest.location)
            result = run_loader(make(), indices, workers=args.workers, batch_size=args.batch_size)
            runs[name].append(result)
            print(f"  local {'cold' if cold else 'warm'} {name:30s} {result['samples_per_s']:9.1f} samples/s  "
                  f"first batch {result['first_batch_s']:.3f} s", flush=True)
    return [median_row(runs[name], tool=name, cache="cold" if cold else "warm") for name, _ in tools]


def rotated(tools: list[Any], turn: int) -> list[Any]:
    """``tools`` from its ``turn``-th on, then the rest: each repeat starts
    one further, so no tool always runs first (or right after another)."""
    return tools[turn % len(tools) :] + tools[: turn % len(tools)]


def median_row(results: list[dict[str, float]], **labels: Any) -> dict[str, Any]:
    """One row of the table: ``labels``, each figure's median over ``results``
    (a tool's runs), and every run's samples/s."""
    row: dict[str, Any] = dict(labels)
    for key in results[0]:
        row[key] = float(np.median([r[key] for r in results]))
    row["samples_per_s_runs"] = [r["samples_per_s"] for r in results]
    return row


def remote_runs(
    manifest, indices, args, scratch: str, *, scheme: str, network: str, latency_ms: float, per_conn_mbps: float
) -> list[dict[str, Any]]:
    """Every remote tool over one network and scheme: ``http`` reads the
    server's URLs, ``s3`` the same server as an S3 endpoint (the bucket
    :data:`BUCKET`, path-style), shardkit pointed at it by
    ``SourceOptions(s3_endpoint_url=...)``, wids' downloads (the AWS CLI,
    its own handler, or boto3's ``download_file``) by ``AWS_ENDPOINT_URL``,
    with throwaway credentials (the server checks no signature)."""
    server = LocalServer(manifest.location, latency_ms=latency_ms, per_conn_mbps=per_conn_mbps)
    label = network if scheme == "http" else f"{network} (s3://)"
    rows = []
    try:
        base, endpoint = (server.url, None) if scheme == "http" else (f"s3://{BUCKET}", server.url)
        urls = [f"{base}/{s.path}" for s in manifest.shards]
        window = shardkit.ShardWindowSampler(manifest_counts(manifest), window_shards=args.window_shards, seed=0,
                                             rank=0, world_size=1)
        window_indices = list(window)[: len(indices)]

        def cache_dir(name: str) -> str:
            path = os.path.join(scratch, name)
            shutil.rmtree(path, ignore_errors=True)
            return path

        def options(cache: str | None = None) -> SourceOptions:
            """The store's endpoint (s3), and an empty cache folder named ``cache``."""
            return SourceOptions(s3_endpoint_url=endpoint, cache_dir=None if cache is None else cache_dir(cache))

        tools = [
            ("shardkit ranged", indices, lambda: shardkit.IndexedDataset(base + "/", source_options=options())),
            ("shardkit + cache", indices,
             lambda: shardkit.IndexedDataset(base + "/", source_options=options("sk"))),
            (f"shardkit + cache, window sampler ({args.window_shards} shards)", window_indices,
             lambda: shardkit.IndexedDataset(base + "/", source_options=options("skw"))),
        ]
        # wids' download handler for s3:// in each of its runs (None: as it comes; over http that is curl).
        wids_s3: dict[str, Any] = {WIDS_REMOTE: None}
        if scheme == "s3":
            wids_s3 = {WIDS_AWS: WIDS_AWS_CLI, WIDS_BOTO3: download_s3_with_boto3}
        tools += [(name, indices, lambda: wids_dataset(manifest, urls, lru_size=10, cache_dir=cache_dir("wids")))
                  for name in wids_s3]
        if WIDS_AWS in wids_s3 and shutil.which("aws") is None:
            rows.append({"tool": WIDS_AWS, "network": label, "scheme": scheme,
                         "skipped": "no AWS CLI (`aws`) on PATH: wids reads s3:// with `aws s3 cp`"})
            print(f"  {label:22s} {WIDS_AWS:44s} skipped: {rows[-1]['skipped']}", flush=True)
            tools = [tool for tool in tools if tool[0] != WIDS_AWS]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in tools}
        environment = {} if endpoint is None else {**EMULATION_AWS_ENV, "AWS_ENDPOINT_URL": endpoint}
        # Set before the DataLoader forks its workers (and they the AWS CLI); restored after.
        with mock.patch.dict(os.environ, environment):
            for repeat in range(args.remote_repeats):
                for name, order, make in rotated(tools, repeat):
                    dataset = make()
                    before = server.counters()
                    handler = {} if wids_s3.get(name) is None else {"s3": wids_s3[name]}
                    with mock.patch.dict(wids_download_handlers(), handler):
                        result = run_loader(dataset, order, workers=args.workers, batch_size=args.batch_size)
                    after = server.counters()
                    sent, asked = after[0] - before[0], after[1] - before[1]
                    result.update(
                        bytes_per_sample=round(sent / result["samples"]),
                        requests_per_sample=round(asked / result["samples"], 3),
                        transferred_mb=round(sent / MB, 1),
                    )
                    runs[name].append(result)
                    print(f"  {label:22s} {name:44s} {result['samples_per_s']:9.1f} samples/s  "
                          f"{result['bytes_per_sample'] / 1e3:10.1f} kB/sample  "
                          f"{result['requests_per_sample']:.2f} req/sample", flush=True)
        rows = [median_row(runs[name], tool=name, network=label, scheme=scheme) for name, *_ in tools] + rows
    finally:
        server.close()
    return rows


def wids_download_handlers() -> dict[str, Any]:
    """wids' download handlers by URL scheme: a command or a function, the
    dict its downloads default to (so a change reaches workers forked after it)."""
    from wids import wids_dl

    return wids_dl.default_cmds


def manifest_counts(manifest: shardkit.Manifest) -> list[int]:
    return [s.num_samples for s in manifest.shards]


def shuffle_quality_rows(*, num_shards: int = 64, per_shard: int = 100, num_classes: int = 16) -> list[dict[str, Any]]:
    """The window sampler's shuffle quality when each shard holds one class."""
    from shardkit.read.sampler import epoch_window_sequence

    labels = np.repeat(np.arange(num_shards) % num_classes, per_shard)
    counts = [per_shard] * num_shards
    rows = [{"order": "manifest order", "quality": shardkit.shuffle_quality(labels, batch_size=32)}]
    for window in (1, 2, 4, 8, 16, 32):
        seq = epoch_window_sequence(counts, window_shards=window, seed=0, epoch=0)
        rows.append({"order": f"window of {window} shards", "quality": shardkit.shuffle_quality(labels[seq], batch_size=32)})
    uniform = np.random.default_rng(1).permutation(labels.size)
    rows.append({"order": "uniform (i.i.d.)", "quality": shardkit.shuffle_quality(labels[uniform], batch_size=32)})
    return [{**r, "quality": round(float(r["quality"]), 3)} for r in rows]


# ------------------------------------------------------------------ report


def ratio(rows: list[dict[str, Any]], num: str, den: str, key: str = "samples_per_s", **match: str) -> float | None:
    def find(tool: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["tool"] == tool and all(r.get(k) == v for k, v in match.items())), None)

    a, b = find(num), find(den)  # a skipped row has no figures
    return None if a is None or b is None or not b.get(key) or key not in a else round(a[key] / b[key], 2)


def fastest_wids(rows: list[dict[str, Any]], network: str) -> str:
    """The faster of wids' remote rows on ``network`` (skipped ones aside),
    the one that row's "vs wids" divides by."""
    runs = [r for r in rows if r["network"] == network and r["tool"] in (WIDS_REMOTE, WIDS_AWS, WIDS_BOTO3)]
    runs = [r for r in runs if "skipped" not in r]
    return max(runs, key=lambda r: r["samples_per_s"])["tool"] if runs else WIDS_REMOTE


def markdown(record: dict[str, Any]) -> str:
    cfg = record["config"]
    lines = [
        "# Random access: IndexedDataset vs wids",
        "",
        f"{cfg['num_shards']} shards of {cfg['shard_mb']} MB, {cfg['sample_kb']} KiB samples "
        f"({record['num_samples']} in all); {cfg['samples']} uniformly shuffled indices "
        f"({cfg['http_samples']} over HTTP); DataLoader with {cfg['workers']} workers, batches of "
        f"{cfg['batch_size']}, raw bytes. {record['machine']['cpus']} CPUs. Local figures are medians of "
        f"{cfg['repeats']} runs (range in brackets). The ceiling row reads nothing: it is what the DataLoader "
        "moves from workers at this sample size.",
        "",
        "## Local files",
        "",
        "| page cache | tool | samples/s | first batch (s) | CPU s | vs wids (lru 10) | vs wids (lru all) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    local = record["local"]
    for row in local:
        r10 = ratio(local, row["tool"], "wids (lru 10)", cache=row["cache"])
        rall = ratio(local, row["tool"], "wids (lru all)", cache=row["cache"])
        lines.append(
            f"| {row['cache']} | {row['tool']} | {row['samples_per_s']:.0f} "
            f"[{min(row['samples_per_s_runs']):.0f}-{max(row['samples_per_s_runs']):.0f}] | {row['first_batch_s']:.3f} | "
            f"{row['cpu_s']:.1f} | {r10:.2f}x | {rall:.2f}x |"
        )
    if record.get("cold_skipped"):
        lines += ["", f"Cold runs skipped: {record['cold_skipped']}"]
    if record["remote"]:
        lines += [
            "",
            "## HTTP and s3://",
            "",
            "A threaded Range server on 127.0.0.1 in its own process, counting what it sends and the requests "
            f"(GET and HEAD) it answers: `localhost` as fast as it goes; `object store` adds "
            f"{cfg['store_latency_ms']:g} ms per request and caps each connection at "
            f"{cfg['store_per_conn_mbps']:g} MB/s. `(s3://)` rows read the same server as an S3 endpoint "
            f"(the bucket `{BUCKET}`, path-style; signatures not checked): shardkit `s3://{BUCKET}/` with "
            "`SourceOptions(s3_endpoint_url=...)` (ranged GETs to presigned URLs), wids with its own download handler "
            "for s3://, `aws s3 cp URL LOCAL` (here with `--quiet`: one AWS CLI process per shard, which sends a "
            "HeadObject and then GETs 8 MiB parts of the object, several at once), and with boto3's "
            "`download_file` as its handler instead (the same requests, threads in the worker instead of a "
            "process), the endpoint given by `AWS_ENDPOINT_URL`. vs wids: samples/s over the faster wids row of "
            "the same network and scheme. Medians of "
            f"{cfg.get('remote_repeats', 1)} runs (range in brackets), the tools taking turns.",
            "",
            "| network | tool | samples/s | first batch (s) | kB transferred / sample | requests / sample | vs wids |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        remote = record["remote"]
        for row in remote:
            if "skipped" in row:
                lines.append(f"| {row['network']} | {row['tool']} | skipped: {row['skipped']} | | | | |")
                continue
            r = ratio(remote, row["tool"], fastest_wids(remote, row["network"]), network=row["network"])
            lines.append(
                f"| {row['network']} | {row['tool']} | {row['samples_per_s']:.0f} "
                f"[{min(row['samples_per_s_runs']):.0f}-{max(row['samples_per_s_runs']):.0f}] | {row['first_batch_s']:.3f} | "
                f"{row['bytes_per_sample'] / 1e3:.1f} | {row['requests_per_sample']:.2f} | "
                + ("-" if r is None else f"{r:.2f}x") + " |"
            )
    lines += [
        "",
        "## Window sampler shuffle quality (shards holding one class each; 1.0 = i.i.d., larger is worse)",
        "",
        "| order | shuffle_quality |",
        "| --- | ---: |",
    ]
    lines += [f"| {r['order']} | {r['quality']:.2f} |" for r in record["shuffle_quality"]]
    return "\n".join(lines) + "\n"


def _grouped_bars(ax: Any, rows: list[dict[str, Any]], group: str, value: Any) -> None:
    tools = list(dict.fromkeys(r["tool"] for r in rows))
    groups = list(dict.fromkeys(r[group] for r in rows))
    width = 0.8 / len(tools)
    for t, tool in enumerate(tools):
        values = [next((value(r) for r in rows if r["tool"] == tool and r[group] == g), 0) for g in groups]
        ax.bar(np.arange(len(groups)) + t * width, values, width, label=tool)
    ax.set_xticks(np.arange(len(groups)) + width * (len(tools) - 1) / 2, groups)
    ax.legend(fontsize=6)


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    remote = [r for r in record["remote"] if "skipped" not in r]
    panels = 3 if remote else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2))
    axes = np.atleast_1d(axes)
    _grouped_bars(axes[0], record["local"], "cache", lambda r: r["samples_per_s"])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("samples/s (log)")
    axes[0].set_title("local files, page cache warm / cold")
    if remote:
        _grouped_bars(axes[1], remote, "network", lambda r: r["samples_per_s"])
        axes[1].set_ylabel("samples/s")
        axes[1].set_title("HTTP and s3://")
        _grouped_bars(axes[2], remote, "network", lambda r: r["bytes_per_sample"] / 1e3)
        axes[2].set_yscale("log")
        axes[2].set_ylabel("kB transferred per sample (log)")
        axes[2].set_title("HTTP and s3:// bytes per sample")
        for ax in axes[1:]:
            ax.tick_params(axis="x", labelsize=7)  # four networks: localhost and object store, each scheme
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def seed_main(args: argparse.Namespace) -> int:
    """The seed's scenario (``--seed``): every tool, size and worker count."""
    sizes = [500_000] if args.quick else args.sizes
    workers = [0, 4] if args.quick else args.seed_workers
    repeat_cells = [] if args.quick else [(5_000_000, max(workers)), (50_000_000, max(workers))]

    load_before = os.getloadavg()
    measured = seed_access.measure(
        os.path.join(args.workdir, "seed"), sizes, workers, reads=args.reads, batch_size=64,
        budget_s=args.budget_s, repeats=args.repeats, repeat_cells=repeat_cells, tools=tuple(args.tools), progress=seed_access.print_cell,
    )
    record = {
        "machine": machine(),
        "commit": git_commit(),
        "load_before": [round(x, 2) for x in load_before],
        "config": {"sizes": sizes, "workers": workers, "tools": args.tools, "reads": args.reads, "batch_size": 64,
                   "budget_s": args.budget_s, "single_process_memory": "private_dirty_after_import", "repeats": args.repeats, "repeat_cells": repeat_cells},
        **measured,
        "targets": seed_access.targets(measured["cells"]),
    }
    table = seed_access.markdown(record)
    save_record(args.out, record, table)
    seed_access.plot(record, plot_path(args.out))
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "random_access"))
    parser.add_argument("--shards", type=int, default=48)
    parser.add_argument("--shard-mb", type=int, default=16)
    parser.add_argument("--sample-kb", type=int, default=96)
    parser.add_argument("--samples", type=int, default=6000, help="indices read per local run")
    parser.add_argument("--http-samples", type=int, default=2000, help="indices read per HTTP run")
    parser.add_argument("--repeats", type=int, default=3, help="local runs per tool (the median is reported)")
    parser.add_argument("--remote-repeats", type=int, default=3,
                        help="runs per tool, network and scheme over HTTP and s3:// (the median is reported)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--window-shards", type=int, default=4)
    parser.add_argument(
        "--store-latency-ms", type=float, default=10.0, help="per-request delay of the emulated object store"
    )
    parser.add_argument(
        "--store-per-conn-mbps", type=float, default=20.0, help="per-connection cap of the emulated store, MB/s"
    )
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--no-http", action="store_true", help="no remote runs (neither scheme)")
    parser.add_argument("--schemes", type=lambda t: t.split(","), default=list(SCHEMES),
                        help="remote schemes, comma-separated, of http,s3 (s3: the same server as an S3 endpoint)")
    parser.add_argument("--quick", action="store_true", help="12 shards of 8 MB, 1000 indices")
    parser.add_argument("--out", help="JSON record (default results/random_access.json, with --seed _seed.json)")
    parser.add_argument("--seed", action="store_true", help="the seed's SQLite scenario instead (issue #45)")
    parser.add_argument("--sizes", type=lambda t: [int(float(x)) for x in t.split(",")],
                        default=[500_000, 5_000_000, 50_000_000], help="--seed: samples, comma-separated")
    parser.add_argument("--seed-workers", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1, 4, 16],
                        help="--seed: DataLoader workers, comma-separated")
    parser.add_argument("--tools", type=lambda t: t.split(","), default=list(seed_access.TOOLS),
                        help="--seed: of sqlite,wids,shardkit")
    parser.add_argument("--reads", type=int, default=51_200, help="--seed: samples the RandomSampler draws")
    parser.add_argument("--budget-s", type=float, default=30.0,
                        help="--seed: a run past it stops and its time is extrapolated (wids)")
    args = parser.parse_args(argv)
    if set(args.schemes) - set(SCHEMES):
        parser.error(f"--schemes: of {','.join(SCHEMES)}, not {','.join(sorted(set(args.schemes) - set(SCHEMES)))}")
    args.out = args.out or os.path.join(HERE, "results", "random_access_seed.json" if args.seed else "random_access.json")
    if args.seed:
        return seed_main(args)
    if args.quick:
        args.shards, args.shard_mb, args.samples, args.http_samples, args.repeats = 12, 8, 1000, 500, 1
        args.remote_repeats = 1

    data = os.path.join(args.workdir, "data")
    manifest = make_dataset(data, num_shards=args.shards, shard_mb=args.shard_mb, sample_kb=args.sample_kb)
    urls = [manifest.resolve(s.path) for s in manifest.shards]
    order = np.random.default_rng(0).permutation(manifest.num_samples)
    indices = order[: args.samples].tolist()
    print(f"{manifest.num_shards} shards, {manifest.num_samples} samples, {manifest.num_bytes / MB:.0f} MB", flush=True)

    local = local_runs(manifest, urls, indices, args, cold=False)
    cold_skipped = None
    if args.no_cold:
        cold_skipped = "--no-cold"
    elif not drop_page_cache():
        cold_skipped = "not permitted to write /proc/sys/vm/drop_caches (needs root outside a container)"
        print(f"  cold runs skipped: {cold_skipped}", flush=True)
    else:
        local += local_runs(manifest, urls, indices, args, cold=True)

    remote: list[dict[str, Any]] = []
    if not args.no_http:
        networks = [("localhost", 0.0, 0.0), ("object store", args.store_latency_ms, args.store_per_conn_mbps)]
        with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
            http_indices = order[: args.http_samples].tolist()
            for scheme in args.schemes:
                for network, latency_ms, per_conn_mbps in networks:
                    remote += remote_runs(manifest, http_indices, args, scratch, scheme=scheme, network=network,
                                          latency_ms=latency_ms, per_conn_mbps=per_conn_mbps)

    record = {
        "machine": machine(),
        "config": {
            "num_shards": args.shards,
            "shard_mb": args.shard_mb,
            "sample_kb": args.sample_kb,
            "samples": args.samples,
            "http_samples": args.http_samples,
            "workers": args.workers,
            "repeats": args.repeats,
            "remote_repeats": args.remote_repeats,
            "batch_size": args.batch_size,
            "window_shards": args.window_shards,
            "store_latency_ms": args.store_latency_ms,
            "store_per_conn_mbps": args.store_per_conn_mbps,
            "schemes": [] if args.no_http else args.schemes,
        },
        "num_samples": manifest.num_samples,
        "local": local,
        "cold_skipped": cold_skipped,
        "remote": remote,
        "shuffle_quality": shuffle_quality_rows(),
    }
    table = markdown(record)
    save_record(args.out, record, table)
    plot(record, plot_path(args.out))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
