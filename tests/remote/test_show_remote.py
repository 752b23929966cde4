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


def test_a_remote_sample_over_the_read_cap_is_named_not_fetched(tmp_path, serve_dataset, http_server):
    import shardkit
    from shardkit.preview.build import ShowOptions
    from tests.preview.pages import parse

    with shardkit.ShardWriter(str(tmp_path / "ds")) as writer:
        writer.write({"__key__": "big", "bin": bytes(20_000)})
        writer.write({"__key__": "small", "txt": "small"})
    url = serve_dataset(shardkit.load_manifest(str(tmp_path / "ds")))
    page = shardkit.show(url, options=ShowOptions(samples=2, max_sample_bytes=8192))
    failed = parse(page).all("article", "failed")
    assert len(failed) == 1 and "over the limit of 8,192 bytes (max_sample_bytes=8192)" in page
    ranges = [rng for method, path, rng in http_server.requests if method == "GET" and path.endswith(".tar")]
    spans = [tuple(int(n) for n in r.removeprefix("bytes=").split("-")) for r in ranges]
    # One ranged read, of the small sample: the big one was refused by its offset-index entry, never fetched.
    assert len(spans) == 1 and spans[0][1] - spans[0][0] + 1 < 2048, ranges
