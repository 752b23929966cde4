#!/usr/bin/env python3
"""Decoded-image throughput: shardkit's fused transforms vs webdataset and ImageFolder.

Two photo-like sets from ``tools/gen_photos.py``, each written both as tar
shards and as an ImageFolder tree: ImageNet-like (~500x375, ~110 KB) and
high-resolution (~1600x1200, ~500 KB). Every peer reads its set through a
DataLoader with 2 persistent workers in batches of 32 uint8 ``3 x 224 x 224``
tensors, without shuffling, and is timed over whole epochs after a warm-up
epoch (which also warms the page cache and starts the workers):

- train: ``shardkit.ShardDataset`` + ``MapField("jpg", DecodeRandomResizedCrop(224))``
  vs ``webdataset.WebDataset(...).decode("pil")`` + torchvision v2
  ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()`` + ``ToImage()`` +
  ``ToDtype(uint8)`` vs ``torchvision.datasets.ImageFolder`` + the same
  torchvision transforms;
- eval: the same with ``DecodeResizeCenterCrop(224)`` against ``Resize(256)``
  + ``CenterCrop(224)``.

Peers alternate within each repeat and the best repeat counts. Reports
images/s per worker core (images/s divided by the 2 workers) and shardkit's
ratio to webdataset. Targets (issue 17): train >= 1.5x webdataset on the
ImageNet-like set and >= 2.5x on the high-resolution set; eval >= 2x on the
high-resolution set. Writes ``bench/results/decode.json``, ``.md`` and ``.png``:

    .venv/bin/python bench/bench_decode.py                 # ~4 minutes on 2 cores
    .venv/bin/python bench/bench_decode.py --quick         # smaller sets, one repeat
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import torch  # noqa: E402

import shardkit  # noqa: E402
from bench.common import machine, plot_path, save_record  # noqa: E402
from gen_photos import photo_jpegs  # noqa: E402
from shardkit.transforms import DecodeRandomResizedCrop, DecodeResizeCenterCrop, MapField  # noqa: E402

NUM_WORKERS = 2
BATCH_SIZE = 32
SIZE = 224
SETS = {"imagenet": "ImageNet-like ~500x375", "highres": "high-res ~1600x1200"}
TARGETS = {("train", "imagenet"): 1.5, ("train", "highres"): 2.5, ("eval", "highres"): 2.0}
PEERS = ("shardkit", "webdataset", "imagefolder")


def make_set(work: str, preset: str, count: int) -> tuple[str, str, list[str], float]:
    """Shards and an ImageFolder tree of ``count`` photos; reused when present.

    Returns:
        The shard folder, the ImageFolder root, the shard paths and the mean JPEG size in KB.
    """
    root = os.path.join(work, f"{preset}-{count}")
    shards, folder = os.path.join(root, "shards"), os.path.join(root, "folder")
    if not os.path.exists(os.path.join(shards, "manifest.json")):
        images = photo_jpegs(preset, count, seed=0)
        per_shard = max(count // 8, 1)
        with shardkit.ShardWriter(shards, max_samples=per_shard, max_bytes=None, overwrite=True) as writer:
            for i, data in enumerate(images):
                label = i % 10
                writer.write({"__key__": f"{i:06d}", "jpg": data, "cls": str(label).encode()})
                sub = os.path.join(folder, f"class_{label:02d}")
                os.makedirs(sub, exist_ok=True)
                with open(os.path.join(sub, f"{i:06d}.jpg"), "wb") as f:
                    f.write(data)
    manifest = shardkit.load_manifest(shards)
    paths = sorted(os.path.join(shards, name) for name in os.listdir(shards) if name.endswith(".tar"))
    mean_kb = sum(os.path.getsize(p) for p in paths) / manifest.num_samples / 1000
    return shards, folder, paths, mean_kb


def torchvision_transform(kind: str) -> Callable[[Any], torch.Tensor]:
    import torchvision.transforms.v2 as T

    if kind == "train":
        steps = [T.RandomResizedCrop(SIZE, antialias=True), T.RandomHorizontalFlip()]
    else:
        steps = [T.Resize(256, antialias=True), T.CenterCrop(SIZE)]
    return T.Compose([*steps, T.ToImage(), T.ToDtype(torch.uint8)])


def make_loader(peer: str, kind: str, shards: str, folder: str, paths: list[str]) -> Iterable[Any]:
    """A DataLoader (2 persistent workers, batches of 32) for one peer and transform."""
    if peer == "shardkit":
        fused = DecodeRandomResizedCrop(SIZE) if kind == "train" else DecodeResizeCenterCrop(SIZE)
        dataset = shardkit.ShardDataset(
            shards, mode="exact", shuffle=False, decode=shardkit.Decoder(image=None), map=MapField("jpg", fused)
        )
        return shardkit.make_loader(dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS)
    transform = torchvision_transform(kind)
    if peer == "webdataset":
        import webdataset as wds

        wds_set = wds.WebDataset(paths, shardshuffle=False, empty_check=False).decode("pil")
        wds_set = wds_set.to_tuple("jpg", "cls").map_tuple(transform, lambda label: label)
        return torch.utils.data.DataLoader(
            wds_set, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS, persistent_workers=True
        )
    from torchvision.datasets import ImageFolder

    return torch.utils.data.DataLoader(
        ImageFolder(folder, transform=transform), batch_size=BATCH_SIZE, num_workers=NUM_WORKERS,
        persistent_workers=True,
    )  # fmt: skip


def batch_images(batch: Any) -> torch.Tensor:
    return batch["jpg"] if isinstance(batch, dict) else batch[0]


def time_epochs(loader: Iterable[Any], epochs: int) -> tuple[float, int]:
    """Images per second over ``epochs`` epochs after one warm-up epoch; also the epoch's image count."""
    count = 0
    for batch in loader:
        images = batch_images(batch)
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, SIZE, SIZE), images.shape
        count += len(images)
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            batch_images(batch)
    return count * epochs / (time.perf_counter() - start), count


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for ax, kind in zip(axes, ("train", "eval")):
        labels = list(SETS)
        width = 0.26
        for n, peer in enumerate(PEERS):
            values = [record["results"][kind][name][peer]["per_core"] for name in labels]
            ax.bar([i + (n - 1) * width for i in range(len(labels))], values, width, label=peer)
        ax.set_xticks(range(len(labels)), [SETS[name] for name in labels])
        ax.set_title(f"{kind} transform to 224 (images/s per worker core)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imagenet-count", type=int, default=480)
    parser.add_argument("--highres-count", type=int, default=160)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many (peers alternate)")
    parser.add_argument("--quick", action="store_true", help="96 + 32 images, one repeat")
    parser.add_argument("--work", default=os.path.join(HERE, "work", "decode"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "decode.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.imagenet_count, args.highres_count, args.repeats = 96, 32, 1
    counts = {"imagenet": args.imagenet_count, "highres": args.highres_count}
    results: dict[str, dict[str, dict[str, dict[str, float]]]] = {"train": {}, "eval": {}}
    sizes: dict[str, float] = {}
    for name in SETS:
        shards, folder, paths, sizes[name] = make_set(args.work, name, counts[name])
        for kind in ("train", "eval"):
            best = dict.fromkeys(PEERS, 0.0)
            for _ in range(args.repeats):
                for peer in PEERS:
                    torch.manual_seed(0)
                    loader = make_loader(peer, kind, shards, folder, paths)
                    rate, seen = time_epochs(loader, args.epochs)
                    assert seen == counts[name], (peer, seen)
                    best[peer] = max(best[peer], rate)
                    del loader
            results[kind][name] = {
                peer: {"images_per_s": best[peer], "per_core": best[peer] / NUM_WORKERS} for peer in PEERS
            }
    lines = [
        f"Per worker core, {NUM_WORKERS} DataLoader workers, batches of {BATCH_SIZE} uint8 3x{SIZE}x{SIZE}, "
        "warm page cache.",
        "",
        "| transform | set | shardkit fused /s/core | webdataset+tv /s/core | ImageFolder+tv /s/core | "
        "vs webdataset | target |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in ("train", "eval"):
        for name in SETS:
            row = results[kind][name]
            ratio = row["shardkit"]["images_per_s"] / row["webdataset"]["images_per_s"]
            row["ratio_vs_webdataset"] = ratio  # type: ignore[assignment]
            target = TARGETS.get((kind, name))
            lines.append(
                f"| {kind} | {SETS[name]} ({sizes[name]:.0f} KB) | {row['shardkit']['per_core']:.0f} | "
                f"{row['webdataset']['per_core']:.0f} | {row['imagefolder']['per_core']:.0f} | {ratio:.2f}x | "
                + (f">= {target}x" if target else "") + " |"
            )
    table = "\n".join(lines) + "\n"
    record = {"machine": machine(), "counts": counts, "mean_kb": sizes, "epochs": args.epochs,
              "repeats": args.repeats, "results": results}  # fmt: skip
    save_record(args.out, record, table)
    plot(record, plot_path(args.out))
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
