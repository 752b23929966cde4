"""Token-budget batches (issue #55): batches of whole samples bounded by
padded tokens, planned from the stored counts, with equal steps on every
rank, every sample once in an exact epoch, and resume."""

from __future__ import annotations

import collections
import itertools
import os

import numpy as np
import pytest

import shardkit
from shardkit import ShardDataset, TokenBudget, make_loader
from shardkit.errors import UsageError
from tests.read.torchrun_util import launch

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_budget.py")


def skewed_document(i: int) -> dict:
    """Lengths from 1 to ~50x the median (about 40): mostly short, a long tail."""
    rng = np.random.default_rng(i)
    n = int(min(max(rng.lognormal(3.6, 0.9), 1), 2000))
    return {"__key__": f"doc{i:05d}", "tokens.npy": (i * 10_000 + np.arange(n)).astype(np.int32)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, dict[str, int]]:
    dest = str(tmp_path_factory.mktemp("budget") / "docs")
    shardkit.write_dataset(range(600), dest, map=skewed_document, options=shardkit.WriteOptions(max_samples=200, workers=1))
    return dest, {skewed_document(i)["__key__"]: len(skewed_document(i)["tokens.npy"]) for i in range(600)}


def _batches(data: str, budget: TokenBudget, **kwargs) -> list[dict]:
    return list(ShardDataset(data, tokens=budget, **kwargs))


@pytest.mark.parametrize("padding", ["longest", "packed"])
def test_an_exact_epoch_gives_every_sample_once_in_batches_within_the_budget(corpus, padding):
    data, lengths = corpus
    budget = TokenBudget("tokens.npy", 2048, padding=padding)
    batches = _batches(data, budget, mode="exact", seed=1)
    keys = [k for b in batches for k in b["__key__"]]
    assert sorted(keys) == sorted(lengths)
    for b in batches:
        sizes = b["lengths"].numpy()
        assert sizes.tolist() == [lengths[k] for k in b["__key__"]]
        cost = len(sizes) * int(sizes.max()) if padding == "longest" else int(sizes.sum())
        assert cost <= 2048
        ids = b["tokens.npy"].numpy()
        for row, key, n in zip(ids, b["__key__"], sizes):  # the tokens as stored, then padding
            assert (row[:n] == int(key[3:]) * 10_000 + np.arange(n)).all() and (row[n:] == 0).all()
    assert len(ShardDataset(data, tokens=budget, mode="exact")) == len(batches)


def test_grouping_by_length_cuts_padding(corpus):
    data, _ = corpus

    def padding(group: bool) -> float:
        batches = _batches(data, TokenBudget("tokens.npy", 2048, group_by_length=group, window=200), mode="exact")
        cells = sum(b["tokens.npy"].numel() for b in batches)
        return sum(int((~b["attention_mask"]).sum()) for b in batches) / cells

    plain, grouped = padding(False), padding(True)
    assert grouped < plain / 2.5  # (here 0.20 against 0.64: a long tail up to the budget)


