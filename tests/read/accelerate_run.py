"""Run under torchrun (2 ranks, gloo) by tests/read/test_frameworks.py: the
README's plain-DDP and accelerate recipes.

Each rank writes ``OUT/rank{RANK}.json``: per run and epoch the sample
indices its training loop received, in order; for the runs that must be
refused, the error.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import shardkit
from tests.read.frameworks_util import as_index
from tests.read.torchrun_util import rank_arguments, run_rank

EPOCHS = 2
#: accelerate's DataLoaderConfiguration for each run.
CONFIGS: dict[str, dict[str, bool]] = {
    "default": {},
    "no_dispatch": {"dispatch_batches": False},
    "no_dispatch_split": {"dispatch_batches": False, "split_batches": True},
    "dispatch_split": {"split_batches": True},
}


def plain_ddp(data: str) -> list[list[int]]:
    """torchrun + DistributedDataParallel: shardkit splits by rank itself."""
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = shardkit.ShardDataset(data, mode="balanced", seed=0, map=as_index)
    loader = shardkit.make_loader(dataset, batch_size=10, num_workers=2)
    epochs = []
    for epoch in range(EPOCHS):
        dataset.set_epoch(epoch)
        seen = []
        for batch in loader:
            x = batch["idx"].float().unsqueeze(1) / 1e6
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += batch["idx"].tolist()
        epochs.append(seen)
    return epochs


def with_accelerate(data: str, config: dict[str, bool]) -> list[list[int]]:
    """accelerate: one global stream (rank=0, world_size=1) that it splits."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    dataset = shardkit.ShardDataset(data, mode="balanced", seed=0, rank=0, world_size=1, map=as_index)
    # With split_batches the DataLoader's batch is the global one, cut in a part per process.
    batch_size = 10 if config.get("split_batches") else 5
    loader = accelerator.prepare(DataLoader(dataset, batch_size=batch_size, num_workers=2, persistent_workers=True))
    epochs = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        epochs.append([i for batch in loader for i in batch["idx"].tolist()])
    return epochs


def split_twice(data: str, config: dict[str, bool]) -> str:
    """A dataset that splits by rank under accelerate: refused, the message returned."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    dataset = shardkit.ShardDataset(data, mode="balanced", seed=0, map=as_index)
    loader = accelerator.prepare(DataLoader(dataset, batch_size=5))
    try:
        next(iter(loader))
    except shardkit.UsageError as exc:
        return str(exc)
    return "not refused"


def work(data: str, rank: int, world_size: int) -> dict[str, Any]:
    result: dict[str, Any] = {"ddp": plain_ddp(data)}
    for name, config in CONFIGS.items():
        result[name] = with_accelerate(data, config)
    result["refused"] = {name: split_twice(data, CONFIGS[name]) for name in ("default", "no_dispatch")}
    return result


def main() -> None:
    args = rank_arguments().parse_args()
    run_rank(lambda rank, world_size: work(args.data, rank, world_size), out=args.out)


if __name__ == "__main__":
    main()
