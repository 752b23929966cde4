#!/usr/bin/env python3
"""The indexed parser's one pass (``shardkit/format/plain.py``) against the
full parser alone, on the reader's path.

Shards of small samples, where the parse is most of a read: captions (a
``txt`` of ~100 bytes and a ``cls``: the seed's tiny samples) and token
documents (one ``tokens.npy`` of ~740 uint16 ids, as ``bench_tokens.py``
writes). Two measurements, each alternating the two parsers, best of
``--repeats``, page-cache-hot, one process:

- **parser**: ``SampleParser(bounds=...).feed`` over one shard's bytes in
  4 MiB chunks cut on sample boundaries (what a local read feeds it), in
  microseconds a sample;
- **reader**: one epoch of ``ShardDataset(decode=None)`` (samples) and of
  ``ShardDataset(tokens=TokenBlocks("tokens.npy", 8192))`` (blocks), in
  samples (blocks' documents) a second.

The full parser is the same class with its one pass turned off
(``SampleParser._one_pass`` returning nothing), so the two differ in
nothing else.

Writes ``bench/results/parse.json`` / ``.md`` / ``.png``::

    .venv/bin/python bench/bench_parse.py           # ~2 minutes
    .venv/bin/python bench/bench_parse.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import shardkit  # noqa: E402
from bench.common import git_commit, machine, plot_path, save_record  # noqa: E402
from shardkit.format import tar  # noqa: E402

RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "parse.json")
CHUNK_BYTES = 4 << 20


def caption(i: int) -> dict[str, Any]:
    return {"__key__": f"c{i:08d}", "txt": f"a photo of item {i} " * 5, "cls": str(i % 1000)}


def document(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"__key__": f"d{i:08d}", "tokens.npy": rng.integers(0, 50_000, max(1, int(rng.lognormal(6.2, 0.9))),
                                                               dtype=np.uint16)}  # fmt: skip


@contextlib.contextmanager
def parser(kind: str) -> Iterator[None]:
    """``kind`` ``"full"``: the full parser alone, for the block."""
    one_pass = tar.SampleParser._one_pass
    if kind == "full":
        tar.SampleParser._one_pass = lambda self: []  # type: ignore[method-assign]
    try:
        yield
    finally:
        tar.SampleParser._one_pass = one_pass  # type: ignore[method-assign]


def best(fn: Callable[[], Any], kind: str, repeats: int) -> float:
    times = []
    with parser(kind):
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return min(times)


def parse_shard(folder: str) -> tuple[Callable[[], int], int]:
    """Feeding a dataset's first shard to an indexed parser, as a local read does."""
    manifest = shardkit.load_manifest(folder)
    data = open(os.path.join(folder, manifest.table.path(0)), "rb").read()
    bounds = np.load(os.path.join(folder, manifest.table.index_path(0)))
    cuts = [0]
    while cuts[-1] < bounds[-1]:
        cuts.append(int(bounds[max(np.searchsorted(bounds, cuts[-1] + CHUNK_BYTES, side="right") - 1,
                                   np.searchsorted(bounds, cuts[-1], side="right"))]))  # fmt: skip
    cuts[-1] = len(data)

    def run() -> int:
        p = tar.SampleParser(path="shard", bounds=bounds)
        got = sum(len(p.feed(data[lo:hi])) for lo, hi in zip(cuts, cuts[1:]))
        return got + len(p.finish())

    return run, len(bounds) - 1


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--quick", action="store_true")
    args.add_argument("--repeats", type=int, default=5)
    args.add_argument("--out", default=RESULT)
    args = args.parse_args()
    count = 10_000 if args.quick else 60_000
    work = tempfile.mkdtemp(prefix="shardkit-bench-parse-")
    rows = []
    try:
        for name, make, tokens in (("captions", caption, False), ("token documents", document, True)):
            folder = os.path.join(work, name.replace(" ", "-"))
            shardkit.write_dataset(range(count), folder, map=make, options=shardkit.WriteOptions(workers=2))
            parse, in_shard = parse_shard(folder)
            assert parse() == in_shard
            if tokens:
                def read() -> int:
                    ds = shardkit.ShardDataset(folder, tokens=shardkit.TokenBlocks("tokens.npy", 8192), seed=0)
                    return sum(1 for _ in ds)
            else:
                def read() -> int:
                    return sum(1 for _ in shardkit.ShardDataset(folder, decode=None, seed=0))
            read()  # the page cache
            row: dict[str, Any] = {"corpus": name, "samples": count, "samples_in_shard": in_shard}
            for kind in ("full", "one pass", "full", "one pass"):  # alternating
                row.setdefault(f"parse_s_{kind}", []).append(best(parse, kind, args.repeats))
                row.setdefault(f"read_s_{kind}", []).append(best(read, kind, max(1, args.repeats // 2)))
            for kind in ("full", "one pass"):
                row[f"parse_us_{kind}"] = min(row.pop(f"parse_s_{kind}")) / in_shard * 1e6
                row[f"read_samples_per_s_{kind}"] = count / min(row.pop(f"read_s_{kind}"))
            row["parse_speedup"] = row["parse_us_full"] / row["parse_us_one pass"]
            row["read_speedup"] = row["read_samples_per_s_one pass"] / row["read_samples_per_s_full"]
            rows.append(row)
            print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"commit": git_commit(), "machine": machine(), "repeats": args.repeats, "rows": rows}
    lines = [
        "# The indexed parser's one pass against the full parser alone",
        "",
        f"At commit {record['commit']}, {machine()['cpus']} CPUs, one process, page-cache-hot; best of "
        f"{args.repeats}, the two alternating. Parser: one shard fed in 4 MiB chunks cut on sample boundaries. "
        "Reader: one epoch of `ShardDataset(decode=None)` for captions, of `TokenBlocks('tokens.npy', 8192)` "
        "for token documents (documents a second).",
        "",
        "| corpus | samples | parser, full | parser, one pass | speed-up | reader, full | reader, one pass | speed-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['corpus']} | {r['samples']:,} | {r['parse_us_full']:.2f} us | {r['parse_us_one pass']:.2f} us | "
            f"{r['parse_speedup']:.2f}x | {r['read_samples_per_s_full']:,.0f}/s | "
            f"{r['read_samples_per_s_one pass']:,.0f}/s | {r['read_speedup']:.2f}x |"
        )
    table = "\n".join(lines) + "\n"
    save_record(args.out, record, table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, key, label in ((axes[0], "parse_us", "parser, us a sample"), (axes[1], "read_samples_per_s", "reader, samples/s")):
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r[f"{key}_full"] for r in rows], 0.4, label="full parser", color="#888")
        ax.bar(x + 0.2, [r[f"{key}_one pass"] for r in rows], 0.4, label="one pass", color="#36c")
        ax.set_xticks(x, [r["corpus"] for r in rows])
        ax.set_title(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(plot_path(args.out), dpi=100)
    print(table)


if __name__ == "__main__":
    main()
