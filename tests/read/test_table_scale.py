"""The shard table at 10**6 shards: every global sample maps to the right
shard and offset, opening makes no per-shard Python objects, and the catalog
pickles small. Synthetic metadata: a table file, no shard files."""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import ManifestError
from shardkit.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.format.table_writer import write_shard_table
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


# ------------------------------------------------ stored paths (issue #42)

NUM_NAMED = 200_000


def _write_named(folder: str, names: np.ndarray, index_names: np.ndarray | None = None) -> str:
    """A format-2 dataset whose table stores ``names`` (no naming pattern)."""
    os.makedirs(folder, exist_ok=True)
    n = len(names)
    if index_names is None:
        index_names = np.char.replace(names, b".tar", b".idx")
    table = write_shard_table(folder, np.ones(n), np.full(n, 1024), np.zeros((n, 32), dtype=np.uint8), paths=names,
                              index_paths=index_names, naming=None)
    assert table.naming is None
    manifest = Manifest.from_table(table, source={"format": "synthetic"}, stored_fingerprint="0" * 64)
    with open(os.path.join(folder, MANIFEST_NAME), "w") as f:
        f.write(manifest.to_json())
    return os.path.join(folder, MANIFEST_NAME)


def _irregular_names(n: int) -> np.ndarray:
    """Names of no single pattern: a hash in one of 256 subfolders."""
    hashes = np.random.default_rng(42).integers(0, 1 << 62, n)
    folders = np.char.mod(b"%02x/", hashes % 256)
    return np.char.add(np.char.add(folders, np.char.mod(b"w-%016x", hashes)), b".tar")


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("named"))
    _write_named(folder, _irregular_names(NUM_NAMED))
    return folder


def test_opening_stored_paths_resolves_only_the_first_shard(named, monkeypatch):
    import shardkit.format.manifest as manifest_module

    calls = []
    resolve = manifest_module.resolve_inside

    def counted(base, relative, **kwargs):
        calls.append(relative)
        return resolve(base, relative, **kwargs)

    monkeypatch.setattr(manifest_module, "resolve_inside", counted)
    catalog = resolve_catalog(named, options=SourceOptions())
    names = _irregular_names(3)
    assert calls == [names[0].decode(), names[0].decode()[:-4] + ".idx"]  # shard 0: its path and its index
    assert catalog.url(2) == os.path.join(named, names[2].decode())  # the others when asked
    assert len(calls) == 3 and not catalog.compressed


def test_opening_stored_paths_makes_no_per_shard_objects(named):
    gc.collect()
    tracemalloc.start()
    try:
        catalog = resolve_catalog(named, options=SourceOptions())
        assert catalog.num_shards == NUM_NAMED
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, peak  # a str per shard would be > 20 MB; the column itself is ~6 MB
    assert len(pickle.dumps(catalog)) < 1 << 20


@pytest.mark.parametrize("column", ["path", "index"])
@pytest.mark.parametrize("hostile", ["sub/../../outside.tar", "/etc/passwd", "pipe:cat /etc/passwd", "a\0.tar"])
def test_a_hostile_entry_deep_in_a_stored_column_is_refused_naming_it_and_the_manifest(tmp_path, column, hostile):
    names = _irregular_names(NUM_NAMED)
    index_names = np.char.replace(names, b".tar", b".idx")
    row = 123_457
    (names if column == "path" else index_names)[row] = hostile.encode()
    manifest_file = _write_named(str(tmp_path / "ds"), names, index_names)
    with pytest.raises(ManifestError) as caught:
        resolve_catalog(str(tmp_path / "ds"), options=SourceOptions())
    message = str(caught.value)
    assert manifest_file in message and f"shard {row} {column}" in message, message


def test_compressed_shards_are_told_by_the_ends_of_stored_names(tmp_path):
    names = _irregular_names(1000)
    _write_named(str(tmp_path / "plain"), names)
    assert not resolve_catalog(str(tmp_path / "plain"), options=SourceOptions()).compressed
    index_names = np.char.replace(names, b".tar", b".idx")
    names[777] = b"ab/w-0.TAR.GZ"
    _write_named(str(tmp_path / "gz"), names, index_names)
    catalog = resolve_catalog(str(tmp_path / "gz"), options=SourceOptions())
    assert catalog.compressed and catalog.counts is None


def _mapped_kb(file: str) -> int | None:
    """Resident KB of this process's mappings of ``file`` (Linux), or None."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's first line
            inside = line.rstrip().endswith(file)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.parametrize("which", ["big", "named"])
def test_opening_leaves_the_checked_table_out_of_the_process_memory(request, which):
    """Hashing and checking read every page of the table once; the pages stay
    in the page cache (shared), not in the opening process's own memory."""
    folder = request.getfixturevalue(which)
    folder = folder[0] if isinstance(folder, tuple) else folder
    file = load_manifest(folder).table.file
    before = _mapped_kb(file)  # other tests' catalogs may map it too
    if before is None:
        pytest.skip("no /proc/self/smaps")
    catalog = resolve_catalog(folder, options=SourceOptions())
    assert os.path.getsize(file) > 5 << 20
    assert _mapped_kb(file) - before < 1024, (_mapped_kb(file), before, os.path.getsize(file) >> 10)
    assert catalog.url(7).startswith(folder) and catalog.counts[-1] >= 0  # still readable
