#!/usr/bin/env python3
"""Reader benchmark: shardkit vs webdataset, tarfile and ImageFolder, side by side.

Part 1, CPU per sample (one process, files in the page cache): iterate every
sample as raw bytes, on (a) small samples of ~1.5 KB text + JSON and (b)
~110 KB JPEG-like images. Readers: Python's ``tarfile``, ``webdataset``,
``shardkit``; both tar-stream readers also with a 1,000-sample shuffle buffer.

Part 2, DataLoader throughput on the images with 1, 2 and 4 workers, warm
(page cache) and cold (``posix_fadvise(DONTNEED)`` on every file first):
shardkit (``make_loader``), webdataset, and torchvision ``ImageFolder``
loading raw bytes. All shuffle (shard order + 1,000-sample buffer for the tar
readers, a random permutation for ImageFolder) and batch 64 samples.

Part 3, shuffle quality of one worker's stream on class-sorted data with a
1,000-sample buffer, shardkit vs webdataset (see ``shardkit.shuffle_quality``).

Writes ``bench/results/reader.json`` and prints a Markdown table.

    .venv/bin/python bench/bench_reader.py --quick   # ~2-3 minutes
    .venv/bin/python bench/bench_reader.py           # full sizes
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import shardkit  # noqa: E402
from bench.common import machine, save_record  # noqa: E402
from shardkit.read.shuffle import mean_displacement  # noqa: E402

BATCH = 64
BUFFER = 1000
CLASSES = 10


# ---------------------------------------------------------------- data


def _text(rng: np.random.Generator, size: int) -> bytes:
    words = rng.integers(97, 123, size=size, dtype=np.uint8)
    words[rng.random(size) < 0.15] = 32
    return words.tobytes()


def make_small(dest: str, count: int) -> str:
    """~1.5 KB samples (txt ~1,000 B + json ~500 B), written class-sorted."""
    shards = os.path.join(dest, "shards")
    if os.path.exists(os.path.join(shards, "manifest.json")):
        return shards
    rng = np.random.default_rng(0)
    with shardkit.ShardWriter(shards, max_samples=max(count // 20, 1000), overwrite=True) as writer:
        for i in range(count):
            label = i * CLASSES // count
            meta = {"i": i, "label": label, "caption": _text(rng, 420).decode()}
            writer.write({"__key__": f"{i:08d}", "txt": _text(rng, 1000), "json": json.dumps(meta).encode()})
    return shards


def _jpeg(rng: np.random.Generator, side: int) -> bytes:
    from PIL import Image

    pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_images(dest: str, count: int) -> tuple[str, str]:
    """~110 KB noise JPEGs as an ImageFolder tree and as shards (8+ shards)."""
    folder = os.path.join(dest, "imagefolder")
    shards = os.path.join(dest, "shards")
    if os.path.exists(os.path.join(shards, "manifest.json")):
        return folder, shards
    rng = np.random.default_rng(1)
    names = [f"class_{c}" for c in range(CLASSES)]
    with shardkit.ShardWriter(shards, max_samples=max(count // 8, 1), class_names=names, overwrite=True) as writer:
        for i in range(count):
            label = i * CLASSES // count
            data = _jpeg(rng, 352)
            os.makedirs(os.path.join(folder, names[label]), exist_ok=True)
            with open(os.path.join(folder, names[label], f"{i:08d}.jpg"), "wb") as f:
                f.write(data)
            writer.write({"__key__": f"{i:08d}", "jpg": data, "cls": str(label).encode()})
    return folder, shards


def _files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]


def warm(root: str) -> None:
    for path in _files(root):
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


def evict(root: str) -> None:
    """Drop ``root``'s files from the page cache (cold-cache runs)."""
    for path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def tar_urls(shards: str) -> list[str]:
    return sorted(os.path.join(shards, f) for f in os.listdir(shards) if f.endswith(".tar"))


# ---------------------------------------------------------------- readers


