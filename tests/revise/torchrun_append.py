"""Run under torchrun by tests/revise/test_torchrun_append.py: 2 ranks, a
loader of 2 workers, batches of 3, ``"exact"`` mode.

``--phase full``: each rank takes ``--steps`` batches of epoch 0, then rank
0 writes the gathered state. (The test appends to the dataset now.)
``--phase resume``: each rank loads that state, reads the rest of epoch 0,
then all of epoch 1. Each rank writes its batches' keys, per part.
"""

from __future__ import annotations

import argparse
import itertools
import os

from shardkit import ShardDataset, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state


def keys_of(samples: list[dict]) -> list[str]:
    return [s["__key__"] for s in samples]


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, "state-append.json")
    loader = make_loader(ShardDataset(args.data, mode="exact", seed=9), batch_size=3, num_workers=2, collate_fn=keys_of)
    if args.phase == "full":
        saved = list(itertools.islice(loader, args.steps))
        save_gathered_state(loader, state_path, rank)
        return {"saved": saved}
    load_saved_state(loader, state_path)
    out = {"epoch0": list(loader), "epoch0_len": len(loader.shard_dataset)}
    loader.shard_dataset.set_epoch(1)
    out["epoch1"] = list(loader)
    return out


if __name__ == "__main__":
    run_phases(read_phase, steps=4)
