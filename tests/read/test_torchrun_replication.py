"""Tensor-parallel groups (``replication=``) under a real torchrun (gloo):
4 ranks in 2 groups read identical batches within a group and split the
epoch between groups, and a checkpoint resumes in new processes, in 2
groups again and in 1."""

from __future__ import annotations

import collections
import os

import pytest

from tests.conftest import build_dataset
from tests.read.torchrun_util import launch

SIZES = [9, 14, 0, 13, 7, 11]  # 54 samples
SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_replication.py")
ALL_KEYS = sorted(f"s{shard:03d}_{i:05d}" for shard, n in enumerate(SIZES) for i in range(n))


def _torchrun(nproc: int, replication: int, data: str, out: str, phase: str) -> list[dict]:
    args = ["--data", data, "--out", out, "--phase", phase, "--replication", str(replication)]
    return launch(SCRIPT, nproc, args, out=out, tag=f"{phase}-")


def _keys(results: list[dict], part: str) -> list[str]:
    return [key for r in results for batch in r[part] for key in batch]


@pytest.mark.timeout(600)
def test_four_ranks_in_two_groups_read_as_two_ranks_and_resume_per_group(tmp_path):
    data = str(tmp_path / "data")
    build_dataset(data, SIZES)
    full = _torchrun(4, 2, data, str(tmp_path / "full"), "full")
    assert [r["group"] for r in full] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    for part in ("exact", "balanced", "saved"):
        # Both ranks of a group: the same batches, in the same order.
        assert full[0][part] == full[1][part] and full[2][part] == full[3][part], part
        assert full[0][part] != full[2][part], part
    exact = _keys(full[::2], "exact")  # one rank of each group: the epoch once
    assert sorted(exact) == ALL_KEYS
    assert len(full[0]["balanced"]) == len(full[2]["balanced"])  # equal steps across groups
    assert len(set(_keys(full[::2], "balanced"))) == len(_keys(full[::2], "balanced")) >= len(ALL_KEYS) - 2
    saved = _keys(full[::2], "saved")
    assert len(saved) == 2 * 3 * 2  # each group took 3 batches of 2
    for nproc, replication in ((4, 2), (2, 2)):  # the same 2 groups; then 1 group of 2
        out = tmp_path / f"resume-{nproc}"
        os.makedirs(out)
        os.link(tmp_path / "full" / "state-replication.json", out / "state-replication.json")
        resumed = _torchrun(nproc, replication, data, str(out), "resume")
        for first in range(0, nproc, replication):
            assert resumed[first]["exact"] == resumed[first + 1]["exact"]
        seen = collections.Counter(saved + _keys(resumed[::replication], "exact"))
        assert sorted(seen) == ALL_KEYS and max(seen.values()) == 1, (nproc, replication)


STEPS_SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_replication_steps.py")
STEP_SIZES = [23, 17, 0, 31, 12, 29, 8]  # 120 samples


def _check_steps(steps: list[list[list[str]]], case: str) -> list[list[str]]:
    """Every step: ranks 0 and 1 (group 0) took one batch, ranks 2 and 3
    (group 1) another, with no key in both; returns the groups' batches."""
    assert steps, case
    for step, (r0, r1, r2, r3) in enumerate(steps):
        assert r0 == r1 and r2 == r3, (case, step, r0, r1, r2, r3)
        assert not set(r0) & set(r2), (case, step)
    return [batch for step in steps for batch in (step[0], step[2])]


@pytest.mark.timeout(600)
def test_groups_take_identical_batches_at_every_step_with_two_workers(tmp_path):
    """Out-of-order delivery hands each rank whichever worker's batch is
    ready first; with replication the loader delivers in order, so both
    ranks of a group take the same batch at every step, batched by the
    loader or the dataset or not at all, and across a resume."""
    data = str(tmp_path / "data")
    build_dataset(data, STEP_SIZES)
    all_keys = {f"s{shard:03d}_{i:05d}" for shard, n in enumerate(STEP_SIZES) for i in range(n)}
    (full,) = launch(STEPS_SCRIPT, 4, ["--data", data, "--out", str(tmp_path), "--phase", "full"], out=str(tmp_path),
                     tag="full-")[:1]  # fmt: skip
    for case in ("loader_batch", "dataset_batch", "samples", "not_persistent", "plain_dataloader", "stateful_dataloader"):
        keys = [key for batch in _check_steps(full[case], case) for key in batch]
        assert len(keys) == len(set(keys)) and len(keys) >= len(all_keys) - 8, case  # balanced: a few dropped
        assert set(keys) <= all_keys, case
    (resumed,) = launch(STEPS_SCRIPT, 4, ["--data", data, "--out", str(tmp_path), "--phase", "resume"],
                        out=str(tmp_path), tag="resume-")[:1]  # fmt: skip
    keys = [key for batch in _check_steps(full["saved"] + resumed["resumed"], "resume") for key in batch]
    assert len(keys) == len(set(keys)) and len(keys) >= len(all_keys) - 8
