"""The warm-up: the main process reads the first worker's first bytes while
the workers start, and on a disk that takes turns hands its turn to that
worker."""

from __future__ import annotations

import fcntl
import os
import time

import numpy as np
import pytest

from shardkit import ShardDataset, make_loader
from shardkit.format.index import load_index
from shardkit.format.tar import END_OF_ARCHIVE
from shardkit.read.device import lock_for
from shardkit.read.sources import SourceOptions
from shardkit.world import World
from tests.conftest import sample_payload
from tests.read.locks import held_elsewhere


END_OF_ARCHIVE_BYTES = len(END_OF_ARCHIVE)


def _keys(sizes: list[int]) -> list[str]:
    return sorted(f"s{i:03d}_{j:05d}" for i, n in enumerate(sizes) for j in range(n))


def _evict(path: str) -> None:
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _cached(path: str, start: int, num_bytes: int) -> bool | None:
    """Whether bytes ``[start, start + num_bytes)`` are in the page cache,
    or None where the file system cannot say without reading them."""
    buffer = bytearray(num_bytes)
    with open(path, "rb") as f:
        try:
            return os.preadv(f.fileno(), [buffer], start, os.RWF_NOWAIT) == num_bytes
        except BlockingIOError:
            return False
        except OSError:  # EOPNOTSUPP: no non-blocking reads on this file system
            return None


def test_a_warm_up_reads_the_bytes_the_first_worker_reads_first(make_shards):
    sizes = [9, 7, 8]
    manifest = make_shards(sizes, payload_bytes=2000)
    ds = ShardDataset(manifest, mode="exact", seed=5, source_options=SourceOptions(device_lock=False))
    world = World(worker=0, num_workers=2)
    first = next(ds.pieces(world, epoch=0))
    path = manifest.resolve(manifest.shards[first.shard].path)
    _evict(path)
    warm_up = ds.warm_up(world)
    assert warm_up is not None and warm_up.piece == first
    with warm_up:
        assert warm_up.join(timeout_s=10)
    entry = manifest.shards[first.shard]
    if first.start == 0 and first.stop == entry.num_samples:
        start, stop = 0, entry.num_bytes  # a whole shard, end marker included
    else:
        bounds = load_index(manifest.resolve(entry.index))
        start = int(bounds[first.start])
        stop = int(bounds[first.stop]) + (END_OF_ARCHIVE_BYTES if first.stop == entry.num_samples else 0)
    assert warm_up.num_bytes == stop - start
    assert _cached(path, start, stop - start) in (True, None)


def test_a_slot_starting_inside_a_shard_is_warmed_up_from_its_first_sample(make_shards):
    manifest = make_shards([7, 9], payload_bytes=3000)
    ds = ShardDataset(manifest, mode="exact", shuffle=False, rank=1, world_size=2)
    world = World(rank=1, world_size=2, worker=0, num_workers=3)
    first = next(ds.pieces(world, epoch=0))
    assert first.start > 0, "the test wants a slot that starts inside a shard"
    bounds = load_index(manifest.resolve(manifest.shards[first.shard].index))
    with ds.warm_up(world) as warm_up:
        warm_up.join(timeout_s=10)
    assert warm_up.num_bytes == int(bounds[first.stop] - bounds[first.start])


def test_a_warm_up_reads_at_most_one_turn_on_a_disk_and_one_read_ahead_budget_elsewhere(make_shards):
    manifest = make_shards([40], payload_bytes=5000)
    shard_bytes = manifest.shards[0].num_bytes
    turns = ShardDataset(manifest, mode="exact", source_options=SourceOptions(device_lock=True, device_lease_bytes=60_000))
    with turns.warm_up(World()) as warm_up:
        warm_up.join(timeout_s=10)
    assert warm_up.num_bytes == 60_000 < shard_bytes
    free = ShardDataset(manifest, mode="exact", read_ahead_bytes=50_000, source_options=SourceOptions(device_lock=False))
    with free.warm_up(World()) as warm_up:
        warm_up.join(timeout_s=10)
    assert warm_up.num_bytes == 50_000


