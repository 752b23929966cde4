"""The Ray engine and ``shardkit.ray.write_shards`` against what DEST holds
(issue #53): ``write --engine ray --resume`` continues only its own
interrupted write, ``write_shards`` never writes over a dataset or a write
without ``overwrite=True``, and no byte in DEST changes when either refuses.
The local writers: tests/write/test_resume_guard.py."""

from __future__ import annotations

import pytest

from shardkit.cli import main
from tests.ray.conftest import tree_bytes
from tests.write.test_resume_guard import OCCUPANTS, make_texts, occupy


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard-sources")
    return make_texts(str(root / "a"), "a", 40), make_texts(str(root / "b"), "b", 30)


@pytest.mark.parametrize("kind", OCCUPANTS)
def test_ray_engine_resume_refuses_what_is_not_its_own_write(ray_cluster, sources, tmp_path, kind):
    dest = tmp_path / "dest"
    held = occupy(kind, str(dest), sources, tmp_path)
    before = tree_bytes(dest)
    done = ray_cluster.shardkit("write", sources[0], str(dest), "--engine", "ray", "--ray-address", ray_cluster.address,
                                "--max-samples", "10", "--seed", "3", "--resume", "-q")  # fmt: skip
    assert done.returncode == 2 and f"holds {held}" in done.stderr, done.stderr
    assert tree_bytes(dest) == before


def test_ray_engine_resumes_the_interrupted_write_it_belongs_to(ray_cluster, sources, tmp_path):
    from tests.write.test_resume_guard import interrupted_write

    clean, dest = tmp_path / "clean", tmp_path / "dest"
    assert main(["write", sources[0], str(clean), "--max-samples", "4", "--seed", "3", "-q"]) == 0
    interrupted_write(sources[0], str(dest), max_samples=4)
    done = ray_cluster.shardkit("write", sources[0], str(dest), "--engine", "ray", "--ray-address", ray_cluster.address,
                                "--max-samples", "4", "--seed", "3", "--resume", "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert tree_bytes(dest) == tree_bytes(clean)


@pytest.mark.parametrize("kind", OCCUPANTS)
def test_write_shards_refuses_a_dataset_a_write_or_an_index(ray_cluster, sources, tmp_path, kind):
    shards = tmp_path / "shards-a"
    assert main(["write", sources[0], str(shards), "--max-samples", "10", "-q"]) == 0
    dest = tmp_path / "dest"
    held = occupy(kind, str(dest), sources, tmp_path)
    before = tree_bytes(dest)
    done = ray_cluster.driver("roundtrip", str(shards), str(dest), "5")
    assert done.returncode != 0 and f"holds {held}" in done.stderr and "overwrite=True" in done.stderr, done.stderr
    assert tree_bytes(dest) == before
