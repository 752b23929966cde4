"""A mixture under a real torchrun (gloo): 3 ranks x 2 workers, then 2 ranks."""

from __future__ import annotations

import collections
import os

import pytest

from shardkit import ShardDataset, Stream
from tests.conftest import build_dataset
from tests.read.torchrun_util import launch

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_mix.py")
EPOCH = 600


def _torchrun(nproc: int, data: str, out: str, phase: str) -> list[dict]:
    return launch(SCRIPT, nproc, ["--data", data, "--out", out, "--phase", phase], out=out, tag=f"{phase}-")


def _drawn(data: str, epoch: int) -> collections.Counter:
    """Every sample the epoch draws, read in one process."""
    streams = [
        Stream(os.path.join(data, "small"), weight=0.5, name="small"),
        Stream(os.path.join(data, "large"), weight=0.5, name="large"),
    ]
    ds = ShardDataset(streams, samples_per_epoch=EPOCH, mode="exact", seed=7, epoch=epoch)
    return collections.Counter((s["__stream__"], s["__key__"]) for s in ds)


@pytest.mark.timeout(600)
def test_a_small_and_a_large_stream_under_torchrun_then_resumed_on_two_ranks(tmp_path):
    data = str(tmp_path / "data")
    build_dataset(os.path.join(data, "small"), [20, 17], payload_bytes=40)
    build_dataset(os.path.join(data, "large"), [1000] * 5, payload_bytes=40)
    full = _torchrun(3, data, str(tmp_path), "full")
    # balanced: every rank the same steps, each stream within world_size of its share.
    steps = [len(r["balanced"]) for r in full]
    assert len(set(steps)) == 1
    per_stream = collections.Counter(s for r in full for b in r["balanced"] for s, _ in b)
    assert all(EPOCH // 2 - 3 < n <= EPOCH // 2 for n in per_stream.values()), per_stream
    # exact: every drawn sample once, the small stream's 37 samples each 8 or 9 times.
    got = collections.Counter(tuple(x) for r in full for b in r["exact"] for x in b)
    assert got == _drawn(data, 0)
    small = [n for (s, _), n in got.items() if s == "small"]
    assert len(small) == 37 and set(small) <= {8, 9}
    # Every full batch on every rank mixes the streams half and half (within 1).
    for r in full:
        for b in r["balanced"]:
            if len(b) == 8:
                assert abs(sum(s == "small" for s, _ in b) - 4) <= 1, b
    # A checkpoint mid-epoch under 3 ranks (the same processes), resumed in new processes with 2.
    resumed = _torchrun(2, data, str(tmp_path), "resume")
    before = [tuple(x) for r in full for b in r["saved"] for x in b]
    assert len(before) == 3 * 5 * 8
    after = [tuple(x) for r in resumed for b in r["exact"] for x in b]
    assert collections.Counter(before + after) == _drawn(data, 1)