def test_balanced_ranks_take_equal_steps_whatever_the_lengths(corpus):
    data, _ = corpus
    budget = TokenBudget("tokens.npy", 2048, group_by_length=True)
    ranks = [_batches(data, budget, mode="balanced", rank=r, world_size=3, seed=4) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    assert [len(ShardDataset(data, tokens=budget, mode="balanced", rank=r, world_size=3)) for r in range(3)] == [len(ranks[0])] * 3
    keys = [k for r in ranks for b in r for k in b["__key__"]]
    assert len(keys) == len(set(keys))


def test_a_resumed_epoch_and_a_loader_of_workers_give_every_sample_once(corpus):
    data, lengths = corpus
    budget = TokenBudget("tokens.npy", 1500, group_by_length=True)
    ds = ShardDataset(data, tokens=budget, mode="exact", seed=6, buffer_size=8)
    first = list(itertools.islice(iter(ds), 9))
    again = ShardDataset(data, tokens=budget, mode="exact", seed=6, buffer_size=8)
    again.load_state_dict(ds.state_dict())
    keys = [k for b in first + list(again) for k in b["__key__"]]
    assert sorted(keys) == sorted(lengths)
    loader = make_loader(ShardDataset(data, tokens=budget, mode="exact", seed=6), batch_size=None, num_workers=2)
    assert sorted(k for b in loader for k in b["__key__"]) == sorted(lengths)


def test_a_sample_past_the_budget_is_refused_or_truncated(corpus):
    data, lengths = corpus
    with pytest.raises(UsageError, match=r"shard-000000.tar: sample \d+ holds [\d,]+ tokens in 'tokens.npy', more than "
                                         r"batch_tokens=100: raise it, or pass TokenBudget\(\.\.\., too_long='truncate'\)"):
        ShardDataset(data, tokens=TokenBudget("tokens.npy", 100))
    batches = _batches(data, TokenBudget("tokens.npy", 100, too_long="truncate"), mode="exact")
    assert all(b["tokens.npy"].numel() <= 100 for b in batches)
    assert sorted(k for b in batches for k in b["__key__"]) == sorted(lengths)
    with pytest.raises(UsageError, match="leave batch_size unset"):
        ShardDataset(data, tokens=TokenBudget("tokens.npy", 100), batch_size=4)
    with pytest.raises(UsageError, match="no token counts of field 'txt'"):
        ShardDataset(data, tokens=TokenBudget("txt", 100))


@pytest.mark.timeout(600)
def test_torchrun_equal_steps_then_a_resume_on_fewer_ranks(corpus, tmp_path):
    data, lengths = corpus
    out = str(tmp_path / "out")
    full = launch(SCRIPT, 3, ["--data", data, "--out", out, "--phase", "full"], out=out, tag="full-")
    rest = launch(SCRIPT, 2, ["--data", data, "--out", out, "--phase", "resume"], out=out, tag="resume-")
    steps = [len(r["balanced"]) for r in full]
    assert len(set(steps)) == 1 and [r["balanced_len"][0] for r in full] == steps  # len() is the steps taken
    assert all(size <= 2048 for r in full for _, size in r["balanced"])
    epoch1 = collections.Counter(k for r in full for keys, _ in r["saved"] for k in keys)
    epoch1.update(k for r in rest for keys, _ in r["rest"] for k in keys)
    assert sorted(epoch1) == sorted(lengths) and max(epoch1.values()) == 1


def test_declared_lengths_plan_batches_of_what_no_token_field_counts(corpus, tmp_path):
    """Audio frames, say: lengths given in dataset order plan the batches; the collate batches what the field holds."""
    data, lengths = corpus
    keys = [shardkit.IndexedDataset(data).raw_sample(i).key for i in range(len(lengths))]
    frames = np.array([lengths[k] // 2 + 1 for k in keys])

    def count(samples: list[dict]) -> list[str]:
        return [s["__key__"] for s in samples]

    budget = TokenBudget("tokens.npy", 600, lengths=frames)
    batches = list(ShardDataset(data, tokens=budget, mode="exact", collate=count))
    assert sorted(k for b in batches for k in b) == sorted(keys)
    by_key = dict(zip(keys, frames.tolist()))
    assert all(len(b) * max(by_key[k] for k in b) <= 600 for b in batches)
    with pytest.raises(UsageError, match="lengths has 3 values, the dataset 600 samples"):
        ShardDataset(data, tokens=TokenBudget("tokens.npy", 600, lengths=[1, 2, 3]))
    with pytest.raises(UsageError, match="one non-negative integer a sample"):
        TokenBudget("tokens.npy", 600, lengths=[1.5, 2.0])


def test_a_mixture_of_budget_batches_keeps_each_batch_to_one_source_at_its_share(corpus, tmp_path):
    data, _ = corpus
    other = str(tmp_path / "other")
    shardkit.write_dataset(range(600, 800), other, map=skewed_document, options=shardkit.WriteOptions(max_samples=100, workers=1))
    streams = [shardkit.Stream(data, weight=3.0, name="big"), shardkit.Stream(other, weight=1.0, name="small")]
    for spec in (TokenBudget("tokens.npy", 2048, group_by_length=True), shardkit.PackedSamples("tokens.npy", 1024)):
        whole = list(ShardDataset(streams, tokens=spec, mode="exact", seed=2))
        ds = ShardDataset(streams, tokens=spec, mode="exact", seed=2, buffer_size=8)
        first = list(itertools.islice(iter(ds), 7))
        again = ShardDataset(streams, tokens=spec, mode="exact", seed=2, buffer_size=8)
        again.load_state_dict(ds.state_dict())
        resumed = first + list(again)
        assert len(resumed) == len(whole) == len(ds)
        assert sorted(_flat(b["__key__"]) for b in resumed) == sorted(_flat(b["__key__"]) for b in whole)
        shares = collections.Counter(b["__stream__"] for b in whole)
        assert abs(shares["big"] - 3 * shares["small"]) <= 3  # the weights are shares of batches
        for b in whole:  # each batch holds samples of its one source
            assert all((int(k[3:]) < 600) == (b["__stream__"] == "big") for k in _flat(b["__key__"]))
    with pytest.raises(UsageError, match=r"TokenBudget\(lengths=\.\.\.\) gives one dataset's sample lengths"):
        ShardDataset(streams, tokens=TokenBudget("tokens.npy", 2048, lengths=np.ones(800, dtype=np.int64)))


def _flat(keys: list) -> tuple[str, ...]:
    """A batch's keys (a packed sequence lists its rows' keys)."""
    return tuple(k for group in keys for k in (group if isinstance(group, list) else [group]))
