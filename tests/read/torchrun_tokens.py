"""Run under torchrun by tests/read/test_torchrun_tokens.py: token blocks of
64 over DATA (documents of 1 to ~6,000 tokens), a loader with 2 workers and
batches of 4.

``--phase full``: each rank trains through epoch 0 in ``"balanced"`` mode
with an ``all_reduce`` every step (a rank with fewer steps would leave the
others waiting, and the run would time out), then reads epoch 0 in
``"exact"`` mode, then a ``"mixture"`` of ``MIX/short`` and ``MIX/long`` at
3:1 token shares (120 blocks an epoch, ``"balanced"``, an ``all_reduce``
every step), then (``"saved"``) ``--steps`` batches of epoch 1; rank 0
writes the gathered state of all ranks. ``--phase resume``: each rank loads
that state (another world size) and reads the rest of epoch 1.
Each rank writes ``OUT/{phase}-rank{RANK}.json``: per part, its batches as
lists of blocks (lists of token ids).
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
import torch.distributed as dist

from shardkit import ShardDataset, Stream, TokenBlocks, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state


def loader(args: argparse.Namespace, mode: str, epoch: int) -> torch.utils.data.DataLoader:
    ds = ShardDataset(args.data, tokens=TokenBlocks("tokens.npy", 64), mode=mode, seed=11, epoch=epoch, buffer_size=30)
    return make_loader(ds, batch_size=4, num_workers=2)


def mixture_loader(args: argparse.Namespace) -> torch.utils.data.DataLoader:
    streams = [Stream(os.path.join(args.mix, "short"), weight=3.0), Stream(os.path.join(args.mix, "long"), weight=1.0)]
    ds = ShardDataset(streams, tokens=TokenBlocks("tokens.npy", 64), samples_per_epoch=120, seed=11)
    return make_loader(ds, batch_size=4, num_workers=2)


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, "state-tokens.json")
    later = loader(args, "exact", 1)
    if args.phase == "full":
        balanced = loader(args, "balanced", 0)
        out: dict[str, list] = {"balanced": [], "balanced_len": [len(balanced)]}
        for batch in balanced:
            step = torch.ones(1)
            dist.all_reduce(step)  # every rank takes this step, or none returns
            out["balanced"].append(batch.tolist())
        out["exact"] = [b.tolist() for b in loader(args, "exact", 0)]
        out["mixture"] = []
        for batch in mixture_loader(args):  # 3:1 token shares, the same steps on every rank
            step = torch.ones(1)
            dist.all_reduce(step)
            out["mixture"].append(batch.tolist())
        out["saved"] = [b.tolist() for b in itertools.islice(later, args.steps)]
        save_gathered_state(later, state_path, rank)
        return out
    load_saved_state(later, state_path)
    return {"exact": [b.tolist() for b in later]}


if __name__ == "__main__":
    run_phases(read_phase, more=lambda parser: parser.add_argument("--mix", help="a folder holding short/ and long/"))
