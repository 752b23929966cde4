"""Token blocks under a real torchrun (gloo): 3 ranks x 2 workers through a
training loop with a collective every step, of one dataset and of a mixture
of token shares, then a checkpoint resumed on 2."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest

from shardkit import ShardDataset, TokenBlocks
from tests.read.token_data import write_documents
from tests.read.torchrun_util import launch

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_tokens.py")


def _torchrun(nproc: int, data: str, out: str, phase: str) -> list[dict]:
    args = ["--data", data, "--out", out, "--phase", phase, "--mix", os.path.join(out, "mix")]
    return launch(SCRIPT, nproc, args, out=out, tag=f"{phase}-")


def _blocks(results: list[dict], part: str) -> list[tuple[int, ...]]:
    return [tuple(block) for r in results for batch in r[part] for block in batch]


@pytest.mark.timeout(600)
def test_equal_steps_on_every_rank_no_token_twice_and_an_elastic_resume(tmp_path):
    data = str(tmp_path / "data")
    documents = write_documents(data, 150)
    total = sum(len(d) for d in documents)
    write_documents(str(tmp_path / "mix" / "short"), 200, long_every=10**9)  # 1-400 tokens each
    write_documents(str(tmp_path / "mix" / "long"), 40, base=10**9, long_every=2)  # every other one 2,000-6,000
    full = _torchrun(3, data, str(tmp_path), "full")
    # balanced: the same steps on every rank (the all_reduce each step returned), as len() said.
    steps = [len(r["balanced"]) for r in full]
    assert len(set(steps)) == 1 and steps[0] == full[0]["balanced_len"][0], steps
    balanced = np.array(_blocks(full, "balanced"))
    assert len(np.unique(balanced)) == balanced.size  # no token twice
    assert len(balanced) > total // 64 - 3 * 2 * 4  # at most one partial batch a worker and world_size blocks lost
    # exact: every full block of the epoch once.
    exact = np.array(_blocks(full, "exact"))
    assert len(exact) == total // 64 and len(np.unique(exact)) == exact.size
    # The mixture: the same steps on every rank, 3:1 of the tokens (the epoch's 30 blocks of the long stream,
    # less fewer than world_size lost to the balanced cut).
    steps = [len(r["mixture"]) for r in full]
    assert len(set(steps)) == 1, steps
    mixed = np.array(_blocks(full, "mixture"))
    assert len(mixed) == 120 and len(np.unique(mixed)) == mixed.size
    assert (mixed >= 10**9).sum() == 30 * 64
    # Saved under 3 ranks x 2 workers, resumed in new processes on 2 ranks: epoch 1's blocks, each once.
    resumed = _torchrun(2, data, str(tmp_path), "resume")
    got = collections.Counter(_blocks(full, "saved") + _blocks(resumed, "exact"))
    ds = ShardDataset(data, tokens=TokenBlocks("tokens.npy", 64), mode="exact", seed=11, epoch=1)
    assert got == collections.Counter(tuple(b.tolist()) for b in ds)
