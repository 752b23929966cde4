#!/usr/bin/env python3
"""Time to the first batch with a large shuffle buffer, and what the early
start costs in shuffle quality.

**First batch.** A synthetic dataset of ~110 KB samples (ImageNet-sized
JPEG payloads; random bytes, as the reader does not decode them here) is
read through a DataLoader with 4 workers, batches of 64 raw samples and a
10,000-sample shuffle buffer per worker, warm page cache. Measured from
creating the iterator (worker start-up included) to the first batch in hand:

- ``shardkit``: ``ShardDataset(buffer_size=10_000)`` + ``make_loader``; its
  buffer starts emitting at 100 samples and grows to its size;
- ``shardkit full fill``: the same with the buffer filled to its size before
  the first sample (what shardkit did before, ``swap_buffer_v1``), for
  reference;
- ``webdataset``: ``WebDataset(urls, shardshuffle=...).shuffle(10_000)``
  (its default ``initial=100``) in a plain DataLoader.

**Quality at the start of an epoch.** Class-sorted shards (one class per
shard, 100 classes of 500 samples; shard order shuffled per epoch, as the
reader does) read by one slot with a 10,000-sample buffer: the
``shuffle_quality`` (1.0 = i.i.d. batches) of the first N batches of 64,
growing buffer vs full fill, the growing buffer over 4 interleaved read
streams, and the growing buffer on the same labels written shuffled across
shards (``shardkit write``'s default).

Writes ``bench/results/first_batch.json`` / ``.md`` / ``.png``::

    .venv/bin/python bench/bench_first_batch.py            # ~5 GB of shards, a few minutes
    .venv/bin/python bench/bench_first_batch.py --quick    # smaller
"""

from __future__ import annotations

import argparse
import functools
import glob
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import shardkit  # noqa: E402
import shardkit.read.plan as plan_module  # noqa: E402
from bench.common import machine, plot_path, save_record  # noqa: E402
from shardkit.read.shuffle import INITIAL_FILL, SHUFFLE_ALGORITHM, ShuffleBuffer, shuffle_quality  # noqa: E402

BUFFER = 10_000
WORKERS = 4
BATCH = 64


def make_images(dest: str, *, num_samples: int, per_shard: int, sample_kb: int) -> str:
    """Shards of ``num_samples`` incompressible ~``sample_kb`` KB samples (reused if present)."""
    if os.path.exists(os.path.join(dest, "manifest.json")):
        manifest = shardkit.load_manifest(dest)
        if manifest.num_samples == num_samples:
            return dest
    payload = np.random.default_rng(0).bytes(sample_kb * 1000 * 2)
    rng = np.random.default_rng(1)
    with shardkit.ShardWriter(dest, max_samples=per_shard, max_bytes=None, overwrite=True) as writer:
        for i in range(num_samples):
            size = int(sample_kb * 1000 * rng.uniform(0.7, 1.3))
            cut = int(rng.integers(0, len(payload) - size))
            writer.write({"__key__": f"{i:08d}", "jpg": payload[cut : cut + size], "cls": str(i % 1000).encode()})
    return dest


def make_sorted(dest: str, *, num_classes: int, per_class: int) -> str:
    """Class-sorted shards: shard ``c`` holds the samples of class ``c`` only."""
    if os.path.exists(os.path.join(dest, "manifest.json")):
        return dest
    with shardkit.ShardWriter(dest, max_samples=per_class, max_bytes=None, overwrite=True) as writer:
        for c in range(num_classes):
            for i in range(per_class):
                writer.write({"__key__": f"{c:04d}_{i:05d}", "cls": str(c).encode()})
    return dest


@contextmanager
def full_fill() -> Iterator[None]:
    """The reader's buffers fill to their size before emitting (the previous
    algorithm), in this process and in workers forked from it."""
    original = plan_module.ShuffleBuffer
    plan_module.ShuffleBuffer = functools.partial(ShuffleBuffer, initial=1 << 62)  # type: ignore[misc]
    try:
        yield
    finally:
        plan_module.ShuffleBuffer = original  # type: ignore[misc]


def first_batch_s(make: Callable[[], Any]) -> float:
    """Seconds from a fresh loader's iterator to its first batch."""
    loader = make()
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    seconds = time.perf_counter() - started
    del it, loader
    return seconds


def shardkit_loader(path: str, epoch: int) -> Any:
    dataset = shardkit.ShardDataset(path, mode="balanced", seed=0, buffer_size=BUFFER)
    dataset.set_epoch(epoch)
    return shardkit.make_loader(dataset, batch_size=BATCH, num_workers=WORKERS, persistent_workers=False)


def webdataset_loader(path: str, epoch: int) -> Any:
    import webdataset as wds
    from torch.utils.data import DataLoader

    urls = sorted(glob.glob(os.path.join(path, "*.tar")))
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=epoch, empty_check=False).shuffle(BUFFER)
    return DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)


def warm(path: str) -> None:
    """Read every shard once so the page cache holds them."""
    for name in sorted(glob.glob(os.path.join(path, "*.tar"))):
        with open(name, "rb") as f:
            while f.read(16 << 20):
                pass


def measure_first_batch(path: str, repeats: int) -> dict[str, Any]:
    warm(path)
    runs: dict[str, list[float]] = {"shardkit": [], "shardkit full fill": [], "webdataset": []}
    for r in range(repeats):  # interleaved, so drift hits all alike
        runs["shardkit"].append(first_batch_s(lambda: shardkit_loader(path, r)))
        with full_fill():
            runs["shardkit full fill"].append(first_batch_s(lambda: shardkit_loader(path, r)))
        runs["webdataset"].append(first_batch_s(lambda: webdataset_loader(path, r)))
    return {name: {"median_s": statistics.median(v), "runs_s": v} for name, v in runs.items()}


