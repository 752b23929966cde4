"""A mixture with a stream served over HTTP (a real server on 127.0.0.1)."""

from __future__ import annotations

import collections

from shardkit import ShardDataset, SourceOptions, Stream, make_loader
from tests.conftest import build_dataset, sample_payload


def test_a_mixture_reads_a_remote_stream_through_the_cache(tmp_path, serve_dataset):
    local = str(tmp_path / "local")
    build_dataset(local, [6, 7])
    remote = build_dataset(str(tmp_path / "remote"), [4, 5], payload_bytes=80)
    url = serve_dataset(remote) + "/"
    cache = SourceOptions(cache_dir=str(tmp_path / "cache"))
    streams = [Stream(local, weight=1.0, name="local"), Stream(url, weight=1.0, name="web", source_options=cache)]
    ds = ShardDataset(streams, samples_per_epoch=40, mode="exact", seed=1)
    for epoch in range(2):
        ds.set_epoch(epoch)
        samples = [s for b in make_loader(ds, batch_size=4, num_workers=2) for s in _unbatch(b)]
        assert collections.Counter(name for name, _, _ in samples) == {"local": 20, "web": 20}
        for name, key, payload in samples:
            assert payload == sample_payload(key, 100 if name == "local" else 80)
    assert any((tmp_path / "cache").rglob("*"))


def _unbatch(batch):
    return zip(batch["__stream__"], batch["__key__"], batch["bin"])
