"""The shard table at 10**6 shards: every global sample maps to the right
shard and offset, opening makes no per-shard Python objects, and the catalog
pickles small. Synthetic metadata: a table file, no shard files."""

from __future__ import annotations

import gc
import json
import os
import pickle
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.format.table import write_shard_table
from shardkit.io.base import SourceOptions
from shardkit.read.catalog import resolve_catalog

NUM_SHARDS = 10**6


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A format-2 dataset of 10**6 shards with random counts (zeros included)."""
    folder = str(tmp_path_factory.mktemp("big"))
    rng = np.random.default_rng(22)
    counts = rng.integers(0, 12, NUM_SHARDS)
    table = write_shard_table(folder, counts, counts * 1024 + 1024, np.zeros((NUM_SHARDS, 32), dtype=np.uint8))
    manifest = Manifest.from_table(table, source={"format": "synthetic"}, stored_fingerprint="0" * 64)
    with open(os.path.join(folder, MANIFEST_NAME), "w") as f:
        f.write(manifest.to_json())
    return folder, counts


@pytest.fixture(scope="module")
def big_catalog(big):
    return resolve_catalog(big[0], options=SourceOptions())


def test_every_global_index_maps_to_its_shard_and_offset(big):
    folder, counts = big
    catalog = resolve_catalog(folder, options=SourceOptions())
    assert catalog.num_shards == NUM_SHARDS and np.array_equal(catalog.counts, counts)
    total = int(counts.sum())
    samples = np.arange(total)
    shard = np.searchsorted(catalog.starts, samples, side="right") - 1
    assert np.array_equal(shard, np.repeat(np.arange(NUM_SHARDS), counts))
    offset = samples - catalog.starts[shard]
    assert (offset >= 0).all() and (offset < counts[shard]).all()
    assert catalog.url(NUM_SHARDS - 1).endswith("shard-999999.tar")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_shard_of_any_sample(big, big_catalog, data):
    _, counts = big
    catalog = big_catalog
    sample = data.draw(st.integers(0, int(counts.sum()) - 1))
    shard, offset = catalog.shard_of(sample)
    assert counts[shard] > 0 and 0 <= offset < counts[shard]
    assert int(counts[:shard].sum()) + offset == sample


def test_opening_makes_no_per_shard_objects(big):
    folder, _ = big
    gc.collect()
    tracemalloc.start()
    try:
        catalog = resolve_catalog(folder, options=SourceOptions())
        assert catalog.num_samples > 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one small Python object per shard would be > 50 MB; the checks on open
    # allocate a few column-sized temporaries (8 MB each)
    assert peak < 32 << 20, peak


def test_catalog_and_manifest_pickle_small_and_reopen(big):
    folder, counts = big
    catalog = resolve_catalog(folder, options=SourceOptions())
    data = pickle.dumps(catalog)
    assert len(data) < 1 << 20
    again = pickle.loads(data)
    assert np.array_equal(again.counts, counts) and again.fingerprint == catalog.fingerprint
    assert len(pickle.dumps(load_manifest(folder))) < 4096
    assert json.loads(open(os.path.join(folder, MANIFEST_NAME)).read())["num_shards"] == NUM_SHARDS