def make_mixed(dest: str, *, num_classes: int, per_class: int) -> str:
    """The same labels written shuffled across shards (as ``shardkit write`` does by default)."""
    if os.path.exists(os.path.join(dest, "manifest.json")):
        return dest
    labels = np.random.default_rng(2).permutation(np.repeat(np.arange(num_classes), per_class))
    with shardkit.ShardWriter(dest, max_samples=per_class, max_bytes=None, overwrite=True) as writer:
        for i, c in enumerate(labels.tolist()):
            writer.write({"__key__": f"{i:08d}", "cls": str(c).encode()})
    return dest


def _label(sample: dict[str, Any]) -> int:
    return int(sample["cls"])


#: (row name, dataset, full fill, interleave) for the quality table.
QUALITY_ROWS = (
    ("growing", "sorted", False, 1),
    ("full fill", "sorted", True, 1),
    ("growing, interleave=4", "sorted", False, 4),
    ("growing, shards written shuffled", "mixed", False, 1),
)


def measure_quality(
    paths: dict[str, str], batch_counts: list[int]
) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, int]]]:
    """Per row of :data:`QUALITY_ROWS`, per N: ``shuffle_quality`` of the
    first N batches, and how many classes they hold."""
    out: dict[str, dict[int, float]] = {}
    classes: dict[str, dict[int, int]] = {}
    most = max(batch_counts) * BATCH
    for name, data, fill, interleave in QUALITY_ROWS:
        dataset = shardkit.ShardDataset(
            paths[data], mode="exact", seed=0, buffer_size=BUFFER, interleave=interleave, map=_label
        )
        if fill:
            with full_fill():
                labels = [label for label, _ in zip(dataset, range(most))]
        else:
            labels = [label for label, _ in zip(dataset, range(most))]
        out[name] = {n: shuffle_quality(labels[: n * BATCH], batch_size=BATCH) for n in batch_counts}
        classes[name] = {n: len(set(labels[: n * BATCH])) for n in batch_counts}
    return out, classes


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(record["first_batch"])
    left.bar(names, [record["first_batch"][n]["median_s"] for n in names], color=["C0", "C7", "C1"][: len(names)])
    left.set_ylabel("seconds to first batch (median)")
    left.set_title(f"buffer {BUFFER:,}, {WORKERS} workers, ~110 KB samples")
    for name, series in record["quality"].items():
        xs = sorted(int(k) for k in series)
        right.plot(xs, [series[str(x)] if str(x) in series else series[x] for x in xs], marker="o", label=name)
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    right.set_xscale("log")
    right.set_xlabel("first N batches of 64")
    right.set_ylabel("shuffle_quality (1.0 = i.i.d.)")
    right.set_title(f"epoch start, buffer {BUFFER:,} (class-sorted shards unless noted)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def table(record: dict[str, Any]) -> str:
    lines = [
        f"## Time to first batch (buffer {BUFFER:,}, {WORKERS} workers, batches of {BATCH}, "
        f"~{record['sample_kb']} KB samples, warm cache)",
        "",
        "| reader | median s | runs s |",
        "|---|---|---|",
    ]
    for name, v in record["first_batch"].items():
        runs = ", ".join(f"{s:.2f}" for s in v["runs_s"])
        lines.append(f"| {name} | {v['median_s']:.2f} | {runs} |")
    lines += [
        "",
        f"## shuffle_quality of the first N batches (class-sorted shards, buffer {BUFFER:,}; 1.0 = i.i.d.)",
        "",
        "| buffer | " + " | ".join(f"N={n}" for n in record["batch_counts"]) + " |",
        "|---|" + "---|" * len(record["batch_counts"]),
    ]
    for name, series in record["quality"].items():
        lines.append(f"| {name} | " + " | ".join(f"{series[n]:.2f}" for n in record["batch_counts"]) + " |")
    lines += [
        "",
        "Classes (of 100) in the first N batches:",
        "",
        "| buffer | " + " | ".join(f"N={n}" for n in record["batch_counts"]) + " |",
        "|---|" + "---|" * len(record["batch_counts"]),
    ]
    for name, series in record["classes_seen"].items():
        lines.append(f"| {name} | " + " | ".join(str(series[n]) for n in record["batch_counts"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "first_batch"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "first_batch.json"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smaller image set (the buffers are then not full)")
    args = parser.parse_args(argv)
    num_samples = 8_000 if args.quick else 44_000
    sample_kb = 110
    images = make_images(
        os.path.join(args.workdir, f"images-{num_samples}"), num_samples=num_samples, per_shard=1000, sample_kb=sample_kb
    )
    quality_data = {
        "sorted": make_sorted(os.path.join(args.workdir, "sorted"), num_classes=100, per_class=500),
        "mixed": make_mixed(os.path.join(args.workdir, "mixed"), num_classes=100, per_class=500),
    }
    batch_counts = [5, 20, 50, 100, 200, 300, 500]
    record: dict[str, Any] = {
        "machine": machine(),
        "shuffle_algorithm": SHUFFLE_ALGORITHM,
        "initial_fill": INITIAL_FILL,
        "buffer_size": BUFFER,
        "num_workers": WORKERS,
        "batch_size": BATCH,
        "num_samples": num_samples,
        "sample_kb": sample_kb,
        "first_batch": measure_first_batch(images, args.repeats),
        "batch_counts": batch_counts,
    }
    record["quality"], record["classes_seen"] = measure_quality(quality_data, batch_counts)
    save_record(args.out, record, table(record))
    plot(record, plot_path(args.out))
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
