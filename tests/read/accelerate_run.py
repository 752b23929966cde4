"""Run under torchrun (2 ranks, gloo) by tests/read/test_frameworks.py: the
README's plain-DDP, StatefulDataLoader and accelerate recipes (their
lines, in their order).

Each rank writes ``OUT/rank{RANK}.json``: per run and epoch the sample
indices its training loop received, in order; what ``len()`` of each
accelerate loader said before its first epoch; the lines shardkit logged
about accelerate's split; for the runs that must be refused, the error.
"""

from __future__ import annotations

import logging
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


def with_accelerate(data: str, config: dict[str, bool]) -> dict[str, Any]:
    """accelerate over a dataset as users write it: its rank detected, it
    becomes the one stream accelerate splits. The indices of each epoch,
    and ``len(loader)`` asked before the first (as the Trainer does)."""
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    dataset = shardkit.ShardDataset(data, seed=0, map=to_features)
    loader = accelerator.prepare(DataLoader(dataset, batch_size=10, num_workers=2, persistent_workers=True))
    length = len(loader)
    seen: list[list[list[int]]] = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen.append([])
        for batch in loader:
            seen[-1].append(batch["idx"].tolist())
    return {"epochs": [sum(batches, []) for batches in seen], "len": length, "batches": [len(batches) for batches in seen]}


def given_a_rank(data: str, config: dict[str, bool], rank: int | None, world_size: int | None, **more: Any) -> str:
    """A dataset told to read one rank's share (or, with ``replication``,
    its group's), under accelerate: refused, the message returned."""
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    dataset = shardkit.ShardDataset(data, seed=0, rank=rank, world_size=world_size, map=to_features, **more)
    loader = accelerator.prepare(DataLoader(dataset, batch_size=10))
    try:
        next(iter(loader))
    except shardkit.UsageError as exc:
        return str(exc)
    return "not refused"


class Lines(logging.Handler):
    """Keeps the messages logged to it."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def work(data: str, short: str, rank: int, world_size: int) -> dict[str, Any]:
    lines = Lines()
    logging.getLogger("shardkit.read.frameworks").addHandler(lines)
    result: dict[str, Any] = {"ddp": plain_ddp(data), "stateful": stateful_restore(data)}
    for name, config in CONFIGS.items():
        result[name] = with_accelerate(data, config)
    # Each DataLoader worker reads 105 samples: batches accelerate cannot fill or divide evenly.
    result["short"] = {name: with_accelerate(short, CONFIGS[name]) for name in ("no_dispatch", "dispatch_split")}
    result["refused"] = {name: given_a_rank(data, CONFIGS[name], rank, world_size) for name in ("default", "no_dispatch")}
    result["refused"]["replicated"] = given_a_rank(data, CONFIGS["default"], None, None, replication=world_size)
    result["logged"] = lines.messages
    return result


def main() -> None:
    parser = rank_arguments()
    parser.add_argument("--short", required=True, help="a dataset whose workers' shares make accelerate pad")
    args = parser.parse_args()
    run_rank(lambda rank, world_size: work(args.data, args.short, rank, world_size), out=args.out)


if __name__ == "__main__":
    main()
