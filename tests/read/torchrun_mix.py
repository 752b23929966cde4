"""Run under torchrun by tests/read/test_torchrun_mix.py.

Two streams (``DATA/small``: 37 samples, ``DATA/large``: 5000) mixed 0.5/0.5
over an epoch of 600 samples, read through a loader with 2 workers in
batches of 8.

``--phase full``: each rank reads all of epoch 0 in ``"balanced"`` mode and
of epoch 0 in ``"exact"`` mode; then (``"saved"``) ``--steps`` batches of
epoch 1 (``"exact"``), and rank 0 writes the gathered state of all ranks.
``--phase resume``: each rank loads that state (another world size) and
reads the rest of epoch 1.
Each rank writes ``OUT/{phase}-rank{RANK}.json``: per mode, its batches as
lists of ``[stream, key]``.
"""

from __future__ import annotations

import argparse
import itertools
import os

from shardkit import ShardDataset, Stream, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state


def dataset(args: argparse.Namespace, mode: str, epoch: int) -> ShardDataset:
    streams = [
        Stream(os.path.join(args.data, "small"), weight=0.5, name="small"),
        Stream(os.path.join(args.data, "large"), weight=0.5, name="large"),
    ]
    return ShardDataset(streams, samples_per_epoch=600, mode=mode, seed=7, buffer_size=50, epoch=epoch)


def batches(loader) -> list[list[list[str]]]:
    return [[[s, k] for s, k in zip(b["__stream__"], b["__key__"])] for b in loader]


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    loader = make_loader(dataset(args, "exact", 1), batch_size=8, num_workers=2)
    state_path = os.path.join(args.out, "state-mix.json")
    if args.phase == "full":
        out = {}
        for mode in ("balanced", "exact"):
            out[mode] = batches(make_loader(dataset(args, mode, 0), batch_size=8, num_workers=2))
        out["saved"] = batches(itertools.islice(loader, args.steps))
        save_gathered_state(loader, state_path, rank)
        return out
    load_saved_state(loader, state_path)
    return {"exact": batches(loader)}


if __name__ == "__main__":
    run_phases(read_phase)
