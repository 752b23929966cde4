"""Run under torchrun by tests/read/test_torchrun_replication.py: ranks in
groups of ``--replication`` (tensor-parallel groups) reading DATA through a
loader with 1 worker and batches of 2.

``--phase full``: each rank reads epoch 0 in ``"exact"`` mode, then in
``"balanced"`` mode with an ``all_reduce`` every step, then (``"saved"``)
``--steps`` batches of epoch 1; rank 0 writes the gathered state of all
ranks. ``--phase resume``: each rank loads that state (another number of
groups, perhaps) and reads the rest of epoch 1. Each rank writes
``OUT/{phase}-rank{RANK}.json``: per part, its batches as lists of keys,
and its group as the dataset sees it.
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
import torch.distributed as dist

from shardkit import ShardDataset, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state


def keys_of(samples: list[dict]) -> list[str]:
    return [s["__key__"] for s in samples]


def loader(args: argparse.Namespace, mode: str, epoch: int) -> torch.utils.data.DataLoader:
    ds = ShardDataset(args.data, mode=mode, seed=3, epoch=epoch, replication=args.replication, buffer_size=8)
    return make_loader(ds, batch_size=2, num_workers=1, collate_fn=keys_of)


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, "state-replication.json")
    later = loader(args, "exact", 1)
    world = later.shard_dataset.world
    out: dict[str, list] = {"group": [world.rank, world.world_size]}
    if args.phase == "full":
        out["exact"] = list(loader(args, "exact", 0))
        out["balanced"] = []
        for batch in loader(args, "balanced", 0):
            step = torch.ones(1)
            dist.all_reduce(step)  # every rank takes this step, or none returns
            out["balanced"].append(batch)
        out["saved"] = list(itertools.islice(later, args.steps))
        save_gathered_state(later, state_path, rank)
        return out
    load_saved_state(later, state_path)
    out["exact"] = list(later)
    return out


if __name__ == "__main__":
    run_phases(read_phase, steps=3, more=lambda parser: parser.add_argument("--replication", type=int, required=True))
