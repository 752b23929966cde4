"""Run under torchrun by tests/read/test_torchrun.py: read a dataset on every rank.

Each rank writes ``OUT/rank{RANK}.json``: for each mode and epoch, the keys its
DataLoader (2 persistent workers) delivered, in order.
"""

from __future__ import annotations

import argparse
import json
import os

import torch.distributed as dist
from torch.utils.data import DataLoader

from shardkit import ShardDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict[str, object] = {"rank": rank, "world_size": dist.get_world_size()}
    for mode in ("exact", "balanced"):
        ds = ShardDataset(args.data, mode=mode, seed=args.seed, buffer_size=3)
        assert (ds.world.rank, ds.world.world_size) == (rank, dist.get_world_size())
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            result[f"{mode}/{epoch}"] = [sample["__key__"] for sample in loader]
        del loader
    # Every rank got here: nobody is stuck waiting on a collective.
    dist.barrier()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
