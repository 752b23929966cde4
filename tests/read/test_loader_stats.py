"""Loader statistics (issue #56): ``make_loader(..., stats=True)`` times each
worker's stages, the hand-off and the loop's waits, names the worker and
shard behind a stall, and exports a trace; off, nothing is timed."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from torch.utils.data import DataLoader

import shardkit
from shardkit import ShardDataset, Stream, TokenBlocks, make_loader
from shardkit.errors import UsageError
from shardkit.read import stats as stage_stats
from shardkit.read.stats import STAGES
from tests.read.token_data import write_documents

SIZES = [6, 6, 6, 6]


def _sleepy(sample):  # a map that costs CPU time of its own (picklable for spawned workers)
    time.sleep(0.003)
    return sample


def _slow_on_shard_2(sample):  # one worker made slow on one shard: shard 2's samples
    if sample["__key__"].startswith("s002_"):
        time.sleep(0.05)
    return sample


def test_stats_count_every_sample_and_byte_read_and_time_each_stage(make_shards):
    manifest = make_shards(SIZES, payload_bytes=4000)
    ds = ShardDataset(manifest, mode="exact", seed=1, decode="tensor", map=_sleepy)
    loader = make_loader(ds, batch_size=4, num_workers=2, stats=True, collate_fn=list)
    keys = [s["__key__"] for batch in loader for s in batch]
    stats = loader.stats()
    assert len(keys) == stats.samples == sum(SIZES)
    assert stats.batches == len(loader)
    shard_bytes = sum(os.path.getsize(os.path.join(manifest.location, s.path)) for s in manifest.shards)
    assert stats.nbytes == shard_bytes  # every byte that arrived from storage, once
    totals = stats.stage_totals()
    assert set(totals) == {*STAGES, "handoff"}
    assert totals["map"] >= 0.003 * sum(SIZES) * 0.9  # the map's own sleeps
    assert totals["map"] > totals["decode"] and totals["parse"] > 0
    assert set(stats.workers) == {0, 1} and all(w.pid not in (0, os.getpid()) for w in stats.workers.values())
    assert 0 < stats.starved <= 1 and stats.waited_s <= stats.elapsed_s
    report = stats.summary()
    assert f"{stats.batches} batches, {sum(SIZES)} samples" in report and "map" in report
    assert json.loads(json.dumps(stats.to_dict()))["samples"] == sum(SIZES)


def test_a_worker_slow_on_one_shard_shows_as_stalls_naming_it(make_shards):
    manifest = make_shards(SIZES, payload_bytes=100)
    ds = ShardDataset(manifest, mode="exact", seed=2, shuffle=False, map=_slow_on_shard_2)
    loader = make_loader(ds, batch_size=2, num_workers=2, stats=True, in_order=True, collate_fn=list)
    for _ in loader:
        time.sleep(0.002)  # a training step
    stats = loader.stats()
    assert stats.stall_count >= 1
    slow = stats.stalls[0]
    assert slow.shard.endswith(manifest.shards[2].path), slow
    assert slow.waited_s >= 0.05 and slow.behind != slow.worker
    assert f"for worker {slow.worker} on shard " in stats.summary()


def test_the_trace_loads_as_json_with_batches_stages_waits_and_stalls(make_shards, tmp_path):
    manifest = make_shards(SIZES, payload_bytes=100)
    ds = ShardDataset(manifest, mode="exact", shuffle=False, map=_slow_on_shard_2)
    loader = make_loader(ds, batch_size=2, num_workers=2, stats=True, in_order=True, collate_fn=list)
    batches = list(loader)
    path = str(tmp_path / "trace.json")
    loader.stats().save_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = [e["name"] for e in events]
    assert sum(n.startswith("batch ") for n in names) == len(batches)
    assert sum(n.startswith("wait for batch ") for n in names) == len(batches)
    assert {"parse", "map", "collate"} <= set(names) and "stall" in names
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert lanes == {"training loop", "worker 0", "worker 1"}
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] > 0


def test_stats_work_in_process_with_token_blocks_and_resume(tmp_path):
    data = str(tmp_path / "docs")
    write_documents(data, 40, per_shard=8)
    ds = ShardDataset(data, tokens=TokenBlocks("tokens.npy", 32), seed=3, mode="exact")
    loader = make_loader(ds, batch_size=4, num_workers=0, stats=True)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    again = make_loader(ShardDataset(data, tokens=TokenBlocks("tokens.npy", 32), seed=3, mode="exact"), batch_size=4,
                        num_workers=0, stats=True)  # fmt: skip
    again.load_state_dict(state)
    rest = list(again)
    assert len(first) + len(rest) == len(loader)
    assert loader.stats().batches == 3 and again.stats().batches == len(rest)
    assert again.stats().workers[0].pid == os.getpid()
    named = {u for e in again.stats().trace()["traceEvents"] if e["name"].startswith("batch ") for u in e["args"]["shards"]}
    assert named and all(u.endswith(".tar") for u in named)  # the stored shards read, not the blocks' virtual ones
    assert stage_stats.current is None  # the in-process clock is let go when the iteration ends


def test_stats_over_a_mixture(make_shards):
    a, b = make_shards([4, 4], name="a"), make_shards([3], name="b")
    ds = ShardDataset([Stream(a, weight=2), Stream(b, weight=1)], mode="exact", seed=0)
    loader = make_loader(ds, batch_size=3, num_workers=2, stats=True, collate_fn=list)
    assert sum(len(batch) for batch in loader) == loader.stats().samples == 11


def test_stats_off_times_nothing_and_says_so(make_shards, monkeypatch):
    calls = []
    real = stage_stats.StageClock.add
    monkeypatch.setattr(stage_stats.StageClock, "add", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, decode="tensor", map=lambda s: s)
    loader = make_loader(ds, batch_size=4, num_workers=0)
    seen = []
    for batch in loader:
        seen.append(stage_stats.current)
    assert seen and all(c is None for c in seen) and calls == []
    with pytest.raises(UsageError, match=r"make_loader\(\.\.\., stats=True\)"):
        loader.stats()
    timed = make_loader(ShardDataset(manifest, decode="tensor", map=lambda s: s), batch_size=4, num_workers=0, stats=True)
    list(timed)
    assert calls  # the same patch sees the clock when statistics are on


def test_watch_gives_a_plain_dataloader_over_an_indexed_dataset_the_same_statistics(make_shards):
    manifest = make_shards(SIZES, payload_bytes=4000)
    indexed = shardkit.IndexedDataset(manifest, decode="tensor", map=_sleepy)
    plain = DataLoader(indexed, batch_size=4, shuffle=True, num_workers=2, collate_fn=list,
                       generator=torch.Generator().manual_seed(0))  # fmt: skip
    loader = shardkit.watch(plain)
    keys = [s["__key__"] for batch in loader for s in batch]
    assert sorted(keys) == sorted(f"s{i:03d}_{j:05d}" for i, n in enumerate(SIZES) for j in range(n))
    stats = loader.stats()
    assert stats.batches == len(loader) == len(plain) and stats.samples == sum(SIZES)
    assert stats.nbytes >= sum(SIZES) * 4000  # each sample's stored bytes, read once
    totals = stats.stage_totals()
    assert totals["read"] > 0 and totals["decode"] > 0 and totals["map"] >= 0.003 * sum(SIZES) * 0.9
    assert set(stats.workers) == {0, 1}
    in_process = shardkit.watch(DataLoader(indexed, batch_size=5, num_workers=0, collate_fn=list))
    assert sum(len(b) for b in in_process) == sum(SIZES) == in_process.stats().samples
    assert stage_stats.current is None and "_read" not in vars(indexed)  # the dataset given stays untimed
    with pytest.raises(UsageError, match=r"make_loader\(\.\.\., stats=True\)"):
        shardkit.watch(make_loader(ShardDataset(manifest), batch_size=4, num_workers=0))
