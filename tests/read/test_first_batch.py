"""A worker's first sample comes before its shuffle buffer is full (the
growing buffer), and exact resume holds during and after the growth."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import pytest

import shardkit.read.slot as slot_module
from shardkit import ShardDataset, make_loader
from shardkit.read.resume.state import Level, ReaderState, dataset_fingerprint
from shardkit.read.shuffle import INITIAL_FILL
from shardkit.world import World
from tests.read.resume_model import read_slots

SIZES = [300, 250, 350, 200, 300]  # 1,400 samples
BUFFER = 400  # grows from INITIAL_FILL over the first 2 * (400 - 100) = 600 samples


@pytest.fixture
def counted_reads(monkeypatch) -> Counter[str]:
    """Counts the samples the slot streams take from their read streams
    (what reaches the shuffle buffer), by wrapping PieceReader.read."""
    taken: Counter[str] = Counter()
    original = slot_module.PieceReader.read

    def read(self, pieces) -> Iterator:
        for located in original(self, pieces):
            taken["samples"] += 1
            yield located

    monkeypatch.setattr(slot_module.PieceReader, "read", read)
    return taken


def _keys(samples) -> list[str]:
    return [s["__key__"] for s in samples]


def test_first_sample_comes_after_reading_the_initial_fill_not_the_buffer(make_shards, counted_reads):
    ds = ShardDataset(make_shards(SIZES), mode="exact", seed=3, buffer_size=1000)
    stream = iter(ds)
    next(stream)
    assert counted_reads["samples"] == INITIAL_FILL
    for _ in range(99):
        next(stream)
    assert counted_reads["samples"] == INITIAL_FILL + 2 * 99  # two read per sample out while growing


def test_growing_buffer_same_seed_same_order_and_each_sample_once(make_shards):
    manifest = make_shards(SIZES)
    first = _keys(ShardDataset(manifest, mode="exact", seed=3, buffer_size=BUFFER))
    assert first == _keys(ShardDataset(manifest, mode="exact", seed=3, buffer_size=BUFFER))
    assert first != _keys(ShardDataset(manifest, mode="exact", seed=4, buffer_size=BUFFER))
    assert sorted(first) == sorted(f"s{s:03d}_{i:05d}" for s, n in enumerate(SIZES) for i in range(n))


@pytest.mark.parametrize("cut", [1, 150, 599, 600, 601, 1000, 1399])
@pytest.mark.parametrize("buffer_bytes", [None, 600_000])  # the byte cap binds at ~200 samples
def test_resume_during_and_after_the_growth_gives_the_same_sequence(make_shards, cut, buffer_bytes):
    manifest = make_shards(SIZES, payload_bytes=100)
    options = dict(mode="exact", seed=3, buffer_size=BUFFER, buffer_bytes=buffer_bytes)
    whole = _keys(ShardDataset(manifest, **options))
    ds = ShardDataset(manifest, **options)
    head = _keys(itertools.islice(iter(ds), cut))
    resumed = ShardDataset(manifest, **options)
    resumed.load_state_dict(ds.state_dict())
    assert head + _keys(resumed) == whole


@pytest.mark.parametrize("interleave", [1, 2])
def test_changed_topology_during_the_growth_delivers_each_sample_once(make_shards, interleave):
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", seed=3, buffer_size=BUFFER, interleave=interleave)
    old = (2, 1)
    stops = {(0, 0): 130, (1, 0): 420}  # one slot growing, one past it
    before = read_slots(ds, old, epoch=0, state=None, takes=stops)
    level = Level(world_size=2, num_workers=1, delivered=((130,), (420,)), next_worker=(0, 0))
    state = ReaderState(dataset_fingerprint(ds.catalog), ds.options, 0, (level,)).to_dict()
    new = (1, 3)
    after = read_slots(ds, new, epoch=0, state=state, takes={(0, w): None for w in range(3)})
    delivered = Counter(k for keys in [*before.values(), *after.values()] for k in keys)
    assert delivered == Counter(f"s{s:03d}_{i:05d}" for s, n in enumerate(SIZES) for i in range(n))
    # The same state read again gives the same sequences.
    assert read_slots(ds, new, epoch=0, state=state, takes={(0, w): None for w in range(3)}) == after


def test_world_slots_each_start_early(make_shards, counted_reads):
    ds = ShardDataset(make_shards(SIZES), mode="exact", seed=3, buffer_size=1000)
    for worker in range(2):
        counted_reads.clear()
        next(ds.iter_slot(World(worker=worker, num_workers=2), epoch=0))
        assert counted_reads["samples"] == INITIAL_FILL


def test_loader_workers_resume_within_the_growth(make_shards):
    manifest = make_shards(SIZES)

    def loader():
        ds = ShardDataset(manifest, mode="exact", seed=3, buffer_size=BUFFER)
        return make_loader(ds, batch_size=10, num_workers=2, in_order=True, persistent_workers=False)

    whole = [key for batch in loader() for key in batch["__key__"]]
    first = loader()
    it = iter(first)
    head = [key for batch in itertools.islice(it, 25) for key in batch["__key__"]]  # 125 per worker: growing
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [key for batch in resumed for key in batch["__key__"]] == whole
