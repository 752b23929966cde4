"""States and sample orders recorded by shardkit before the single-dataset
and mixture read paths became one (issue #22) still hold: the same samples
in the same order, and a recorded state resumes where it was taken."""

from __future__ import annotations

import io
import itertools
import json
import pickle

import numpy as np
import pytest

from shardkit.read.catalog import ShardCatalog

from tests.read.record_states import FIXTURE, keys, make_dataset, make_datasets

with open(FIXTURE) as _f:
    RECORDED = json.load(_f)["cases"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("recorded"))
    make_datasets(path)
    return path


@pytest.mark.parametrize("case", RECORDED, ids=[c["name"] for c in RECORDED])
def test_sample_order_is_the_recorded_one(root, case):
    ds = make_dataset(root, case)
    assert keys(itertools.islice(iter(ds), case.get("after"))) == case["order"]


@pytest.mark.parametrize("case", RECORDED, ids=[c["name"] for c in RECORDED])
def test_a_recorded_state_resumes_where_it_was_taken(root, case):
    ds = make_dataset(root, case)
    ds.set_epoch(0)
    ds.load_state_dict(case["state"])
    assert ds.epoch == case["epoch"]
    assert ds.state_dict() == case["state"]  # a loaded state is saved back unchanged
    limit = case.get("after")
    tail = keys(itertools.islice(iter(ds), None if limit is None else limit - case["take"]))
    assert tail == case["order"][case["take"] :]


class _ArraysOutsideCatalogs(pickle.Pickler):
    """Pickles an object, leaving its catalogs out (they pickle themselves:
    see tests of read/catalog), and lists every numpy array it meets."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file)
        self.arrays: list[tuple[int, ...]] = []

    def persistent_id(self, obj):
        return id(obj) if isinstance(obj, ShardCatalog) else None

    def reducer_override(self, obj):
        if isinstance(obj, np.ndarray):
            self.arrays.append(obj.shape)
        return NotImplemented


@pytest.mark.parametrize("case", RECORDED, ids=[c["name"] for c in RECORDED])
def test_the_dataset_pickles_no_per_shard_array_besides_its_catalogs(root, case):
    ds = make_dataset(root, case)
    list(itertools.islice(iter(ds), 5))  # iterating keeps nothing per shard either
    _ = ds.num_samples, ds.plan if ds.mixture is None else ds.mixture
    pickler = _ArraysOutsideCatalogs(io.BytesIO())
    pickler.dump(ds)
    assert pickler.arrays == []
