"""Run under torchrun by tests/read/test_torchrun.py: read a dataset on every rank.

Each rank writes ``OUT/rank{RANK}.json``: for each mode and epoch, the keys its
DataLoader (2 persistent workers) delivered, in order.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from shardkit import ShardDataset
from tests.read.torchrun_util import rank_arguments, run_rank


def read_every_mode(data: str, seed: int, rank: int, world_size: int) -> dict[str, Any]:
    """This rank's keys per mode and epoch, through a DataLoader with 2 persistent workers."""
    result: dict[str, Any] = {"rank": rank, "world_size": world_size}
    for mode in ("exact", "balanced"):
        ds = ShardDataset(data, mode=mode, seed=seed, buffer_size=3)
        assert (ds.world.rank, ds.world.world_size) == (rank, world_size)
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            result[f"{mode}/{epoch}"] = [sample["__key__"] for sample in loader]
        del loader
    return result


def main() -> None:
    parser = rank_arguments()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run_rank(lambda rank, world_size: read_every_mode(args.data, args.seed, rank, world_size), out=args.out)


if __name__ == "__main__":
    main()
