#!/usr/bin/env python3
"""Per-sample checksums (issue #21): what the CRC-32 in the offset index costs.

**Writer.** ``ShardFile`` computes each sample's CRC-32 as it writes: the
same samples are written into shards (page cache, no fsync cost beyond the
writer's own) and, beside it, the CRC-32 alone and the SHA-256 alone (which
the writer already computes per shard) are timed over the same bytes, so the
CRC's share of a write is read off in one run.

**Reader.** ``ShardDataset(..., verify_checksums=True)`` against ``False``
over the same page-cache-hot shards, 0 workers (so the check's CPU cost is
not hidden by parallelism), passes alternating, best of ``--repeats``.

Writes ``bench/results/checksums.json`` / ``.md`` / ``.png``::

    .venv/bin/python bench/bench_checksums.py            # ~300 MB of shards, ~1 minute
    .venv/bin/python bench/bench_checksums.py --quick
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, plot_path, save_record  # noqa: E402
from shardkit import ShardDataset  # noqa: E402
from shardkit.format.tar import sample_checksum  # noqa: E402
from tests.conftest import build_dataset  # noqa: E402

RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "checksums.json")


def best_rate(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=RESULT)
    args = parser.parse_args()
    samples, payload = (2000, 32_000) if args.quick else (3000, 100_000)
    work = tempfile.mkdtemp(prefix="shardkit-bench-checksums-")
    try:
        sizes = [samples // 10] * 10
        write_s = best_rate(
            lambda: (shutil.rmtree(os.path.join(work, "ds"), ignore_errors=True),
                     build_dataset(os.path.join(work, "ds"), sizes, payload_bytes=payload)),
            max(1, args.repeats // 2),
        )  # fmt: skip
        ds_path = os.path.join(work, "ds")
        fields = [("bin", os.urandom(payload)), ("cls", b"3"), ("json", b'{"shard": 0, "i": 0}')]
        crc_s = best_rate(lambda: [sample_checksum(f"k{i}", fields) for i in range(samples)], args.repeats)
        sha = hashlib.sha256()
        sha_s = best_rate(lambda: [sha.update(fields[0][1]) for _ in range(samples)], args.repeats)
        total_bytes = samples * (payload + 30)

        def read(check: bool) -> None:
            n = sum(1 for _ in ShardDataset(ds_path, mode="exact", shuffle=False, verify_checksums=check))
            assert n == samples

        read(False)  # warm the page cache
        plain, checked = [], []
        for _ in range(args.repeats):
            plain.append(best_rate(lambda: read(False), 1))
            checked.append(best_rate(lambda: read(True), 1))
        read_plain, read_checked = min(plain), min(checked)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {
        "machine": machine(),
        "samples": samples,
        "payload_bytes": payload,
        "crc32_gb_s": total_bytes / crc_s / 1e9,
        "sha256_gb_s": total_bytes / sha_s / 1e9,
        "zlib_version": zlib.ZLIB_RUNTIME_VERSION,
        "write_s": write_s,
        "crc_share_of_write": crc_s / write_s,
        "read_samples_s": {"unchecked": samples / read_plain, "verify_checksums": samples / read_checked},
        "read_ratio_checked_vs_unchecked": read_plain / read_checked,
    }
    table = (
        "# Per-sample checksums (CRC-32)\n\n"
        f"{samples} samples of {payload} bytes, page-cache-hot; best of {args.repeats}, passes alternating.\n\n"
        "| measurement | value |\n|---|---|\n"
        f"| CRC-32 (zlib {zlib.ZLIB_RUNTIME_VERSION}) | {record['crc32_gb_s']:.2f} GB/s |\n"
        f"| SHA-256 (already computed per shard) | {record['sha256_gb_s']:.2f} GB/s |\n"
        f"| CRC-32 share of writing the shards | {100 * record['crc_share_of_write']:.1f}% |\n"
        f"| reader, unchecked | {record['read_samples_s']['unchecked']:.0f} samples/s |\n"
        f"| reader, verify_checksums=True | {record['read_samples_s']['verify_checksums']:.0f} samples/s |\n"
        f"| checked / unchecked | {100 * record['read_ratio_checked_vs_unchecked']:.1f}% |\n"
    )
    save_record(args.out, record, table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(["unchecked", "verify_checksums"], list(record["read_samples_s"].values()), color=["#888", "#36c"])
    ax.set_ylabel("samples/s (0 workers)")
    ax.set_title(f"Reader with per-sample CRC-32 ({payload // 1000} KB samples)")
    fig.tight_layout()
    fig.savefig(plot_path(args.out), dpi=100)
    print(table)


if __name__ == "__main__":
    main()
