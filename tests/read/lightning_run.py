"""Run under torchrun (2 ranks, gloo) by tests/read/test_frameworks.py: the
README's PyTorch Lightning recipe (``strategy="ddp"`` on CPU).

Each rank writes ``OUT/rank{RANK}.json``: ``{"seen": [...]}``, the sample
indices its training steps received, in order (2 epochs).
"""

from __future__ import annotations

from typing import Any

import torch

import shardkit
from tests.read.frameworks_util import to_features
from tests.read.torchrun_util import rank_arguments, run_rank


def train(data: str) -> dict[str, Any]:
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[int] = []

        def train_dataloader(self):
            # Lightning gives no sampler to an IterableDataset: shardkit splits by rank.
            self.dataset = shardkit.ShardDataset(data, mode="balanced", seed=0, map=to_features)
            return shardkit.make_loader(self.dataset, batch_size=5, num_workers=2)

        def on_train_epoch_start(self) -> None:
            self.dataset.set_epoch(self.current_epoch)

        def training_step(self, batch, batch_idx):
            self.seen += batch["idx"].tolist()
            return self.layer(batch["idx"].float().unsqueeze(1) / 1e6).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Model()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return {"seen": model.seen}


def main() -> None:
    args = rank_arguments().parse_args()
    run_rank(lambda rank, world_size: train(args.data), out=args.out)


if __name__ == "__main__":
    main()
