"""`shardkit index --engine ray` on the real two-node cluster: the local engine's index, byte for byte."""

from __future__ import annotations

from shardkit.cli import main
from tests.index.test_index import write_wds
from tests.ray.conftest import tree_bytes


def test_ray_engine_index_equals_the_local_engines(ray_cluster, tmp_path):
    src = tmp_path / "src"
    write_wds(src, num=30, per_shard=4)
    assert main(["index", str(src), "--out", str(tmp_path / "local"), "--workers", "2", "-q"]) == 0
    done = ray_cluster.shardkit(
        "index", str(src), "--out", str(tmp_path / "ray"), "--engine", "ray", "--ray-address", ray_cluster.address, "-q"
    )
    assert done.returncode == 0, done.stderr
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
