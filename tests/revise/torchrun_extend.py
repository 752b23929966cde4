"""Run under torchrun by tests/revise/test_torchrun_extend.py: an extension read
by 3 ranks (``--phase full``: ``--steps`` batches each, then the gathered state)
and resumed on 2 (``--phase resume``: the rest of the epoch), ``"exact"`` mode,
a loader of 2 workers, batches of 3. Each sample is reported as its key and a
digest of its members, so the test compares contents, not only keys."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os

from shardkit import ShardDataset, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state


def digests(samples: list[dict]) -> list[list[str]]:
    return [[s["__key__"], member_digest(s)] for s in samples]


def member_digest(sample: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(k for k in sample if not k.startswith("__")):
        digest.update(name.encode() + b"\0" + bytes(sample[name]) + b"\0")
    return digest.hexdigest()


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, "state-extend.json")
    loader = make_loader(ShardDataset(args.data, mode="exact", seed=4), batch_size=3, num_workers=2, collate_fn=digests)
    if args.phase == "full":
        saved = list(itertools.islice(loader, args.steps))
        save_gathered_state(loader, state_path, rank)
        return {"saved": saved}
    load_saved_state(loader, state_path)
    return {"rest": list(loader)}


if __name__ == "__main__":
    run_phases(read_phase, steps=3)
