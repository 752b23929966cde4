"""An append under a running checkpoint, with a real torchrun (2 ranks x 2
workers): the state saved before the append resumes the rest of its epoch
over the samples it knew, each once; the next epoch reads old and new."""

from __future__ import annotations

import collections
import os

import pytest

from shardkit.revise.append import append
from shardkit.write.options import WriteOptions
from shardkit.write.parallel import write_dataset
from tests.read.torchrun_util import launch
from tests.write.test_resume_guard import make_texts

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_append.py")


def _run(data: str, out: str, phase: str) -> list[dict]:
    return launch(SCRIPT, 2, ["--data", data, "--out", out, "--phase", phase], out=out, tag=f"{phase}-")


def _keys(results: list[dict], part: str) -> list[str]:
    return [key for r in results for batch in r[part] for key in batch]


@pytest.mark.timeout(600)
def test_a_checkpoint_saved_before_an_append_finishes_the_old_epoch_then_reads_all(tmp_path):
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    old = [f"a{i:03d}" for i in range(50)]
    new = [f"n{i:03d}" for i in range(20)]
    write_dataset(make_texts(str(tmp_path / "a"), "a", 50), data, options=WriteOptions(max_samples=6, seed=1))
    full = _run(data, out, "full")
    append(data, make_texts(str(tmp_path / "n"), "n", 20), options=WriteOptions(max_samples=6, seed=1))
    resumed = _run(data, out, "resume")
    epoch0 = collections.Counter(_keys(full, "saved") + _keys(resumed, "epoch0"))
    assert sorted(epoch0) == old and max(epoch0.values()) == 1  # the epoch it was saved in: old samples once
    assert [r["epoch0_len"] for r in resumed] == [25, 25]
    epoch1 = collections.Counter(_keys(resumed, "epoch1"))
    assert sorted(epoch1) == sorted(old + new) and max(epoch1.values()) == 1
