"""shardkit.ray.read_shards / write_shards on a real two-node Ray cluster."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from shardkit.format.manifest import load_manifest
from shardkit.format.tar import SampleParser
from tests.ray.conftest import tree_bytes


def _samples(manifest) -> dict[str, dict[str, str]]:
    """Every sample of a local dataset, parsed from its shards: key -> {ext: sha256}."""
    out = {}
    for entry in manifest.shards:
        path = manifest.resolve(entry.path)
        parser = SampleParser(path=path)
        with open(path, "rb") as f:
            raws = parser.feed(f.read()) + parser.finish()
        for raw in raws:
            out[raw.key] = {ext: hashlib.sha256(data).hexdigest() for ext, data in raw.fields.items()}
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """4 shards of 5 samples, 3 members each (see tests/conftest.py build_dataset)."""
    from tests.conftest import build_dataset

    return build_dataset(str(tmp_path_factory.mktemp("ray-data") / "ds"), sizes=(5, 5, 5, 5))


def _last_json(done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_read_shards_gives_one_row_per_sample_with_its_bytes(ray_cluster, dataset):
    result = _last_json(ray_cluster.driver("rows", dataset.location))
    assert result["rows"] == _samples(dataset)
    assert result["num_blocks"] >= 4  # one read task per shard at least


def test_read_shards_cuts_sample_ranges_when_shards_are_fewer_than_blocks(ray_cluster, dataset):
    result = _last_json(ray_cluster.driver("rows", dataset.location, "12"))
    assert result["num_blocks"] == 12  # 4 shards x 3 ranges
    assert result["rows"] == _samples(dataset)


def test_read_then_write_keeps_every_byte(ray_cluster, dataset, tmp_path):
    dest = tmp_path / "copy"
    result = _last_json(ray_cluster.driver("roundtrip", dataset.location, str(dest), "5"))
    assert result == {"num_samples": 20, "num_shards": 4}
    original, copy = tree_bytes(Path(dataset.location)), tree_bytes(dest)
    # Same rows in the same order and the same limit: the same shard and index bytes.
    assert {n: b for n, b in copy.items() if n != "manifest.json"} == {
        n: b for n, b in original.items() if n != "manifest.json"
    }
    manifest = load_manifest(str(dest))
    assert [s.sha256 for s in manifest.shards] == [hashlib.sha256(copy[s.path]).hexdigest() for s in manifest.shards]
    assert manifest.source == {"format": "ray.data"}


def test_read_then_write_with_other_limits_keeps_every_sample(ray_cluster, dataset, tmp_path):
    from shardkit.format.manifest import load_manifest

    dest = tmp_path / "resharded"
    result = _last_json(ray_cluster.driver("roundtrip", dataset.location, str(dest), "3"))
    assert result == {"num_samples": 20, "num_shards": 7}
    assert _samples(load_manifest(str(dest))) == _samples(dataset)


def test_write_shards_into_a_folder_another_write_holds_is_refused_in_one_line(ray_cluster, dataset, tmp_path):
    from shardkit.write.destination import holding_destination

    dest = tmp_path / "held"
    with holding_destination(str(dest)):  # as a write or an index running into it holds it
        done = ray_cluster.driver("roundtrip", dataset.location, str(dest), "5")
    assert done.returncode != 0
    assert f"{dest}: another shardkit write or index into this folder is running" in done.stderr
    assert sorted(p.name for p in dest.iterdir()) == []  # nothing written under it


def test_a_dataset_rewritten_into_its_own_folder_keeps_every_sample(ray_cluster, dataset, tmp_path):
    """`write_shards(read_shards(d), d, overwrite=True)`: Ray Data reads
    lazily, so the old shards must all be read before overwrite removes them."""
    import shutil

    folder = tmp_path / "own"
    shutil.copytree(dataset.location, folder)
    result = _last_json(ray_cluster.driver("rewrite", str(folder), "3"))
    assert result == {"num_samples": 20, "num_shards": 7}
    assert _samples(load_manifest(str(folder))) == _samples(dataset)


def test_read_shards_over_http(ray_cluster, dataset):
    result = _last_json(ray_cluster.driver("http", dataset.location))
    assert result["rows"] == _samples(dataset)
    assert result["shard_gets"] >= 4  # the shards came over HTTP, not from the disk


def test_rays_own_read_webdataset_reads_shardkit_shards(ray_cluster, dataset):
    result = _last_json(ray_cluster.driver("webdataset", dataset.location))
    assert result["rows"] == _samples(dataset)


def test_read_shards_over_a_view_of_an_extension_leaves_taken_down_samples_out(ray_cluster, tmp_path):
    """Derived datasets (issue #54) and removals: one task a shard, the joined members, no removed sample."""
    import shardkit
    from shardkit import ShardDataset
    from tests.conftest import build_dataset
    from tests.revise import derived_maps

    pool = str(tmp_path / "pool")
    build_dataset(pool, sizes=(6, 0, 7, 5))
    shardkit.extend(pool, tmp_path / "ext", map=derived_maps.embedding, workers=1)
    shardkit.view(tmp_path / "ext", tmp_path / "view", where="json.i < 5", workers=1)
    gone = sorted(s["__key__"] for s in ShardDataset(tmp_path / "view"))[:2]
    shardkit.remove_samples(pool, gone)
    for name in ("view", "ext"):
        expected = {
            s["__key__"]: {k: hashlib.sha256(v).hexdigest() for k, v in s.items() if not k.startswith("__")}
            for s in ShardDataset(tmp_path / name)
        }
        result = _last_json(ray_cluster.driver("rows", str(tmp_path / name)))
        assert result["rows"] == expected and not set(gone) & set(result["rows"])
    result = _last_json(ray_cluster.driver("rows", pool))
    assert sorted(result["rows"]) == sorted(s["__key__"] for s in ShardDataset(pool))
