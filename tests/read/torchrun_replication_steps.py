"""Run under torchrun by tests/read/test_torchrun_replication.py: 4 ranks in
2 groups (``replication=2``), 2 workers each, whose map sleeps a random
moment per sample so that workers finish in a different order on every
rank. At every step each rank's batch keys are gathered from all ranks;
rank 0 records them, per case, for the test to compare.

Cases: batches made by the loader, by the dataset, no batches, workers
that are not persistent, a plain DataLoader and torchdata's StatefulDataLoader, and (``--phase full`` then ``--phase resume``) a
run stopped after ``--steps`` steps and resumed in new processes.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch.distributed as dist
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardkit import ShardDataset, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state

_JITTER = random.Random(os.urandom(8))  # timing only: never what is read


def jitter(sample: dict) -> dict:
    time.sleep(_JITTER.random() * 0.004)
    return sample


def keys_of(samples: list[dict]) -> list[str]:
    return [s["__key__"] for s in samples]


def _dataset(args: argparse.Namespace, **options) -> ShardDataset:
    return ShardDataset(args.data, mode="balanced", seed=5, replication=2, buffer_size=8, map=jitter, **options)


def _loaders(args: argparse.Namespace) -> dict:
    return {
        "loader_batch": make_loader(_dataset(args), batch_size=4, num_workers=2, collate_fn=keys_of),
        "dataset_batch": make_loader(_dataset(args, batch_size=4, collate=keys_of), num_workers=2),
        "samples": make_loader(_dataset(args), num_workers=2, collate_fn=lambda s: [s["__key__"]]),
        "not_persistent": make_loader(
            _dataset(args), batch_size=3, num_workers=2, persistent_workers=False, collate_fn=keys_of
        ),
        # The documented recipes: a plain DataLoader and torchdata's, in order by default.
        "plain_dataloader": DataLoader(_dataset(args), batch_size=4, num_workers=2, collate_fn=keys_of),
        "stateful_dataloader": StatefulDataLoader(_dataset(args), batch_size=4, num_workers=2, collate_fn=keys_of),
    }


def _gathered(batch: list[str]) -> list[list[str]]:
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, batch)
    return everyone


def _steps(loader, limit: int | None = None) -> list[list[list[str]]]:
    steps = []
    for batch in loader:
        steps.append(_gathered(batch))
        if limit is not None and len(steps) == limit:
            break
    return steps


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, "state-steps.json")
    resumed = make_loader(_dataset(args), batch_size=4, num_workers=2, collate_fn=keys_of)
    if args.phase == "resume":
        load_saved_state(resumed, state_path)
        return {"resumed": _steps(resumed)}
    out = {name: _steps(loader) for name, loader in _loaders(args).items()}
    out["saved"] = _steps(resumed, args.steps)
    save_gathered_state(resumed, state_path, rank)
    return out


if __name__ == "__main__":
    run_phases(read_phase, steps=3)
