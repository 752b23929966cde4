"""Run under torchrun (2 ranks, gloo) by tests/read/test_frameworks.py: the
README's PyTorch Lightning recipe (its lines, in their order), with
``strategy="ddp"`` on CPU, and the loader's workers started by a forkserver:
Lightning starts them right after gloo collectives, and on this project's
Python (3.11.7) a worker forked while gloo's thread holds the interpreter's
thread-state lock hangs before it starts (CPython gh-112275; ``make_loader``
warns of it, see ``shardkit.read.loader.fork_hazard``).

Each rank writes ``OUT/rank{RANK}.json``: ``{"seen": [...]}``, the sample
indices its training steps received, in order (2 epochs).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

import shardkit
from tests.read.frameworks_util import loss_of, to_features
from tests.read.torchrun_util import rank_arguments, run_rank

#: What the README's Trainer leaves out here: no logger, checkpoints or progress output.
QUIETLY: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def train(data: str) -> dict[str, Any]:
    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[int] = []

        def train_dataloader(self):
            self.dataset = shardkit.ShardDataset(data, seed=0, map=to_features)
            return shardkit.make_loader(self.dataset, batch_size=5, num_workers=2, multiprocessing_context="forkserver")

        def on_train_epoch_start(self):
            self.dataset.set_epoch(self.current_epoch)

        def training_step(self, batch, batch_idx):
            self.seen += batch["idx"].tolist()
            return loss_of(self.layer, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Model()
    L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, **QUIETLY).fit(model)
    return {"seen": model.seen}


def main() -> None:
    args = rank_arguments().parse_args()
    run_rank(lambda rank, world_size: train(args.data), out=args.out)


if __name__ == "__main__":
    main()
