"""Mixing datasets through the real reader: shards on disk, loaders, checkpoints."""

from __future__ import annotations

import collections
import itertools
import json
import pickle

import pytest

from shardkit import ShardDataset, Stream, World, make_loader
from shardkit.errors import ManifestError, StateError, UsageError
from shardkit.read.resume import Level, ReaderState, merge_states
from tests.conftest import build_dataset, sample_payload

BIG = [9, 13, 0, 15]  # 37 samples, payload 100
SMALL = [3, 2]  # 5 samples, payload 60


@pytest.fixture
def two(tmp_path):
    a = str(tmp_path / "big")
    b = str(tmp_path / "small")
    build_dataset(a, BIG)
    build_dataset(b, SMALL, payload_bytes=60)
    return a, b


def _mix(two, **kwargs) -> ShardDataset:
    a, b = two
    weights = kwargs.pop("weights", (0.5, 0.5))
    streams = [Stream(a, weight=weights[0], name="big"), Stream(b, weight=weights[1], name="small")]
    kwargs.setdefault("seed", 3)
    kwargs.setdefault("buffer_size", 8)
    return ShardDataset(streams, **kwargs)


def _ids(samples) -> list[tuple[str, str]]:
    return [(s["__stream__"], s["__key__"]) for s in samples]


def _slots(world_size: int, num_workers: int) -> list[World]:
    return [World(rank=r, world_size=world_size, worker=w, num_workers=num_workers)
            for r in range(world_size) for w in range(num_workers)]


def test_each_stream_gives_its_exact_share_with_the_stored_bytes(two):
    ds = _mix(two, samples_per_epoch=60, mode="exact", decode=None)
    seen: collections.Counter = collections.Counter()
    for epoch in range(3):
        ds.set_epoch(epoch)
        samples = list(ds)
        assert collections.Counter(s["__stream__"] for s in samples) == {"big": 30, "small": 30}
        for s in samples:
            payload = 100 if s["__stream__"] == "big" else 60
            assert s["bin"] == sample_payload(s["__key__"], payload)
        seen.update(_ids(samples))
    # 90 samples of a 37-sample stream: each 2 or 3 times; 90 of 5: each 18 times.
    assert {n for (name, _), n in seen.items() if name == "big"} <= {2, 3}
    assert len([k for k in seen if k[0] == "big"]) == 37
    assert {n for (name, _), n in seen.items() if name == "small"} == {18}


def test_same_seed_same_sequence_and_a_new_order_each_epoch(two):
    first = _ids(_mix(two, mode="exact"))
    assert first == _ids(_mix(two, mode="exact"))
    other = _mix(two, mode="exact")
    other.set_epoch(1)
    assert _ids(other) != first
    assert _ids(_mix(two, mode="exact", seed=4)) != first


@pytest.mark.parametrize("mode,pad", [("exact", False), ("balanced", False), ("balanced", True)])
def test_slots_split_the_mixed_epoch_and_balanced_ranks_are_equal(two, mode, pad):
    ds = _mix(two, samples_per_epoch=50, mode=mode, pad=pad, weights=(0.7, 0.3))
    whole = collections.Counter(_ids(_mix(two, samples_per_epoch=50, mode="exact", weights=(0.7, 0.3))))
    per_rank = collections.Counter()
    got: collections.Counter = collections.Counter()
    for slot in _slots(3, 2):
        items = _ids(ds.iter_slot(slot, epoch=0))
        assert items, "no slot is left empty"
        assert {name for name, _ in items} == {"big", "small"}
        per_rank[slot.rank] += len(items)
        got.update(items)
    if mode == "exact":
        assert got == whole
    elif not pad:
        assert len(set(per_rank.values())) == 1
        assert not got - whole and sum(whole.values()) - sum(got.values()) < 3 * 2  # < world_size per stream
    else:
        assert len(set(per_rank.values())) == 1 and set(got) == set(whole)


