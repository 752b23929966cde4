"""Records ``tests/read/fixtures/states_before_22.json``: reader states and
sample orders written by shardkit before the read paths were merged (issue
#22), which ``test_recorded_states.py`` loads with today's code.

Run from the repository root to record again (only if the format changes on
purpose): ``python -m tests.read.record_states``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
from typing import Any

from shardkit import ShardDataset, Stream, World
from tests.conftest import build_dataset

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "states_before_22.json")

#: Datasets by name: samples per shard.
DATASETS = {"a": [7, 0, 5, 6, 4], "b": [3, 8, 2]}

#: Each case: how to build the dataset, the slot, and how many items to take before the state.
CASES: list[dict[str, Any]] = [
    {"name": "one-exact", "source": "a", "kwargs": {"mode": "exact", "seed": 7, "buffer_size": 4}, "world": [1, 2, 0, 1], "take": 3, "epoch": 1},
    {"name": "one-balanced-interleave", "source": "a", "kwargs": {"mode": "balanced", "seed": 7, "buffer_size": 5, "interleave": 2}, "world": [0, 3, 0, 1], "take": 2, "epoch": 0},
    {"name": "one-infinite-bytes", "source": "a", "kwargs": {"mode": "infinite", "seed": 7, "buffer_size": 6, "buffer_bytes": 4096}, "world": [0, 2, 0, 1], "take": 9, "epoch": 2, "after": 20},
    {"name": "mix-balanced", "source": [["a", 0.7], ["b", 0.3]], "kwargs": {"mode": "balanced", "seed": 3, "buffer_size": 6, "samples_per_epoch": 30}, "world": [1, 2, 0, 1], "take": 5, "epoch": 1},
    {"name": "mix-infinite-named", "source": [["a", {"0": 1.0, "2": 0.2}], ["b", 1.0]], "kwargs": {"mode": "infinite", "seed": 5, "buffer_size": 4, "samples_per_epoch": 12}, "world": [0, 1, 0, 1], "take": 7, "epoch": 1, "after": 30, "names": ["web", "book"]},
    {"name": "one-stream-mix", "source": [["b", None]], "kwargs": {"mode": "exact", "seed": 1, "buffer_size": 3}, "world": [0, 1, 0, 1], "take": 4, "epoch": 0},
]


def make_dataset(root: str, case: dict[str, Any]) -> ShardDataset:
    """The case's dataset over the datasets under ``root``."""
    world = case["world"]
    kwargs = dict(case["kwargs"], rank=world[0], world_size=world[1], epoch=case["epoch"])
    source = case["source"]
    if isinstance(source, str):
        return ShardDataset(os.path.join(root, source), **kwargs)
    names = case.get("names") or [None] * len(source)
    streams = []
    for (name, weight), label in zip(source, names):
        if isinstance(weight, dict):
            weight = {int(k): v for k, v in weight.items()}
        streams.append(Stream(os.path.join(root, name), weight=weight, name=label))
    return ShardDataset(streams, **kwargs)


def keys(items: Any) -> list[Any]:
    """Keys (and stream names) of samples."""
    return [[s["__key__"], s.get("__stream__")] for s in items]


def slot(case: dict[str, Any]) -> World:
    rank, world_size, worker, num_workers = case["world"]
    return World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)


def make_datasets(root: str) -> None:
    for name, sizes in DATASETS.items():
        build_dataset(os.path.join(root, name), sizes)


def record() -> dict[str, Any]:
    out = []
    with tempfile.TemporaryDirectory() as root:
        make_datasets(root)
        for case in CASES:
            ds = make_dataset(root, case)
            limit = case.get("after")
            whole = keys(itertools.islice(ds.iter_slot(slot(case), epoch=case["epoch"]), limit))
            ds = make_dataset(root, case)
            it = iter(ds)
            head = keys(itertools.islice(it, case["take"]))
            assert head == whole[: case["take"]]
            state = ds.state_dict()
            out.append({**case, "state": state, "order": whole})
    return {"cases": out}


if __name__ == "__main__":
    data = record()
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    sys.stdout.write(f"wrote {FIXTURE}\n")
