"""Checkpoint under one world size, resume under another, with a real torchrun (gloo)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import build_dataset

SIZES = [9, 0, 13, 5, 11]  # 38 samples
SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_resume.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL_KEYS = sorted(f"s{shard:03d}_{i:05d}" for shard, n in enumerate(SIZES) for i in range(n))


def _torchrun(nproc: int, data: str, out: str, phase: str) -> list[dict]:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    command = [torchrun, "--standalone", f"--nproc_per_node={nproc}", SCRIPT]
    command += ["--data", data, "--out", out, "--phase", phase]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = []
    for rank in range(nproc):
        with open(os.path.join(out, f"{phase}-rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


@pytest.mark.timeout(600)
@pytest.mark.parametrize("old,new", [(3, 2), (2, 4)])
def test_resume_under_another_world_size_sees_every_key_once(tmp_path, old, new):
    data = str(tmp_path / "data")
    build_dataset(data, SIZES)
    saved = _torchrun(old, data, str(tmp_path), "save")
    resumed = _torchrun(new, data, str(tmp_path), "resume")
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
