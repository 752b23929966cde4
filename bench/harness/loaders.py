"""The three loaders the throughput table compares, reading raw bytes.

Every loader reads whole samples in its DataLoader workers, batches there, and
sends only ``(images, bytes)`` counts to the main process, so the figures are
about storage, not about pickling JPEGs between processes (nothing decodes).

* ``imagefolder``: torchvision's ImageFolder, ``limit`` images in random order.
* ``webdataset``: shard shuffle plus webdataset's shuffle buffer.
* ``shardkit``: :class:`shardkit.ShardDataset` in balanced mode with the same
  buffer size, through :func:`shardkit.read.loader.make_loader`.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from typing import Any

LOADERS = ("imagefolder", "webdataset", "shardkit")
#: Experiments, not in the default table: ``shardkit-nolock`` is shardkit
#: with its device lock off (``SourceOptions(device_lock=False)``), every
#: worker reading whenever it likes, to show what taking turns on a disk buys.
EXPERIMENTS = ("shardkit-nolock",)
#: Samples per batch inside the workers.
BATCH = 32


class LoaderUnavailable(RuntimeError):
    """The loader cannot run here (e.g. shardkit's reader is not installed)."""


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _count_pairs(batch: list[tuple[bytes, int]]) -> tuple[int, int]:
    return len(batch), sum(len(data) for data, _label in batch)


def _count_samples(batch: list[dict[str, Any]]) -> tuple[int, int]:
    return len(batch), sum(len(sample["jpg"]) for sample in batch)


def build(
    name: str, root: str, *, workers: int, buffer_size: int, limit: int, seed: int, device_lock: str | bool = "auto"
) -> Any:
    """A DataLoader yielding ``(images, bytes)`` per batch.

    Args:
        name: One of :data:`LOADERS`.
        root: The ImageFolder tree (``imagefolder``) or shard folder.
        workers: DataLoader worker processes.
        buffer_size: Shuffle buffer (streaming loaders), samples per worker.
        limit: Images read by ``imagefolder`` (random subset, random order).
        seed: Seed of every random choice.
        device_lock: shardkit's ``SourceOptions.device_lock`` (``"auto"``
            detects a spinning disk; a FUSE profile says so with True).
    """
    from torch.utils.data import DataLoader, Subset

    if name == "imagefolder":
        import numpy as np
        from torchvision.datasets import ImageFolder

        dataset = ImageFolder(root, loader=_read_file)
        order = np.random.default_rng(seed).permutation(len(dataset))[:limit]
        return DataLoader(
            Subset(dataset, order.tolist()), batch_size=BATCH, num_workers=workers, collate_fn=_count_pairs
        )
    if name == "webdataset":
        import webdataset as wds

        urls = sorted(glob.glob(os.path.join(root, "*.tar")))
        dataset = (
            wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False)
            .shuffle(buffer_size)
            .batched(BATCH, collation_fn=_count_samples)
        )
        return DataLoader(dataset, batch_size=None, num_workers=workers)
    if name in ("shardkit", "shardkit-nolock"):
        try:
            import shardkit
            from shardkit.io.base import SourceOptions
            from shardkit.read.loader import make_loader
        except ImportError as exc:
            raise LoaderUnavailable(f"shardkit reader not importable: {exc}") from None
        options = SourceOptions(device_lock=False if name == "shardkit-nolock" else device_lock)
        dataset = shardkit.ShardDataset(
            root,
            mode="balanced",
            seed=seed,
            shuffle=True,
            buffer_size=buffer_size,
            batch_size=BATCH,
            collate=_count_samples,
            source_options=options,
        )
        return make_loader(dataset, num_workers=workers, persistent_workers=False)
    raise ValueError(f"unknown loader {name!r}; known: {', '.join(LOADERS + EXPERIMENTS)}")


def run(name: str, root: str, *, before_timing: Callable[[], None] | None = None, **options: Any) -> dict[str, Any]:
    """Build the loader (``options`` as for :func:`build`), call
    ``before_timing`` (e.g. to drop caches), read one pass, and time it
    (building excluded)."""
    loader = build(name, root, **options)
    if before_timing is not None:
        before_timing()
    images = num_bytes = 0
    first_s = None
    start = time.perf_counter()
    for count, size in loader:
        if first_s is None:
            first_s = time.perf_counter() - start
        images += int(count)
        num_bytes += int(size)
    seconds = time.perf_counter() - start
    return {
        "images": images,
        "bytes": num_bytes,
        "seconds": seconds,
        "first_batch_s": first_s,
        "images_per_s": images / seconds if seconds > 0 else 0.0,
        "mb_per_s": num_bytes / seconds / 1e6 if seconds > 0 else 0.0,
    }
