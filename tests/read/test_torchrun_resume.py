"""Checkpoint under one world size, resume under another, with a real torchrun (gloo)."""

from __future__ import annotations

import collections
import json
import os

import pytest

from tests.conftest import build_dataset
from tests.read.resume_model import Model, ModelPlan, per_epoch
from tests.read.torchrun_util import launch

SIZES = [9, 0, 13, 5, 11]  # 38 samples
SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_resume.py")
ALL_KEYS = sorted(f"s{shard:03d}_{i:05d}" for shard, n in enumerate(SIZES) for i in range(n))


def _torchrun(nproc: int, data: str, out: str, phase: str, *, infinite: bool) -> list[dict]:
    args = ["--data", data, "--out", out, "--phase", phase] + (["--infinite"] if infinite else [])
    return launch(SCRIPT, nproc, args, out=out, tag=f"{phase}-")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("old,new", [(3, 2), (2, 4)])
def test_resume_under_another_world_size_sees_every_key_once(tmp_path, old, new):
    data = str(tmp_path / "data")
    build_dataset(data, SIZES)
    infinite = (old, new) == (3, 2)  # one case is enough, and each costs a loader per rank and phase
    saved = _torchrun(old, data, str(tmp_path), "save", infinite=infinite)
    resumed = _torchrun(new, data, str(tmp_path), "resume", infinite=infinite)
    for mode in ("exact", "balanced"):
        before = [k for r in saved for k in r[mode]]
        assert len(before) == old * 3 * 2  # every rank took 3 batches of 2
        after_per_rank = [r[mode] for r in resumed]
        seen = collections.Counter(before + [k for keys in after_per_rank for k in keys])
        assert max(seen.values()) == 1, mode
        counts = [len(keys) for keys in after_per_rank]
        if mode == "exact":
            assert sorted(seen) == ALL_KEYS
            assert max(counts) - min(counts) <= 1
        else:
            assert len(set(counts)) == 1  # equal steps on every new rank
            assert len(ALL_KEYS) - sum(seen.values()) < old + new  # fewer than world_size dropped per level
    if infinite:
        _check_infinite(tmp_path, saved, resumed)


def _delivered(path: str) -> dict[tuple[int, int], int]:
    with open(path) as f:
        level = json.load(f)["levels"][-1]
    return {(r, w): n for r, counts in enumerate(level["delivered"]) for w, n in enumerate(counts)}


def _check_infinite(tmp_path, saved: list[dict], resumed: list[dict]) -> None:
    """3 ranks, then 2 (no worker processes): the old ranks delivered what
    the model of infinite mode gives for the counts their gathered state
    records, the new ones what it gives for the rest; per epoch in flight at
    the checkpoint, the keys before and after cover the epoch exactly once."""
    model = Model(SIZES, seed=11, buffer_size=4, interleave=1, start=1)
    start = ModelPlan(1)
    before = model.read_level(start, (3, 1), _delivered(str(tmp_path / "state-infinite.json")))
    plan = model.next_plan(start, before)
    after = model.read_level(plan, (2, 1), {(r, 0): len(result["infinite"]) for r, result in enumerate(resumed)})
    for got, level in ((saved, before), (resumed, after)):
        for rank, result in enumerate(got):
            assert result["infinite"] == [k for _, k in level[rank, 0]], rank
    assert len({epoch for tagged in before.values() for epoch, _ in tagged}) == 2  # ranks stopped in two epochs
    counts = per_epoch(before, after)
    for epoch in range(1, plan.epoch + len(plan.carried)):
        assert sorted(counts[epoch].elements()) == ALL_KEYS, epoch
    assert all(max(c.values()) == 1 for c in counts.values())
