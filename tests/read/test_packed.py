"""Packing whole samples into fixed-length sequences (issue #55): best fit
from the stored counts, no sample split, boundaries and per-token fields
aligned, equal steps and resume as for every sample the reader yields."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import shardkit
from shardkit import PackedSamples, ShardDataset
from shardkit.errors import UsageError

SEQ = 1024


def conversation(i: int) -> dict:
    """Ids that say (sample, position); a loss mask that is 1 on the reply (the second half)."""
    rng = np.random.default_rng(i)
    n = int(min(max(rng.lognormal(4.2, 0.8), 2), SEQ))
    mask = (np.arange(n) >= n // 2).astype(np.uint8)
    return {"__key__": f"conv{i:05d}", "tokens.npy": (i * 10_000 + np.arange(n)).astype(np.int32), "mask.npy": mask}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, dict[str, int]]:
    dest = str(tmp_path_factory.mktemp("packed") / "convs")
    shardkit.write_dataset(range(400), dest, map=conversation, options=shardkit.WriteOptions(max_samples=150, workers=1))
    return dest, {conversation(i)["__key__"]: len(conversation(i)["tokens.npy"]) for i in range(400)}


def check_sequence(s: dict, lengths: dict[str, int]) -> int:
    """One sequence's samples whole and in place; returns the tokens it uses."""
    tokens, positions, cu = s["tokens"].numpy(), s["position_ids"].numpy(), s["cu_seqlens"].numpy()
    assert tokens.shape == positions.shape == s["mask.npy"].shape == (SEQ,)
    at = 0
    for part, key in enumerate(s["__key__"]):
        n = lengths[key]
        assert cu[part] == at and cu[part + 1] == at + n  # one part a sample, none split
        assert (tokens[at : at + n] == int(key[4:]) * 10_000 + np.arange(n)).all()
        assert (positions[at : at + n] == np.arange(n)).all()
        assert (s["mask.npy"].numpy()[at : at + n] == (np.arange(n) >= n // 2)).all()
        at += n
    assert (tokens[at:] == 0).all() and (s["mask.npy"].numpy()[at:] == 0).all() and cu[-1] == SEQ
    return at


def test_sequences_hold_whole_samples_with_their_boundaries_and_masks(corpus):
    data, lengths = corpus
    spec = PackedSamples("tokens.npy", SEQ, per_token=("mask.npy",))
    sequences = list(ShardDataset(data, tokens=spec, mode="exact", seed=2))
    keys = [k for s in sequences for k in s["__key__"]]
    assert sorted(keys) == sorted(lengths)
    used = sum(check_sequence(s, lengths) for s in sequences)
    assert used / (len(sequences) * SEQ) > 0.9  # best fit leaves under a tenth as padding here
    batches = list(ShardDataset(data, tokens=spec, mode="exact", seed=2, batch_size=4))
    assert batches[0]["tokens"].shape == batches[0]["mask.npy"].shape == (4, SEQ)
    assert int(batches[0]["cu_seqlens"][-1]) == 4 * SEQ and len(batches[0]["__key__"]) == 4


def test_balanced_ranks_take_equal_steps_and_a_resume_gives_every_sample_once(corpus):
    data, lengths = corpus
    spec = PackedSamples("tokens.npy", SEQ)
    ranks = [list(ShardDataset(data, tokens=spec, mode="balanced", rank=r, world_size=2, seed=3)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(ShardDataset(data, tokens=spec, mode="balanced", rank=0, world_size=2))
    ds = ShardDataset(data, tokens=spec, mode="exact", seed=3, buffer_size=4)
    first = list(itertools.islice(iter(ds), 5))
    again = ShardDataset(data, tokens=spec, mode="exact", seed=3, buffer_size=4)
    again.load_state_dict(ds.state_dict())
    assert sorted(k for s in first + list(again) for k in s["__key__"]) == sorted(lengths)


def test_a_sample_longer_than_a_sequence_is_refused_or_truncated(corpus):
    data, lengths = corpus
    with pytest.raises(UsageError, match=r"more than seq_len=50: raise it, or pass PackedSamples\(\.\.\., too_long='truncate'\)"):
        ShardDataset(data, tokens=PackedSamples("tokens.npy", 50))
    sequences = list(ShardDataset(data, tokens=PackedSamples("tokens.npy", 50, too_long="truncate"), mode="exact"))
    assert all(s["tokens"].shape == (50,) for s in sequences)
    assert sorted(k for s in sequences for k in s["__key__"]) == sorted(lengths)


@pytest.mark.timeout(600)
def test_torchrun_equal_sequences_on_every_rank_then_a_resume_on_fewer(tmp_path):
    """3 ranks x 2 workers with an all_reduce every step over packed sequences, then epoch 1 resumed on 2 ranks."""
    import collections
    import os

    from tests.read.test_budget import skewed_document
    from tests.read.torchrun_util import launch

    data, out = str(tmp_path / "docs"), str(tmp_path / "out")
    shardkit.write_dataset(range(600), data, map=skewed_document, options=shardkit.WriteOptions(max_samples=200, workers=1))
    script = os.path.join(os.path.dirname(__file__), "torchrun_budget.py")
    args = ["--data", data, "--out", out, "--spec", "packed"]
    full = launch(script, 3, [*args, "--phase", "full"], out=out, tag="full-")
    rest = launch(script, 2, [*args, "--phase", "resume"], out=out, tag="resume-")
    assert len({len(r["balanced"]) for r in full}) == 1 and all(size == 2048 for r in full for _, size in r["balanced"])
    epoch1 = collections.Counter(k for r in full for keys, _ in r["saved"] for k in keys)
    epoch1.update(k for r in rest for keys, _ in r["rest"] for k in keys)
    assert len(epoch1) == 600 and max(epoch1.values()) == 1
