"""Run under torchrun (2 ranks, gloo) by tests/read/test_frameworks.py: the
README's Hugging Face ``Trainer`` recipe (its lines, in their order) with a
one-weight model.

Each rank writes ``OUT/rank{RANK}.json``: ``{"seen": [...]}``, the sample
indices its model received, in training order (2 epochs).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

import shardkit
from tests.read.frameworks_util import to_features
from tests.read.torchrun_util import rank_arguments, run_rank

#: What the README's TrainingArguments leave out here: train on CPU, report
#: nothing, write no checkpoints.
ON_CPU_QUIETLY: dict[str, Any] = {
    "use_cpu": True,
    "report_to": [],
    "save_strategy": "no",
    "logging_strategy": "no",
    "disable_tqdm": True,
}


class Recorder(torch.nn.Module):
    """A model with one weight that records the sample indices it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.seen: list[int] = []

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen += idx.tolist()
        return {"loss": (self.weight * idx.float() / 1e6).pow(2).mean()}


def train(data: str, out: str) -> dict[str, Any]:
    model = Recorder()
    dataset = shardkit.ShardDataset(data, seed=0, map=to_features)
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=5, num_train_epochs=2, dataloader_num_workers=2, **ON_CPU_QUIETLY)
    Trainer(model=model, args=args, train_dataset=dataset).train()
    return {"seen": model.seen}


def main() -> None:
    args = rank_arguments().parse_args()
    run_rank(lambda rank, world_size: train(args.data, os.path.join(args.out, "trainer")), out=args.out)


if __name__ == "__main__":
    main()
