"""Shuffle quality against buffer size, shardkit and webdataset.

The data is the hard case: samples written sorted by class (as a careless
packing of an ImageFolder tree would be), tiny payloads, many shards. Both
readers shuffle the shard order and then mix samples through a buffer of the
given size, reading in one process (one stream: the worst case, since
DataLoader workers interleave and so mix further).

Measures, from :mod:`shardkit.read.shuffle`:

* ``quality``: mean label-histogram distance of batches of 32 from the whole
  stream's, relative to a uniform random permutation (1.0 is as mixed as
  i.i.d. sampling; larger is worse).
* ``displacement``: mean ``|output index - input index|``, divided by its
  value for a uniform permutation (``n / 3``), so 1.0 is fully spread.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any

import numpy as np

NUM_CLASSES = 100
BATCH = 32


def ensure_sorted_shards(root: str, num_samples: int, num_shards: int) -> str:
    """Shards of ``num_samples`` tiny samples, sorted by class."""
    from shardkit import ShardWriter
    from shardkit.format.manifest import MANIFEST_NAME

    folder = os.path.join(root, f"sorted-{num_samples}-{num_shards}")
    if os.path.exists(os.path.join(folder, MANIFEST_NAME)):
        return folder
    per_shard = -(-num_samples // num_shards)
    with ShardWriter(folder, max_samples=per_shard, max_bytes=None, overwrite=True) as writer:
        for i in range(num_samples):
            label = i * NUM_CLASSES // num_samples
            writer.write({"__key__": f"k{i:08d}", "bin": b"x" * 16, "cls": label})
    return folder


def _stream_shardkit(folder: str, buffer_size: int, seed: int) -> list[tuple[int, int]]:
    import shardkit

    dataset = shardkit.ShardDataset(folder, mode="exact", seed=seed, shuffle=True, buffer_size=buffer_size)
    return [(int(s["__key__"][1:]), int(s["cls"])) for s in dataset]


def _stream_webdataset(folder: str, buffer_size: int, seed: int) -> list[tuple[int, int]]:
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(folder, "*.tar")))
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False)
    if buffer_size > 1:
        dataset = dataset.shuffle(buffer_size)
    return [(int(s["__key__"][1:]), int(s["cls"])) for s in dataset]


STREAMS = {"shardkit": _stream_shardkit, "webdataset": _stream_webdataset}


def score(stream: list[tuple[int, int]]) -> dict[str, float]:
    from shardkit.read.shuffle import mean_displacement, shuffle_quality

    positions = np.array([p for p, _ in stream])
    labels = np.array([label for _, label in stream])
    n = len(stream)
    return {
        "quality": shuffle_quality(labels, batch_size=BATCH),
        "displacement": mean_displacement(positions) / (n / 3) if n else 0.0,
        "samples": n,
    }


def measure(root: str, buffer_sizes: tuple[int, ...], *, num_samples: int = 20_000, num_shards: int = 40,
            seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """Both readers at every buffer size; figures are means over seeds."""
    started = time.time()
    folder = ensure_sorted_shards(root, num_samples, num_shards)
    rows = []
    for reader, stream_fn in STREAMS.items():
        for size in buffer_sizes:
            scores = [score(stream_fn(folder, size, seed)) for seed in seeds]
            rows.append(
                {
                    "reader": reader,
                    "buffer_size": size,
                    "quality": float(np.mean([s["quality"] for s in scores])),
                    "displacement": float(np.mean([s["displacement"] for s in scores])),
                    "samples": scores[0]["samples"],
                }
            )
    return {
        "num_samples": num_samples,
        "num_shards": num_shards,
        "num_classes": NUM_CLASSES,
        "batch_size": BATCH,
        "seeds": list(seeds),
        "rows": rows,
        "seconds": time.time() - started,
    }
