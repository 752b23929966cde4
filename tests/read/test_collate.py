"""Batches of samples whose tensors differ in shape fail with a clear error."""

from __future__ import annotations

import pytest
import torch

from shardkit import ShardDataset, make_loader
from shardkit.errors import UsageError
from shardkit.read.collate import collate_samples


def _ragged(sample: dict) -> dict:
    side = int(sample["cls"]) + 1  # labels 0..9: sizes differ within a batch
    return {"__key__": sample["__key__"], "jpg": torch.zeros(3, side, 4, dtype=torch.uint8), "label": side}


def test_collate_names_the_field_the_shapes_and_the_remedy():
    samples = [
        {"__key__": "a", "jpg": torch.zeros(3, 5, 4), "label": 1},
        {"__key__": "b", "jpg": torch.zeros(3, 5, 4), "label": 2},
        {"__key__": "c", "jpg": torch.zeros(3, 7, 4), "label": 3},
    ]
    with pytest.raises(UsageError, match=r"field 'jpg'.*\(3, 5, 4\) in sample 'a' and \(3, 7, 4\) in sample 'c'") as info:
        collate_samples(samples)
    assert "map=shardkit.transforms.MapField('jpg', shardkit.transforms.DecodeRandomResizedCrop(224))" in str(
        info.value
    )
    assert "collate=list" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_collate_finds_the_field_in_tuples_and_lets_other_errors_through():
    with pytest.raises(UsageError, match=r"field '0'.*\(2,\) in sample 0 of the batch and \(3,\) in sample 1"):
        collate_samples([(torch.zeros(2), 1), (torch.zeros(3), 2)])

    def broken(samples):
        raise RuntimeError("not about shapes")

    with pytest.raises(RuntimeError, match="not about shapes"):
        collate_samples([{"x": torch.zeros(2)}, {"x": torch.zeros(2)}], collate=broken)
    assert collate_samples([{"x": torch.zeros(2)}, {"x": torch.ones(2)}])["x"].shape == (2, 2)


def test_batching_in_the_dataset_reports_the_ragged_field(make_shards):
    ds = ShardDataset(make_shards([10, 10]), mode="exact", map=_ragged, batch_size=8, buffer_size=1)
    with pytest.raises(UsageError, match=r"cannot batch field 'jpg': its tensors differ in shape"):
        next(iter(ds))
    listed = ShardDataset(make_shards([10, 10], name="b"), mode="exact", map=_ragged, batch_size=8, collate=list)
    assert len(next(iter(listed))) == 8  # the list remedy works


def test_batching_in_loader_workers_reports_the_ragged_field(make_shards):
    ds = ShardDataset(make_shards([10, 10]), mode="exact", map=_ragged)
    loader = make_loader(ds, batch_size=8, num_workers=2)
    with pytest.raises(UsageError, match=r"cannot batch field 'jpg': its tensors differ in shape, \(3, \d+, 4\) in sample 's0"):
        next(iter(loader))
