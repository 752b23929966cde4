"""`shardkit write --engine ray` from a Parquet table of URLs: the local engine's bytes, skips counted by reason.

The photos are served by ``python -m http.server`` inside the cluster's
network namespace (its 127.0.0.1 is not the test process's), so the local
engine and the Ray tasks on both nodes fetch the same URLs.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.ray.conftest import tree_bytes
from tests.write.url_servers import photo_jpeg

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FLAGS = ("--field", "jpg=URL", "--field", "txt=TEXT", "--max-samples", "3", "--seed", "3",
         "--read-timeout", "5", "--retries", "0", "-q")  # fmt: skip


def test_parquet_of_urls_through_ray_gives_the_local_engines_bytes(ray_cluster, tmp_path):
    served = tmp_path / "site"
    served.mkdir()
    for i in range(10):
        (served / f"{i}.jpg").write_bytes(photo_jpeg(40 + i, 30, seed=i))
    (served / "page.jpg").write_bytes(b"<html>not an image</html>")
    http = ray_cluster.popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                              "--directory", str(served)])  # fmt: skip
    try:
        line = http.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (http://127.0.0.1:N/) ..."
        assert "port" in line, http.stderr.read() if http.poll() is not None else line
        base = line.split("(")[1].split(")")[0].rstrip("/")
        names = [f"{i}.jpg" for i in range(10)] + ["missing.jpg", "page.jpg"]
        source = tmp_path / "meta.parquet"
        rows = {"URL": [f"{base}/{name}" for name in names], "TEXT": [f"caption {name}" for name in names]}
        pq.write_table(pa.table(rows), str(source), row_group_size=4)

        local = ray_cluster.shardkit("write", str(source), str(tmp_path / "local"), "--workers", "2", *FLAGS)
        assert local.returncode == 0, local.stderr
        on_ray = ray_cluster.shardkit(
            "write", str(source), str(tmp_path / "ray"), "--engine", "ray", "--ray-address", ray_cluster.address,
            *FLAGS,
        )  # fmt: skip
        assert on_ray.returncode == 0, on_ray.stderr
    finally:
        http.terminate()
        http.wait(timeout=30)
    got, expected = tree_bytes(tmp_path / "ray"), tree_bytes(tmp_path / "local")
    assert sorted(got) == sorted(expected)
    assert got == expected
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    skipped = sorted((item["path"], item["reason"].split(":")[0]) for item in manifest["skipped"])
    assert skipped == [(f"{source}#row=10", "http_404"), (f"{source}#row=11", "not_image")]
    assert manifest["num_samples"] == 10 and len([name for name in got if name.endswith(".tar")]) == 4
