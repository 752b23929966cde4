"""What the framework runs (tests/read/test_frameworks.py) share: the
dataset they read and how a sample becomes a number a batch can carry.

The frameworks send batches between processes (accelerate broadcasts them
from process 0) and into models, so each sample is turned into one integer
tensor field, ``idx``, from which the test recovers its key."""

from __future__ import annotations

from typing import Any

#: 500 samples in 5 shards: every split below divides it evenly.
SIZES = (100, 100, 100, 100, 100)
#: A sample's index: shard * STRIDE + position in the shard.
STRIDE = 100_000


def as_index(sample: dict[str, Any]) -> dict[str, int]:
    """The ``map=`` of every run: key ``s003_00042`` -> ``{"idx": 300042}``."""
    shard, position = sample["__key__"][1:].split("_")
    return {"idx": int(shard) * STRIDE + int(position)}


def all_indices(sizes: tuple[int, ...] = SIZES) -> list[int]:
    """Every sample's index, sorted."""
    return sorted(shard * STRIDE + i for shard, count in enumerate(sizes) for i in range(count))