def test_loader_batches_hold_each_stream_in_proportion(two):
    ds = _mix(two, samples_per_epoch=512, mode="exact", weights=(0.7, 0.3))
    loader = make_loader(ds, batch_size=64, num_workers=2)
    counts = collections.Counter()
    for batch in loader:
        streams = batch["__stream__"]
        n = len(streams)
        small = sum(1 for s in streams if s == "small")
        counts["small"] += small
        counts["all"] += n
        if n == 64:
            assert abs(small - 64 * 0.3) <= 1.5, streams  # the schedule's bound, plus the slot's rounding
    assert counts == {"small": round(512 * 0.3), "all": 512}


def test_default_names_are_indexes_and_collate_to_a_tensor(two):
    a, b = two
    ds = ShardDataset([Stream(a, weight=2), Stream(b, weight=1)], mode="exact", seed=0)
    batch = next(iter(make_loader(ds, batch_size=6, num_workers=0)))
    assert batch["__stream__"].tolist() == [0, 1, 0, 0, 1, 0]  # shares 28 and 14, stratified
    assert len(ds) == 42  # samples_per_epoch defaults to the streams' sizes


@pytest.mark.parametrize("mode", ["exact", "balanced", "infinite"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_checkpoint_resumes_the_identical_sequence(two, mode, num_workers):
    def loader():
        ds = _mix(two, samples_per_epoch=40, mode=mode, epoch=1)
        return make_loader(ds, batch_size=3, num_workers=num_workers, in_order=True)

    def run(it, n):
        return [k for b in itertools.islice(it, n) for k in zip(b["__stream__"], b["__key__"])]

    full = run(iter(loader()), 12)
    first = loader()
    it = iter(first)
    head = run(it, 5)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["mixture"]["streams"][1]["name"] == "small"
    del it, first
    again = loader()
    again.load_state_dict(state)
    assert head + run(iter(again), 7) == full


@pytest.mark.parametrize("mode", ["exact", "balanced"])
@pytest.mark.parametrize("old,new", [((3, 2), (2, 1)), ((1, 2), (3, 1))])
def test_another_topology_delivers_every_remaining_drawn_sample_once(two, mode, old, new):
    ds = _mix(two, samples_per_epoch=80, mode=mode, weights=(0.4, 0.6))
    epoch = 2
    head: list = []
    rows = []
    for rank in range(old[0]):
        row = []
        for worker in range(old[1]):
            world = World(rank=rank, world_size=old[0], worker=worker, num_workers=old[1])
            take = (rank * 5 + worker * 3) % 9 + 2
            head += _ids(itertools.islice(ds.iter_slot(world, epoch=epoch), take))
            row.append(take)
        rows.append(tuple(row))
    level = Level(old[0], old[1], tuple(rows))
    state = ds.state_dict()
    state = ReaderState.from_dict(state)
    full = ReaderState(state.fingerprint, state.options, epoch, (level,), mixture=state.mixture).to_dict()
    tail: list = []
    per_rank = collections.Counter()
    for slot in _slots(*new):
        got = _ids(ds.iter_slot(slot, epoch=epoch, state=full))
        per_rank[slot.rank] += len(got)
        tail += got
    drawn = collections.Counter(_ids(_mix(two, samples_per_epoch=80, mode="exact", weights=(0.4, 0.6), epoch=epoch)))
    seen = collections.Counter(head + tail)
    if mode == "exact":
        assert seen == drawn
    else:
        assert not seen - drawn
        assert sum(drawn.values()) - sum(seen.values()) < 2 * (old[0] + new[0])  # per stream and level
        assert len(set(per_rank.values())) == 1


def test_a_weight_schedule_steps_and_resumes_across_the_epoch_boundary(two):
    a, b = two

    def make():
        streams = [Stream(a, weight={0: 1.0, 2: 3.0}), Stream(b, weight=1.0)]
        return ShardDataset(streams, samples_per_epoch=40, mode="infinite", seed=1, buffer_size=6, epoch=1)

    stream = _ids(itertools.islice(make(), 80))  # epoch 1 (1:1), then epoch 2 (3:1)
    assert collections.Counter(n for n, _ in stream[:40]) == {0: 20, 1: 20}
    assert collections.Counter(n for n, _ in stream[40:]) == {0: 30, 1: 10}
    ds = make()
    it = iter(ds)
    head = _ids(itertools.islice(it, 55))
    state = json.loads(json.dumps(ds.state_dict()))
    again = make()
    again.load_state_dict(state)
    assert head + _ids(itertools.islice(iter(again), 25)) == stream


def test_a_changed_mixture_finishes_the_epoch_as_recorded_then_switches(two, tmp_path):
    a, b = two
    c = str(tmp_path / "third")
    build_dataset(c, [4, 4], payload_bytes=70)
    old = ShardDataset([Stream(a, weight=0.5), Stream(b, weight=0.5)], samples_per_epoch=40, mode="exact", seed=2)
    full = _ids(old)
    old = ShardDataset([Stream(a, weight=0.5), Stream(b, weight=0.5)], samples_per_epoch=40, mode="exact", seed=2)
    it = iter(old)
    head = _ids(itertools.islice(it, 15))
    state = json.loads(json.dumps(old.state_dict()))
    new = ShardDataset(
        [Stream(a, weight=0.2), Stream(b, weight=0.2), Stream(c, weight=0.6)], samples_per_epoch=50, mode="exact", seed=2
    )
    new.load_state_dict(state)
    assert head + _ids(new) == full  # the rest of epoch 0 as recorded
    assert new.state_dict()["mixture"] == state["mixture"]
    new.set_epoch(1)
    assert collections.Counter(n for n, _ in _ids(new)) == {0: 10, 1: 10, 2: 30}
    # A recorded stream that is gone is refused by name.
    named = ShardDataset([Stream(a, weight=1.0, name="web"), Stream(b, weight=1.0, name="curated")], mode="exact")
    list(itertools.islice(iter(named), 3))
    saved = named.state_dict()
    without = ShardDataset([Stream(a, weight=1.0, name="web")], mode="exact")
    with pytest.raises(StateError, match="stream 'curated'.*not among this dataset's streams"):
        without.load_state_dict(saved)


def test_mixture_and_single_dataset_states_do_not_mix(two):
    a, _ = two
    single = ShardDataset(a, mode="exact")
    mixed = _mix(two, mode="exact")
    with pytest.raises(StateError, match="state is of one dataset"):
        mixed.load_state_dict(single.state_dict())
    with pytest.raises(StateError, match="state is of a mixture"):
        single.load_state_dict(mixed.state_dict())


def test_merge_states_of_a_mixture_keeps_the_mixture(two):
    ds = _mix(two, mode="exact")
    states = []
    for rank in range(2):
        world = World(rank=rank, world_size=2)
        part = _mix(two, mode="exact", rank=rank, world_size=2)
        list(itertools.islice(iter(part), 3 + rank))
        states.append(part.state_dict())
        assert part.world == world
    merged = merge_states(states)
    assert merged["mixture"] == ds.state_dict()["mixture"]
    assert merged["levels"][-1]["delivered"] == [[3], [4]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_a_mixture(two, num_workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def new():
        return stateful.StatefulDataLoader(_mix(two, mode="exact", samples_per_epoch=30), batch_size=2,
                                           num_workers=num_workers)

    def keys(batches):
        return [k for b in batches for k in zip(b["__stream__"], b["__key__"])]

    full = keys(new())
    loader = new()
    it = iter(loader)
    head = keys(next(it) for _ in range(4))
    state = json.loads(json.dumps(loader.state_dict(), default=list))
    del it, loader
    again = new()
    again.load_state_dict(state)
    assert head + keys(again) == full


def test_a_mixture_pickles_and_spawned_workers_read_it(two):
    ds = _mix(two, mode="exact", samples_per_epoch=24, decode="pil")
    clone = pickle.loads(pickle.dumps(ds))
    assert _ids(clone) == _ids(ds)
    loader = make_loader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(_ids(loader)) == sorted(_ids(ds))


def test_decode_map_and_worker_batches_work_on_a_mixture(two):
    ds = _mix(two, mode="exact", samples_per_epoch=20, decode="tensor",
              map=lambda s: {"stream": s["__stream__"], "cls": s["cls"]}, batch_size=4)
    batches = list(ds)
    assert [len(b["cls"]) for b in batches] == [4] * 5
    assert collections.Counter(n for b in batches for n in b["stream"]) == {"big": 10, "small": 10}


def test_len_and_num_samples_follow_the_epoch(two):
    a, b = two
    ds = ShardDataset([Stream(a, weight={0: 1.0, 1: 3.0}), Stream(b, samples=10)], samples_per_epoch=30,
                      mode="balanced", world_size=4, rank=1)
    assert len(ds) == (10 // 4) + (20 // 4)
    ds.set_epoch(1)
    assert len(ds) == (10 // 4) + (20 // 4)
    assert ds.mixture is not None and ds.mixture.samples_per_epoch(1) == 30


# ------------------------------------------------------------- bad input


def test_bad_mixtures_are_refused_naming_the_stream(two, tmp_path):
    a, b = two
    with pytest.raises(UsageError, match="reads the same dataset as"):
        ShardDataset([Stream(a, weight=1.0), Stream(a, weight=2.0)])
    with pytest.raises(UsageError, match="'nomanifest'.*no manifest"):
        build_dataset(str(tmp_path / "loose"), [3], with_manifest=False)
        for idx in (tmp_path / "loose").glob("*.idx"):
            idx.unlink()  # shards alone: no counts
        loose = [str(tmp_path / "loose" / "shard-000000.tar")]
        ShardDataset([Stream(a, weight=1.0, name="a"), Stream(loose, weight=1.0, name="nomanifest")])
    with pytest.raises(UsageError, match="'empty' has no samples"):
        build_dataset(str(tmp_path / "empty"), [0])
        ShardDataset([Stream(a, weight=1.0, name="a"), Stream(str(tmp_path / "empty"), weight=1.0, name="empty")])
    with pytest.raises(ManifestError):
        ShardDataset([Stream(a, weight=1.0), Stream(str(tmp_path / "missing"), weight=1.0)])
    with pytest.raises(UsageError, match="name every stream or none"):
        ShardDataset([Stream(a, weight=1.0, name="x"), Stream(b, weight=1.0)])
    with pytest.raises(UsageError, match="two streams are named 'x'"):
        ShardDataset([Stream(a, weight=1.0, name="x"), Stream(b, weight=1.0, name="x")])
    with pytest.raises(UsageError, match="not both"):
        ShardDataset([Stream(a, weight=1.0), b])
    with pytest.raises(UsageError, match="samples_per_epoch applies to a mixture"):
        ShardDataset(a, samples_per_epoch=10)
    with pytest.raises(UsageError, match="samples_per_epoch must be an int > 0"):
        ShardDataset([Stream(a, weight=1.0), Stream(b, weight=1.0)], samples_per_epoch=0)
    with pytest.raises(UsageError, match="interleave applies to one dataset"):
        ShardDataset([Stream(a, weight=1.0), Stream(b, weight=1.0)], interleave=2)
    with pytest.raises(UsageError, match="mixture has a catalog per stream"):
        _ = _mix(two).catalog
    tiny = _mix(two, mode="infinite", samples_per_epoch=3)
    with pytest.raises(UsageError, match="at least one sample per slot"):
        list(tiny.iter_slot(World(rank=0, world_size=2, worker=0, num_workers=2), epoch=0))
