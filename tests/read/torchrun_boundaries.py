"""Run under torchrun by tests/read/test_boundaries.py: token blocks of 64
with their boundaries over DATA, ``"exact"`` mode, a loader of 2 workers,
batches of 4, ``eos`` set. ``--phase full``: ``--steps`` batches, then the
gathered state; ``--phase resume`` (another world size): the rest of the
epoch. Each batch is written as its tokens, position ids and cu_seqlens."""

from __future__ import annotations

import argparse
import itertools
import os

from shardkit import ShardDataset, TokenBlocks, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state

EOS = 9_999_999


def listed(batch: dict) -> list:
    return [batch["tokens"].tolist(), batch["position_ids"].tolist(), batch["cu_seqlens"].tolist(), batch["max_seqlen"]]


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, "state-boundaries.json")
    ds = ShardDataset(args.data, tokens=TokenBlocks("tokens.npy", 64, eos=EOS, boundaries=True), mode="exact", seed=5,
                      buffer_size=20)  # fmt: skip
    loader = make_loader(ds, batch_size=4, num_workers=2)
    if args.phase == "full":
        saved = [listed(b) for b in itertools.islice(loader, args.steps)]
        save_gathered_state(loader, state_path, rank)
        return {"batches": saved}
    load_saved_state(loader, state_path)
    return {"batches": [listed(b) for b in loader]}


if __name__ == "__main__":
    run_phases(read_phase, steps=6)
