"""An extension read under a real torchrun: 3 ranks x 2 workers, resumed on 2
(issue #54). Every sample of the epoch arrives once, with the parent's members
and the new ones exactly as a dataset holding both would give them."""

from __future__ import annotations

import collections
import os

import pytest

import shardkit
from tests.conftest import build_dataset
from tests.read.torchrun_util import launch
from tests.revise import derived_maps
from tests.revise.torchrun_extend import member_digest

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_extend.py")


@pytest.mark.timeout(600)
def test_an_extension_under_torchrun_resumed_on_fewer_ranks_gives_every_joined_sample_once(tmp_path):
    pool, ext, out = str(tmp_path / "pool"), str(tmp_path / "ext"), str(tmp_path / "out")
    build_dataset(pool, (9, 0, 14, 6, 11, 7))
    shardkit.extend(pool, ext, map=derived_maps.embedding, workers=2)
    expected = {}
    for sample in shardkit.ShardDataset(pool, mode="exact"):
        joined = {**sample, **derived_maps.expected_fields(sample)}
        expected[sample["__key__"]] = member_digest(joined)
    full = launch(SCRIPT, 3, ["--data", ext, "--out", out, "--phase", "full"], out=out, tag="full-")
    rest = launch(SCRIPT, 2, ["--data", ext, "--out", out, "--phase", "resume"], out=out, tag="resume-")
    seen = [tuple(s) for r in full for batch in r["saved"] for s in batch]
    seen += [tuple(s) for r in rest for batch in r["rest"] for s in batch]
    counts = collections.Counter(key for key, _ in seen)
    assert sorted(counts) == sorted(expected) and max(counts.values()) == 1
    assert dict(seen) == expected  # the joined members, byte for byte
