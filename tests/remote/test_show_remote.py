"""`shardkit show` of a dataset served over HTTP on 127.0.0.1: samples read by range."""

from __future__ import annotations

from shardkit.cli import main
from tests.preview.datasets import image_dataset
from tests.preview.pages import assert_self_contained


def test_show_over_http_reads_samples_by_range(tmp_path, serve_dataset, http_server, capsys):
    import shardkit

    manifest = shardkit.load_manifest(image_dataset(str(tmp_path / "ds"), num_samples=6, max_samples=2))
    url = serve_dataset(manifest)
    out = tmp_path / "page.html"
    assert main(["show", url, "--out", str(out), "--samples", "4"]) == 0, capsys.readouterr().err
    page = out.read_text()
    parsed = assert_self_contained(page)
    assert len(parsed.all("article", "card")) == 4 and len(parsed.all("img")) == 4
    assert f"shardkit show: {url}" in page
    # Samples came by ranged reads: no shard was fetched whole.
    shard_gets = [(path, rng) for method, path, rng in http_server.requests if method == "GET" and path.endswith(".tar")]
    assert shard_gets and all(rng is not None and rng.startswith("bytes=") for _, rng in shard_gets), shard_gets
