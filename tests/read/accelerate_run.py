"""Run under torchrun (2 ranks, gloo) by tests/read/test_frameworks.py: the
README's plain-DDP, StatefulDataLoader and accelerate recipes (their
lines, in their order).

Each rank writes ``OUT/rank{RANK}.json``: per run and epoch the sample
indices its training loop received, in order; for the runs that must be
refused, the error.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import shardkit
from tests.read.frameworks_util import build_model, loss_of, to_features
from tests.read.torchrun_util import rank_arguments, run_rank

#: accelerate's DataLoaderConfiguration for each run.
CONFIGS: dict[str, dict[str, bool]] = {
    "default": {},
    "no_dispatch": {"dispatch_batches": False},
    "no_dispatch_split": {"dispatch_batches": False, "split_batches": True},
    "dispatch_split": {"split_batches": True},
}


def plain_ddp(data: str) -> list[list[int]]:
    """torchrun + DistributedDataParallel: shardkit splits by rank itself."""
    model = DistributedDataParallel(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = shardkit.ShardDataset(data, seed=0, map=to_features)
    loader = shardkit.make_loader(dataset, batch_size=10, num_workers=2)
    epochs: list[list[int]] = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        epochs.append([])
        for batch in loader:
            optimizer.zero_grad()
            loss_of(model, batch).backward()
            optimizer.step()
            epochs[-1] += batch["idx"].tolist()
    return epochs


def stateful_restore(data: str) -> list[list[int]]:
    """torchdata's StatefulDataLoader: epoch 0 cut after 6 batches and
    restored into a new dataset and loader, then epoch 1."""

    def build() -> tuple[shardkit.ShardDataset, StatefulDataLoader]:
        dataset = shardkit.ShardDataset(data, seed=0, map=to_features)
        loader = StatefulDataLoader(dataset, batch_size=10, num_workers=2)
        return dataset, loader

    dataset, loader = build()
    batches = iter(loader)
    head = [i for _, batch in zip(range(6), batches) for i in batch["idx"].tolist()]
    state = loader.state_dict()
    del batches, loader
    dataset, loader = build()
    loader.load_state_dict(state)
    epochs = [head + [i for batch in loader for i in batch["idx"].tolist()]]
    dataset.set_epoch(1)
    epochs.append([i for batch in loader for i in batch["idx"].tolist()])
    return epochs


def with_accelerate(data: str, config: dict[str, bool]) -> list[list[int]]:
    """accelerate: one stream (rank=0, world_size=1) that it splits."""
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    dataset = shardkit.ShardDataset(data, seed=0, rank=0, world_size=1, map=to_features)
    loader = accelerator.prepare(DataLoader(dataset, batch_size=10, num_workers=2, persistent_workers=True))
    epochs: list[list[int]] = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append([])
        for batch in loader:
            epochs[-1] += batch["idx"].tolist()
    return epochs


def split_twice(data: str, config: dict[str, bool]) -> str:
    """A dataset that splits by rank under accelerate: refused, the message returned."""
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    dataset = shardkit.ShardDataset(data, seed=0, map=to_features)
    loader = accelerator.prepare(DataLoader(dataset, batch_size=10))
    try:
        next(iter(loader))
    except shardkit.UsageError as exc:
        return str(exc)
    return "not refused"


def work(data: str) -> dict[str, Any]:
    result: dict[str, Any] = {"ddp": plain_ddp(data), "stateful": stateful_restore(data)}
    for name, config in CONFIGS.items():
        result[name] = with_accelerate(data, config)
    result["refused"] = {name: split_twice(data, CONFIGS[name]) for name in ("default", "no_dispatch")}
    return result


def main() -> None:
    args = rank_arguments().parse_args()
    run_rank(lambda rank, world_size: work(args.data), out=args.out)


if __name__ == "__main__":
    main()
