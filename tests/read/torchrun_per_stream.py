"""Run under torchrun by tests/read/test_per_stream.py: two streams of
different shapes (``DATA/small``: 8-byte payloads, ``DATA/large``: 32-byte),
1:2 by weight over an epoch of 240 samples, ``batching="per_stream"``,
batches of 4 made in 2 DataLoader workers.

``--phase full``: each rank reads epoch 0, and at every step all-gathers
the stream of its batch (every rank must get the same list: its own stream
everywhere); then reads all of epoch 1 (``"whole"``) and, with another
loader, ``--steps`` batches of epoch 1 (``"saved"``); rank 0 writes the
gathered state. ``--phase resume``: each rank loads that state and reads the
rest of epoch 1 (``"resumed"``). Each rank writes
``OUT/{phase}-rank{RANK}.json``: per part, its batches as lists of
``[stream, key]``, and per step of epoch 0 the streams every rank had.
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch.distributed as dist

from shardkit import ShardDataset, Stream, make_loader
from tests.read.torchrun_util import load_saved_state, run_phases, save_gathered_state


def tagged(samples: list[dict]) -> list[list[str]]:
    assert len({len(s["bin"]) for s in samples}) == 1, "a batch of one shape"
    return [[s["__stream__"], s["__key__"]] for s in samples]


def loader(args: argparse.Namespace, epoch: int):  # noqa: ANN201 - a ShardLoader
    streams = [Stream(os.path.join(args.data, "small"), weight=1.0, name="small"),
               Stream(os.path.join(args.data, "large"), weight=2.0, name="large")]  # fmt: skip
    ds = ShardDataset(streams, samples_per_epoch=240, seed=5, epoch=epoch, buffer_size=16, batch_size=4,
                      collate=tagged, batching="per_stream")  # fmt: skip
    return make_loader(ds, num_workers=2)


def read_phase(args: argparse.Namespace, rank: int) -> dict[str, list]:
    state_path = os.path.join(args.out, "state-per-stream.json")
    later = loader(args, 1)
    if args.phase == "full":
        out: dict[str, list] = {"epoch0": [], "agreed": [], "len": [len(later)]}
        for batch in loader(args, 0):
            streams: list[str | None] = [None] * dist.get_world_size()
            dist.all_gather_object(streams, batch[0][0])
            out["epoch0"].append(batch)
            out["agreed"].append(streams)
        out["whole"] = list(loader(args, 1))
        out["saved"] = list(itertools.islice(later, args.steps))
        save_gathered_state(later, state_path, rank)
        return out
    load_saved_state(later, state_path)
    return {"resumed": list(later)}


if __name__ == "__main__":
    run_phases(read_phase)