def test_a_warm_up_gives_its_turn_back_when_it_stops(make_shards):
    manifest = make_shards([20], payload_bytes=5000)
    ds = ShardDataset(manifest, mode="exact", source_options=SourceOptions(device_lock=True))
    lock = lock_for(manifest.resolve(manifest.shards[0].path), mode=True)
    assert lock is not None
    warm_up = ds.warm_up(World()).start()
    warm_up.stop()
    assert warm_up.join(timeout_s=10)
    assert warm_up.num_bytes > 0 and not held_elsewhere(lock)


def test_a_warm_up_waiting_for_a_busy_disk_stops_without_reading(make_shards):
    manifest = make_shards([20], payload_bytes=5000)
    ds = ShardDataset(manifest, mode="exact", source_options=SourceOptions(device_lock=True))
    lock = lock_for(manifest.resolve(manifest.shards[0].path), mode=True)
    assert lock is not None
    squatter = os.open(lock.path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(squatter, fcntl.LOCK_EX)  # e.g. another rank's worker mid-lease
    try:
        warm_up = ds.warm_up(World()).start()
        assert not warm_up.offer_turn(), "offered a turn it does not hold"
        time.sleep(0.1)
        warm_up.stop()
        assert warm_up.join(timeout_s=5), "a stopped warm-up kept waiting for the disk"
        assert warm_up.num_bytes == 0
    finally:
        os.close(squatter)
    deadline = time.monotonic() + 5
    while held_elsewhere(lock):
        assert time.monotonic() < deadline, "the stopped warm-up took the lock and kept it"
        time.sleep(0.01)


def test_a_warm_up_of_a_missing_shard_ends_quietly_and_the_reader_reports_it(make_shards):
    manifest = make_shards([5, 5])
    ds = ShardDataset(manifest, mode="exact", shuffle=False)
    os.unlink(manifest.resolve(manifest.shards[0].path))
    with ds.warm_up(World()) as warm_up:
        warm_up.join(timeout_s=10)
    assert warm_up.num_bytes == 0
    with pytest.raises(OSError, match="shard-000000.tar"):
        list(ds)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_loader_on_a_disk_that_takes_turns_warms_up_hands_over_and_leaves_the_lock_free(make_shards, persistent):
    sizes = [30, 0, 25, 33, 17]
    manifest = make_shards(sizes, payload_bytes=3000)
    options = SourceOptions(device_lock=True, device_lease_bytes=40_000, chunk_bytes=8192)
    ds = ShardDataset(manifest, mode="exact", seed=2, source_options=options)
    loader = make_loader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
    lock = lock_for(manifest.resolve(manifest.shards[0].path), mode=True, lease_bytes=40_000)
    assert lock is not None
    warmed = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        keys = []
        for sample in loader:
            assert sample["bin"] == sample_payload(sample["__key__"], 3000)
            keys.append(sample["__key__"])
        assert sorted(keys) == _keys(sizes)
        warmed.append(loader._last_warm_up is not None and loader._last_warm_up.num_bytes > 0)
        loader._last_warm_up = None
    # Persistent workers start once, so only the first epoch warms up.
    assert warmed == [True, not persistent]
    del loader
    deadline = time.monotonic() + 10
    while held_elsewhere(lock):
        assert time.monotonic() < deadline, "the device lock is still held after the loader is gone"
        time.sleep(0.01)


def test_spawned_workers_on_a_disk_that_takes_turns_read_everything_once(make_shards):
    sizes = [12, 9, 14]
    manifest = make_shards(sizes, payload_bytes=2000)
    options = SourceOptions(device_lock=True, device_lease_bytes=20_000)
    ds = ShardDataset(manifest, mode="exact", seed=1, source_options=options)
    loader = make_loader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(s["__key__"] for s in loader) == _keys(sizes)
    lock = lock_for(manifest.resolve(manifest.shards[0].path), mode=True, lease_bytes=20_000)
    assert lock is not None and not held_elsewhere(lock)


def test_a_resumed_iteration_does_not_warm_up(make_shards):
    manifest = make_shards([6, 6, 6])
    ds = ShardDataset(manifest, mode="exact", seed=0, buffer_size=3)
    loader = make_loader(ds, batch_size=None, num_workers=2, persistent_workers=False)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    resumed = make_loader(ShardDataset(manifest, mode="exact", seed=0, buffer_size=3), batch_size=None, num_workers=2)
    resumed.load_state_dict(state)
    rest = [s["__key__"] for s in resumed]
    assert len(rest) == 18 - 5
    assert resumed._last_warm_up is None
    assert np.unique(rest).size == len(rest)
