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
from typing import Any

LOADERS = ("imagefolder", "webdataset", "shardkit")
#: Experiments, not in the default table: ``shardkit-serial`` is shardkit
#: with one device lock shared by all workers around each 32 MiB read, the
#: remedy proposed for interleaving streams on a disk head (see
#: :func:`serialize_local_reads`).
EXPERIMENTS = ("shardkit-serial",)
#: Read size of the ``shardkit-serial`` experiment.
SERIAL_CHUNK_BYTES = 32 << 20
#: Lock file shared by the workers of ``shardkit-serial``.
SERIAL_LOCK_PATH = "/dev/shm/shardkit-bench-device.lock"
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


def serialize_local_reads(lock_path: str = SERIAL_LOCK_PATH) -> None:
    """Make every ``read()`` of shardkit's local file source hold an
    exclusive ``flock`` on ``lock_path``, so at most one process (DataLoader
    workers included) has a read in flight: each chunk then streams from the
    disk without another worker's requests in between. A bench-only patch
    of :class:`shardkit.read.sources.LocalFile`, to measure the idea before
    the reader adopts it."""
    import fcntl

    from shardkit.read import sources

    if getattr(sources.LocalFile, "_bench_serialized", False):
        return

    def iter_range(self: Any, start: int, end: int | None, *, chunk_bytes: int) -> Any:
        with open(self.path, "rb", buffering=0) as f, open(lock_path, "a") as lock:
            f.seek(start)
            remaining = None if end is None else end - start
            while remaining is None or remaining > 0:
                want = chunk_bytes if remaining is None else min(chunk_bytes, remaining)
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    chunk = f.read(want)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                if not chunk:
                    return
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk

    sources.LocalFile.iter_range = iter_range
    sources.LocalFile._bench_serialized = True


def build(name: str, root: str, *, workers: int, buffer_size: int, limit: int, seed: int) -> Any:
    """A DataLoader yielding ``(images, bytes)`` per batch.

    Args:
        name: One of :data:`LOADERS`.
        root: The ImageFolder tree (``imagefolder``) or shard folder.
        workers: DataLoader worker processes.
        buffer_size: Shuffle buffer (streaming loaders), samples per worker.
        limit: Images read by ``imagefolder`` (random subset, random order).
        seed: Seed of every random choice.
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
    if name in ("shardkit", "shardkit-serial"):
        try:
            import shardkit
            from shardkit.read.loader import make_loader
            from shardkit.read.sources import SourceOptions
        except ImportError as exc:
            raise LoaderUnavailable(f"shardkit reader not importable: {exc}") from None
        extra: dict[str, Any] = {}
        if name == "shardkit-serial":
            serialize_local_reads()
            extra["source_options"] = SourceOptions(chunk_bytes=SERIAL_CHUNK_BYTES)
        dataset = shardkit.ShardDataset(
            root,
            mode="balanced",
            seed=seed,
            shuffle=True,
            buffer_size=buffer_size,
            batch_size=BATCH,
            collate=_count_samples,
            **extra,
        )
        return make_loader(dataset, num_workers=workers, persistent_workers=False)
    raise ValueError(f"unknown loader {name!r}; known: {', '.join(LOADERS + EXPERIMENTS)}")


def run(name: str, root: str, *, workers: int, buffer_size: int, limit: int, seed: int) -> dict[str, Any]:
    """Build the loader, read one pass, and time it (building excluded)."""
    loader = build(name, root, workers=workers, buffer_size=buffer_size, limit=limit, seed=seed)
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
