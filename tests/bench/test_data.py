"""The generated benchmark data set."""

from __future__ import annotations

import os

import numpy as np

from bench.harness.data import DataSpec, ensure_data, list_images, make_jpeg


def test_make_jpeg_gives_varied_photo_sized_jpegs():
    rng = np.random.default_rng(0)
    images = [make_jpeg(rng) for _ in range(8)]
    assert all(data[:3] == b"\xff\xd8\xff" for data in images)
    sizes = [len(data) for data in images]
    assert len(set(sizes)) == len(sizes)
    assert 20_000 < np.mean(sizes) < 250_000


def test_ensure_data_writes_tree_shards_and_ceiling_and_reuses_them(tmp_path):
    spec = DataSpec(num_images=12, num_classes=3, num_shards=2, ceiling_bytes=1 << 20)
    paths = ensure_data(str(tmp_path / "d"), spec)
    items = list_images(paths["imagefolder"])
    assert len(items) == 12 and {label for _, label in items} == {0, 1, 2}
    tars = sorted(f for f in os.listdir(paths["shards"]) if f.endswith(".tar"))
    assert tars == ["shard-000000.tar", "shard-000001.tar"]
    assert os.path.exists(os.path.join(paths["shards"], "manifest.json"))
    assert os.path.getsize(paths["ceiling"]) == 1 << 20
    stamp = os.path.getmtime(items[0][0])
    assert ensure_data(str(tmp_path / "d"), spec) == paths
    assert os.path.getmtime(items[0][0]) == stamp  # reused, not rewritten


def test_ensure_data_repacks_only_the_shards_when_only_their_number_changes(tmp_path):
    spec = DataSpec(num_images=12, num_classes=3, num_shards=2, ceiling_bytes=1 << 20)
    paths = ensure_data(str(tmp_path / "d"), spec)
    first = list_images(paths["imagefolder"])[0][0]
    stamps = os.path.getmtime(first), os.path.getmtime(paths["ceiling"])
    ensure_data(str(tmp_path / "d"), DataSpec(num_images=12, num_classes=3, num_shards=3, ceiling_bytes=1 << 20))
    tars = sorted(f for f in os.listdir(paths["shards"]) if f.endswith(".tar"))
    assert tars == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert (os.path.getmtime(first), os.path.getmtime(paths["ceiling"])) == stamps
    # Anything else changed regenerates everything.
    ensure_data(str(tmp_path / "d"), DataSpec(num_images=9, num_classes=3, num_shards=3, ceiling_bytes=1 << 20))
    assert len(list_images(paths["imagefolder"])) == 9


def test_scale_benchmark_makes_an_upgraded_dataset_of_hard_linked_shards(tmp_path):
    """bench_scale's shardkit dataset: one real shard linked N times, its
    listing written as format 1, upgraded in place; every reader path opens it."""
    from bench.harness.scale_data import prepare
    from shardkit import ShardDataset
    from shardkit.verify import verify_dataset

    info = prepare(str(tmp_path), "shardkit", 4, 3, upgrade=True)
    assert info["format_version"] == 2 and "upgrade_error" not in info
    paths = {os.path.realpath(os.path.join(info["path"], f"shard-{i:06d}.tar")) for i in range(3)}
    assert len({os.stat(p).st_ino for p in paths}) == 1  # links to one file
    keys = [s["__key__"] for s in ShardDataset(info["path"], mode="exact", shuffle=False)]
    assert len(keys) == 12 and len(set(keys)) == 4  # the same 4 samples in each shard
    assert verify_dataset(info["path"]).num_samples_checked == 12


def test_scale_benchmark_makes_wide_and_irregular_names_upgraded_as_index_would_name_them(tmp_path):
    """bench_scale's issue-#42 datasets: 7-digit names get a naming pattern
    when upgraded; names of no single pattern (in subfolders) a stored path each."""
    from bench.harness.scale_data import prepare
    from shardkit import IndexedDataset, ShardDataset
    from shardkit.format.manifest import load_manifest

    wide = prepare(str(tmp_path), "shardkit-wide", 4, 3, upgrade=True)
    irregular = prepare(str(tmp_path), "shardkit-irregular", 4, 3, upgrade=True)
    for info in (wide, irregular):
        assert info["format_version"] == 2 and "upgrade_error" not in info
        assert len(list(ShardDataset(info["path"], mode="exact", shuffle=False))) == 12
        assert len(IndexedDataset(info["path"])) == 12
    assert load_manifest(wide["path"]).table.naming.shard == "shard-{:07d}.tar"
    table = load_manifest(irregular["path"]).table
    assert table.naming is None and len({table.path(i).split("/")[0] for i in range(3)}) == 3
    assert os.path.exists(os.path.join(irregular["path"], table.path(2)))
