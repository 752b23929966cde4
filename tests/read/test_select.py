"""``select``: samples dropped inside the reader, counted, and consumed for
checkpoints (resuming gives every selected sample exactly once)."""

from __future__ import annotations

import itertools
import json

import pytest

from shardkit import ShardDataset, make_loader
from shardkit.errors import UsageError
from shardkit.transforms import ToTuple

SIZES = (9, 7, 8)


def keep(sample: dict) -> bool:
    return sample["cls"] % 3 != 0  # decoded: an int, not bytes


def _selected(manifest) -> set[str]:
    return {s["__key__"] for s in ShardDataset(manifest, mode="exact", shuffle=False, decode="pil") if keep(s)}


def test_select_sees_the_decoded_sample_before_map_and_counts_what_it_drops(make_shards):
    manifest = make_shards(SIZES)
    selected = _selected(manifest)
    assert 0 < len(selected) < sum(SIZES)
    ds = ShardDataset(manifest, mode="exact", decode="pil", select=keep, map=ToTuple("__key__", "cls"))
    loader = make_loader(ds, batch_size=None, num_workers=2)
    got = [key for key, label in loader]
    assert sorted(got) == sorted(selected)
    assert ds.num_filtered == sum(SIZES) - len(selected)


def test_exact_mode_gives_every_selected_sample_once_over_ranks(make_shards):
    manifest = make_shards(SIZES)
    keys = [
        s["__key__"]
        for rank in range(2)
        for s in ShardDataset(manifest, mode="exact", decode="pil", select=keep, rank=rank, world_size=2, seed=4)
    ]
    assert sorted(keys) == sorted(_selected(manifest))


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_gives_every_selected_sample_exactly_once(make_shards, shuffle):
    manifest = make_shards(SIZES)
    kwargs = dict(mode="exact", seed=2, shuffle=shuffle, buffer_size=5, decode="pil", select=keep)
    full = [s["__key__"] for s in ShardDataset(manifest, **kwargs)]
    assert sorted(full) == sorted(_selected(manifest))
    for step in range(len(full) + 1):
        ds = ShardDataset(manifest, **kwargs)
        head = [s["__key__"] for s in itertools.islice(iter(ds), step)]
        state = json.loads(json.dumps(ds.state_dict()))
        again = ShardDataset(manifest, **kwargs)
        again.load_state_dict(state)
        assert head + [s["__key__"] for s in again] == full, step


def test_select_must_be_callable(make_shards):
    with pytest.raises(UsageError, match="select must be a function"):
        ShardDataset(make_shards(SIZES), mode="exact", select="cls")
