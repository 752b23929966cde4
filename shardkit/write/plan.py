"""Planning: which sample goes into which shard, decided before any writing.

The plan is a pure function of the scanned samples, the limits and the seed,
so the output never depends on how many processes write it, and each
:class:`ShardTask` is a self-contained, picklable unit of work that any
process (or another machine) can execute with :func:`shardkit.write.parallel.write_shard`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardkit.format.tar import END_OF_ARCHIVE, encoded_sample_size
from shardkit.write.destination import shard_name
from shardkit.write.inputs import InputSample
from shardkit.write.limits import ShardLimits


@dataclass(frozen=True)
class ShardTask:
    """Everything needed to write one shard.

    Attributes:
        index: Shard number.
        name: File name of the shard (``shard-000042.tar``).
        samples: Samples in the order they are written.
        planned_bytes: Tar size if every sample is written as planned.
        fingerprint: Hash of what goes in (keys, sources, sizes): a resumed run
            reuses an existing shard only when its task fingerprint matches.
    """

    index: int
    name: str
    samples: tuple[InputSample, ...]
    planned_bytes: int
    fingerprint: str


def sample_order(num_samples: int, *, seed: int, shuffle: bool) -> np.ndarray:
    """The write order of samples: a seeded permutation, or identity."""
    if not shuffle:
        return np.arange(num_samples)
    return np.random.Generator(np.random.PCG64(seed)).permutation(num_samples)


def _fingerprint(samples: Sequence[InputSample]) -> str:
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(sample.key.encode("utf-8", "surrogateescape") + b"\0")
        if sample.tar_range is not None:
            # An unpacked copy of a compressed input lives at a new path each
            # run: the input's own path identifies the sample.
            path, start, end = sample.tar_range
            digest.update(repr((sample.tar_origin or path, start, end)).encode("utf-8", "surrogateescape"))
        for f in sample.fields:
            digest.update(f"{f.ext}\0{f.size}\0{f.path}\0".encode("utf-8", "surrogateescape"))
            if f.data is not None:
                digest.update(hashlib.sha256(f.data).digest())
    return digest.hexdigest()


def plan_shards(
    samples: Sequence[InputSample], *, limits: ShardLimits, seed: int = 0, shuffle: bool = True
) -> tuple[list[ShardTask], list[InputSample]]:
    """Cut the (shuffled) samples into shards that respect ``limits``.

    Returns:
        The shard tasks in order, and the samples that alone exceed
        ``max_bytes`` (each still gets a shard of its own; the caller warns).
    """
    tasks: list[ShardTask] = []
    oversized: list[InputSample] = []
    current: list[InputSample] = []
    current_bytes = 0

    def close_shard() -> None:
        nonlocal current, current_bytes
        if current:
            tasks.append(
                ShardTask(
                    index=len(tasks),
                    name=shard_name(len(tasks)),
                    samples=tuple(current),
                    planned_bytes=current_bytes + len(END_OF_ARCHIVE),
                    fingerprint=_fingerprint(current),
                )
            )
        current, current_bytes = [], 0

    for position in sample_order(len(samples), seed=seed, shuffle=shuffle):
        sample = samples[int(position)]
        size = encoded_sample_size(sample.key, [(f.ext, f.size) for f in sample.fields])
        if limits.max_bytes is not None and size + len(END_OF_ARCHIVE) > limits.max_bytes:
            oversized.append(sample)
        if not limits.fits(len(current), current_bytes, size):
            close_shard()
        current.append(sample)
        current_bytes += size
        if limits.max_bytes is not None and current_bytes + len(END_OF_ARCHIVE) > limits.max_bytes:
            close_shard()  # an oversized sample keeps its shard to itself
    close_shard()
    return tasks, oversized
