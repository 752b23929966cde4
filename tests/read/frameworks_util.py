"""What the framework runs (tests/read/test_frameworks.py) share: the
dataset they read, the model, and how a sample becomes a number a batch can
carry.

The frameworks send batches between processes (accelerate broadcasts them
from process 0) and into models, so each sample is turned into one integer
field, ``idx``, from which the test recovers its key."""

from __future__ import annotations

from typing import Any

import torch

#: 400 samples in 4 shards: every split below divides it evenly (each of 2
#: workers on each of 2 ranks, batches of 5 and 10, chunks of 10 and 20).
SIZES = (100, 100, 100, 100)
#: A sample's index: shard * STRIDE + position in the shard.
STRIDE = 100_000


def to_features(sample: dict[str, Any]) -> dict[str, int]:
    """The ``map=`` of every run: key ``s003_00042`` -> ``{"idx": 300042}``."""
    shard, position = sample["__key__"][1:].split("_")
    return {"idx": int(shard) * STRIDE + int(position)}


def all_indices(sizes: tuple[int, ...] = SIZES) -> list[int]:
    """Every sample's index, sorted."""
    return sorted(shard * STRIDE + i for shard, count in enumerate(sizes) for i in range(count))


def build_model() -> torch.nn.Module:
    """The plain-DDP run's model: one linear unit."""
    return torch.nn.Linear(1, 1)


def loss_of(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A loss on the batch's indices (scaled small), so there are gradients to reduce."""
    return model(batch["idx"].float().unsqueeze(1) / 1e6).pow(2).mean()
