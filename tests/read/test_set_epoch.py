"""A forgotten ``set_epoch``: the second epoch starting with the first one's
number repeats its order, and says so once."""

from __future__ import annotations

import logging

import pytest
from torch.utils.data import DataLoader

from shardkit import ShardDataset

SIZES = (6, 5, 4)
WARNING = "starts again in the same order as the last: call dataset.set_epoch(epoch)"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and WARNING in r.getMessage()]


def test_a_repeated_epoch_warns_once(make_shards, caplog):
    ds = ShardDataset(make_shards(SIZES), mode="exact", seed=1, buffer_size=4)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        first = [s["__key__"] for s in ds]
        assert _warnings(caplog) == []
        for _ in range(3):
            assert [s["__key__"] for s in ds] == first
    assert _warnings(caplog) == ["epoch 0 " + WARNING + " before each epoch (logged once)"]


def test_set_epoch_before_each_epoch_does_not_warn(make_shards, caplog):
    ds = ShardDataset(make_shards(SIZES), mode="balanced", seed=1, buffer_size=4)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        for epoch in range(3):
            ds.set_epoch(epoch)
            list(ds)
    assert _warnings(caplog) == []


@pytest.mark.parametrize("options", [{"mode": "infinite"}, {"mode": "exact", "shuffle": False}])
def test_no_warning_where_the_epoch_does_not_change_the_order(make_shards, caplog, options):
    ds = ShardDataset(make_shards(SIZES), seed=1, buffer_size=4, **options)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        for _ in range(2):
            for _, _ in zip(range(20), ds):
                pass
    assert _warnings(caplog) == []


def test_worker_processes_record_the_epoch_they_start(make_shards, caplog):
    # Epoch 0 read by DataLoader workers, then again in this process: the
    # workers' start is shared, so this process sees the repeat.
    ds = ShardDataset(make_shards(SIZES), mode="exact", seed=1, buffer_size=4)
    assert len(list(DataLoader(ds, batch_size=None, num_workers=2))) == sum(SIZES)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        list(ds)
    assert len(_warnings(caplog)) == 1
