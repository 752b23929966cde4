"""What IndexedDataset keeps open per process: each shard's index open and
checked once, descriptors within the budget, crafted indexes still refused
before the read they govern."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest
import torch

import shardkit.read.handles
from shardkit.errors import CorruptShardError, UsageError
from shardkit.format.index import encode_index
from shardkit.read.handles import (
    MAX_OPEN_SHARDS,
    MIN_OPEN_SHARDS,
    RecentTable,
    open_shard_limit,
    shards_for_descriptors,
)
from shardkit.read.indexed import IndexedDataset
from tests.conftest import build_dataset
from tests.read.test_indexed import _open_shard_files

#: More shards than the 64 a process kept before the table was sized from its descriptor limit.
NUM_SHARDS = 80


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    return build_dataset(str(tmp_path_factory.mktemp("many")), (2,) * NUM_SHARDS, payload_bytes=10)


@pytest.fixture
def index_loads(monkeypatch):
    """Index files IndexedDataset opened and checked, in order."""
    loads: list[str] = []
    real = shardkit.read.handles.open_local_index

    def spy(path, **kwargs):
        loads.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(shardkit.read.handles, "open_local_index", spy)
    return loads


def test_random_reads_over_many_shards_load_each_index_once(many, index_loads):
    ds = IndexedDataset(many)
    order = np.random.default_rng(3).permutation(len(ds)).tolist()
    for i in order + order:  # every sample twice, shards visited in random order
        assert ds[i]["__index__"] == i
    assert len(index_loads) == NUM_SHARDS and len(set(index_loads)) == NUM_SHARDS


def test_open_descriptors_stay_within_two_a_shard(many):
    folder = os.path.realpath(many.base)

    def held() -> tuple[int, int]:
        return len(_open_shard_files(folder, ".tar")), len(_open_shard_files(folder, ".idx"))

    before = held()  # another test's dataset may await the garbage collector
    ds = IndexedDataset(many, max_open_shards=MIN_OPEN_SHARDS)
    for i in np.random.default_rng(4).permutation(len(ds)).tolist():
        ds[i]
        assert sum(held()) - sum(before) <= 2 * MIN_OPEN_SHARDS
    assert held()[1] - before[1] == MIN_OPEN_SHARDS  # one descriptor an index
    ds.close()
    assert held() == before


def test_the_default_table_is_half_the_descriptor_limit_two_a_shard(many):
    assert [shards_for_descriptors(n) for n in (1024, 20_000, 10, 1 << 20, resource.RLIM_INFINITY)] == [
        256, 5000, MIN_OPEN_SHARDS, MAX_OPEN_SHARDS, MAX_OPEN_SHARDS
    ]
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert open_shard_limit() == shards_for_descriptors(soft)
    ds = IndexedDataset(many)
    ds[0]
    assert ds._held.limit == open_shard_limit()


def test_fetched_indexes_are_held_within_their_byte_budget():
    table = RecentTable(100, max_weight=1000)
    for key in range(5):
        table.put(key, str(key), weight=300)
    assert list(table) == [2, 3, 4] and table.weight == 900
    table.put("mapped", "m")  # a mapping weighs nothing
    assert list(table) == [2, 3, 4, "mapped"]
    assert table.drop_all() == ["2", "3", "4", "m"] and table.weight == 0


def _bounds(manifest, shard: int) -> np.ndarray:
    with open(manifest.resolve(manifest.shards[shard].index), "rb") as f:
        return np.load(f).copy()


@pytest.mark.parametrize(
    "craft, why",
    [
        (lambda b: np.array([b[0], b[2], b[2]]), "boundaries do not rise"),
        (lambda b: b[:-1], "it lists 1 samples but the manifest says 2"),
        (lambda b: np.concatenate([b[:2], b[2:] + 1024]), "its last boundary, .* leaves no end marker"),
        (lambda b: np.concatenate([b[:2], b[2:] + 1]), "a boundary is not on a 512-byte tar block"),
    ],
    ids=["not-rising", "wrong-count", "past-the-shard", "off-block"],
)
def test_a_crafted_index_is_refused_before_any_read_of_its_shard(make_shards, craft, why):
    manifest = make_shards((2, 2, 2), payload_bytes=10)
    crafted = encode_index(craft(_bounds(manifest, 1)))
    with open(manifest.resolve(manifest.shards[1].index), "wb") as f:
        f.write(crafted)
    ds = IndexedDataset(manifest)
    assert ds[1]["__index__"] == 1 and ds[5]["__index__"] == 5  # its neighbours read, their indexes held
    folder = os.path.realpath(manifest.base)
    for _ in range(2):  # refused again, not remembered as loaded
        with pytest.raises(CorruptShardError, match=rf"shard-000001\.idx: offset index is corrupt: {why}"):
            ds[3]
        assert not any(path.endswith("shard-000001.tar") for path in _open_shard_files(folder))  # never opened
    assert ds[4]["__index__"] == 4


def _no_opens(_worker_id: int) -> None:
    """A worker that may not open a shard itself."""

    def refuse(path, **kwargs):
        raise AssertionError(f"a worker opened {path}")

    shardkit.read.handles.open_local_index = refuse


@pytest.mark.parametrize("how", ["open_shards", "before_fork", "more_than_held"])
def test_forked_workers_read_the_shards_the_main_process_opened(many, how):
    """With open_shards(), or on its own before the DataLoader forks, the
    main process opens every shard and the workers open none; with more
    shards than a process holds, each worker opens what it reads."""
    ds = IndexedDataset(many, max_open_shards=NUM_SHARDS // 2 if how == "more_than_held" else None)
    if how == "open_shards":
        assert ds.open_shards() is ds and len(ds._held) == NUM_SHARDS
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, sampler=torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)),
        num_workers=2, multiprocessing_context="fork", worker_init_fn=_no_opens, collate_fn=list,
    )  # fmt: skip
    if how == "more_than_held":
        try:
            next(iter(loader))
        except AssertionError as exc:
            message = str(exc)
            exc.__traceback__ = None  # its frames hold the loader: its workers stop now, not in a later gc
        assert "a worker opened" in message and len(ds._held) == 0
        return
    got = [sample["__index__"] for batch in loader for sample in batch]
    assert sorted(got) == list(range(len(ds))) and len(ds._held) == NUM_SHARDS


def test_open_shards_refuses_more_shards_than_a_process_holds(many):
    with pytest.raises(UsageError, match=rf"has {NUM_SHARDS} shards, more than the 8 a process holds open"):
        IndexedDataset(many, max_open_shards=MIN_OPEN_SHARDS).open_shards()
