"""Run under torchrun by tests/read/test_budget.py (and test_packed.py, with
``--spec packed``: sequences of 2,048 packed with whole samples): token-budget
batches of at most 2,048 padded tokens over DATA (lengths 1 to ~50x the median), a loader
of 2 workers. ``--phase full``: every batch of epoch 0 in ``"balanced"``
mode with an ``all_reduce`` every step (a rank with fewer steps would leave
the others waiting), then ``--steps`` batches of epoch 1 in ``"exact"``
mode and the gathered state; ``--phase resume`` (another world size): the
rest of epoch 1. Each batch is written as its keys and padded size."""

from __future__ import annotations

import argparse
import itertools
import os

import torch
import torch.distributed as dist

from shardkit import PackedSamples, ShardDataset, TokenBudget, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state

SPECS = {"budget": TokenBudget("tokens.npy", 2048, group_by_length=True, window=64),
         "packed": PackedSamples("tokens.npy", 2048, window=64)}


def listed(batch: dict) -> list:
    tokens = batch["tokens.npy"] if "tokens.npy" in batch else batch["tokens"]
    return [batch["__key__"], int(tokens.numel())]


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, f"state-{args.spec}.json")
    spec = SPECS[args.spec]
    exact = make_loader(ShardDataset(args.data, tokens=spec, mode="exact", seed=2, epoch=1), batch_size=None,
                        num_workers=2)  # fmt: skip
    if args.phase == "full":
        balanced = make_loader(ShardDataset(args.data, tokens=spec, mode="balanced", seed=2), batch_size=None,
                               num_workers=2)  # fmt: skip
        out: dict[str, list] = {"balanced": [], "balanced_len": [len(balanced)]}
        for batch in balanced:
            step = torch.ones(1)
            dist.all_reduce(step)  # every rank takes this step, or none returns
            out["balanced"].append(listed(batch))
        out["saved"] = [listed(b) for b in itertools.islice(exact, args.steps)]
        save_gathered_state(exact, state_path, rank)
        return out
    load_saved_state(exact, state_path)
    return {"rest": [listed(b) for b in exact]}


if __name__ == "__main__":
    run_phases(read_phase, steps=3, more=lambda parser: parser.add_argument("--spec", choices=tuple(SPECS), default="budget"))