def read_tarfile(shards: str) -> Iterator[dict[str, Any]]:
    for url in tar_urls(shards):
        with tarfile.open(url, mode="r|") as tar:
            current: dict[str, Any] = {}
            for member in tar:
                if not member.isfile():
                    continue
                key, _, ext = member.name.partition(".")
                if current and current["__key__"] != key:
                    yield current
                    current = {}
                current["__key__"] = key
                current[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
            if current:
                yield current


def read_webdataset(shards: str, *, shuffle: bool) -> Iterable[dict[str, Any]]:
    import webdataset as wds

    ds = wds.WebDataset(tar_urls(shards), shardshuffle=100 if shuffle else False, empty_check=False, seed=0)
    return ds.shuffle(BUFFER, initial=BUFFER) if shuffle else ds


def read_shardkit(shards: str, *, shuffle: bool) -> Iterable[dict[str, Any]]:
    return shardkit.ShardDataset(shards, mode="exact", shuffle=shuffle, buffer_size=BUFFER)


def time_iteration(make: Callable[[], Iterable[Any]], *, count_of: Callable[[Any], int] = lambda _: 1) -> tuple[int, float]:
    started = time.perf_counter()
    count = sum(count_of(item) for item in make())
    return count, time.perf_counter() - started


def cpu_part(name: str, shards: str, repeats: int) -> list[dict[str, Any]]:
    warm(shards)
    readers: dict[str, Callable[[], Iterable[Any]]] = {
        "tarfile": lambda: read_tarfile(shards),
        "webdataset": lambda: read_webdataset(shards, shuffle=False),
        "shardkit": lambda: read_shardkit(shards, shuffle=False),
        "webdataset + shuffle": lambda: read_webdataset(shards, shuffle=True),
        "shardkit + shuffle": lambda: read_shardkit(shards, shuffle=True),
    }
    rows = []
    for reader, make in readers.items():
        best = min((time_iteration(make) for _ in range(repeats)), key=lambda r: r[1])
        rows.append({"data": name, "reader": reader, "samples": best[0], "seconds": best[1], "samples_per_s": best[0] / best[1]})
        print(f"  cpu {name:6s} {reader:22s} {best[0] / best[1]:10.0f} samples/s", flush=True)
    return rows


# ------------------------------------------------------- DataLoader part


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _batch_len(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(batch["__key__"])
    return len(batch[1])


def loader_for(reader: str, folder: str, shards: str, workers: int) -> Iterable[Any]:
    import torch
    from torch.utils.data import DataLoader

    if reader == "shardkit":
        ds = shardkit.ShardDataset(shards, mode="exact", buffer_size=BUFFER)
        return shardkit.make_loader(ds, batch_size=BATCH, num_workers=workers, persistent_workers=False)
    if reader == "webdataset":
        return DataLoader(read_webdataset(shards, shuffle=True), batch_size=BATCH, num_workers=workers)  # type: ignore[arg-type]
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(folder, loader=_read_bytes)
    return DataLoader(ds, batch_size=BATCH, num_workers=workers, shuffle=True, generator=torch.Generator().manual_seed(0))


def time_loader(loader: Iterable[Any]) -> dict[str, Any]:
    """Whole-epoch time, and steady-state rate after the first batch (worker
    start-up excluded: it is the same for every reader and dominates small runs)."""
    started = time.perf_counter()
    batches = iter(loader)
    count = _batch_len(next(batches))
    first = time.perf_counter()
    steady = sum(_batch_len(b) for b in batches)
    done = time.perf_counter()
    return {
        "samples": count + steady,
        "seconds": done - started,
        "first_batch_s": first - started,
        "samples_per_s": steady / (done - first),
    }


def loader_part(folder: str, shards: str, worker_counts: list[int]) -> list[dict[str, Any]]:
    rows = []
    for cache in ("warm", "cold"):
        for workers in worker_counts:
            for reader in ("shardkit", "webdataset", "imagefolder"):
                root = folder if reader == "imagefolder" else shards
                if cache == "cold":
                    evict(root)
                else:
                    warm(root)
                row = time_loader(loader_for(reader, folder, shards, workers))
                rows.append({"cache": cache, "workers": workers, "reader": reader, **row})
                print(
                    f"  loader {cache} {workers}w {reader:12s} {row['samples_per_s']:8.0f} images/s steady, "
                    f"{row['samples'] / row['seconds']:8.0f} incl. start-up",
                    flush=True,
                )
    return rows


# ---------------------------------------------------------- shuffle part


def shuffle_part(shards: str) -> list[dict[str, Any]]:
    def measure(name: str, samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
        metas = [json.loads(s["json"]) for s in samples]
        labels = [m["label"] for m in metas]
        return {
            "reader": name,
            "buffer": BUFFER,
            "batch_divergence_vs_iid": shardkit.shuffle_quality(labels, batch_size=BATCH),
            "mean_displacement": mean_displacement([m["i"] for m in metas]),
        }

    rows = [
        measure("no shuffle", read_shardkit(shards, shuffle=False)),
        measure("webdataset", read_webdataset(shards, shuffle=True)),
        measure("shardkit", read_shardkit(shards, shuffle=True)),
        measure("shardkit interleave=4", shardkit.ShardDataset(shards, mode="exact", buffer_size=BUFFER, interleave=4)),
    ]
    for row in rows:
        print(f"  shuffle {row['reader']:22s} divergence/iid {row['batch_divergence_vs_iid']:6.2f}  displacement {row['mean_displacement']:9.0f}")
    return rows


# ---------------------------------------------------------------- report


def markdown(result: dict[str, Any]) -> str:
    lines = ["## CPU per sample (one process, page cache)", "", "| data | reader | samples/s | vs webdataset |", "|---|---|---:|---:|"]
    for data in ("small", "images"):
        rows = [r for r in result["cpu"] if r["data"] == data]
        base = {r["reader"]: r["samples_per_s"] for r in rows}
        for r in rows:
            ref = base["webdataset + shuffle" if "shuffle" in r["reader"] else "webdataset"]
            lines.append(f"| {data} | {r['reader']} | {r['samples_per_s']:,.0f} | {r['samples_per_s'] / ref:.2f}x |")
    lines += ["", "## DataLoader images/s (batch 64, shuffled; steady state after the first batch)", ""]
    workers = sorted({r["workers"] for r in result["loader"]})
    lines.append("| cache | reader | " + " | ".join(f"{w} workers" for w in workers) + " |")
    lines.append("|---|---|" + "---:|" * len(workers))
    for cache in ("warm", "cold"):
        for reader in ("shardkit", "webdataset", "imagefolder"):
            cells = [next(r for r in result["loader"] if r["cache"] == cache and r["reader"] == reader and r["workers"] == w)["samples_per_s"] for w in workers]
            lines.append(f"| {cache} | {reader} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
    lines += ["", f"## Shuffle quality (buffer {BUFFER}, class-sorted data, batch {BATCH}; 1.0 = i.i.d.)", "",
              "| reader | batch label divergence / i.i.d. | mean displacement |", "|---|---:|---:|"]
    for r in result["shuffle"]:
        lines.append(f"| {r['reader']} | {r['batch_divergence_vs_iid']:.2f} | {r['mean_displacement']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (20k small samples, 2,000 images)")
    parser.add_argument("--small", type=int, help="number of small samples (default 200,000; quick 20,000)")
    parser.add_argument("--images", type=int, help="number of images (default 6,000; quick 2,000)")
    parser.add_argument("--workers", default="1,2,4", help="DataLoader worker counts")
    parser.add_argument("--repeats", type=int, default=3, help="CPU runs per reader; the best counts")
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "reader"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "reader.json"))
    args = parser.parse_args(argv)
    num_small = args.small or (20_000 if args.quick else 200_000)
    num_images = args.images or (2_000 if args.quick else 6_000)
    repeats = args.repeats
    print(f"# data in {args.workdir}: {num_small} small samples, {num_images} images", flush=True)
    small = make_small(os.path.join(args.workdir, f"small-{num_small}"), num_small)
    folder, images = make_images(os.path.join(args.workdir, f"images-{num_images}"), num_images)
    image_bytes = sum(os.path.getsize(p) for p in _files(folder)) / num_images
    result: dict[str, Any] = {
        "machine": machine(),
        "sizes": {"small_samples": num_small, "images": num_images, "mean_image_bytes": image_bytes},
        "cpu": cpu_part("small", small, repeats) + cpu_part("images", images, repeats),
        "loader": loader_part(folder, images, [int(w) for w in args.workers.split(",")]),
        "shuffle": shuffle_part(small),
    }
    table = markdown(result)
    save_record(args.out, result, table)
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
