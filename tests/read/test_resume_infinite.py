"""``mode="infinite"`` resumed under another topology, checked against the
plain-list model of :mod:`tests.read.resume_model`: per epoch that was in
flight, what the old slots delivered and what the new ones deliver cover the
epoch exactly once, and whole epochs follow."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from shardkit import ShardDataset, World
from shardkit.read.resume import Level, ReaderState, merge_states
from shardkit.read.resume.state import dataset_fingerprint
from shardkit.read.split import plan_epoch, slot_span
from tests.read.resume_model import Model, ModelPlan, Slot, per_epoch, read_slots

SIZES = [9, 0, 13, 5, 11]  # 38 samples
ALL_KEYS = Counter(f"s{shard:03d}_{i:05d}" for shard, n in enumerate(SIZES) for i in range(n))
EPOCH = 2
SEED = 5
#: Samples each new slot reads past its share of the epochs in flight and of
#: the next one, so that its shuffle buffer has let out all of those.
DRAIN = 60

OPTIONS = {
    "no buffer": dict(buffer_size=1, interleave=1),
    "buffer": dict(buffer_size=5, interleave=1),
    "buffer, interleave": dict(buffer_size=4, interleave=2),
}


def _slots(topology: tuple[int, int]) -> list[World]:
    world_size, num_workers = topology
    return [
        World(rank=r, world_size=world_size, worker=w, num_workers=num_workers)
        for r in range(world_size)
        for w in range(num_workers)
    ]


def _stops(pattern: str, topology: tuple[int, int]) -> dict[Slot, int]:
    """Delivered counts per old slot: ``uneven`` leaves slots in different
    epochs, mid-shard; ``shard_end`` stops each where its first shard of the
    first or the second epoch ends; ``boundary`` stops each at the end of
    one of its epoch shares (0, 1 or 2 of them); ``epoch_end`` stops all at
    the end of the first epoch; ``start`` before anything."""
    total = sum(SIZES)
    out = {}
    for i, world in enumerate(_slots(topology)):
        lo, hi = slot_span(total, world, mode="infinite")
        share = hi - lo
        if pattern == "shard_end":
            later = i % 2  # odd slots run into the second epoch
            first = next(plan_epoch(SIZES, world, seed=SEED, epoch=EPOCH + later, mode="infinite"))
            out[world.rank, world.worker] = later * share + first.num_samples
            continue
        out[world.rank, world.worker] = {
            "uneven": (i + 2) * share // 2 + (3 * i + 2) % 5,
            "boundary": (i % 3) * share,
            "epoch_end": share,
            "start": 0,
        }[pattern]
    return out


def _level(topology: tuple[int, int], counts: dict[Slot, int]) -> Level:
    world_size, num_workers = topology
    delivered = tuple(tuple(counts[r, w] for w in range(num_workers)) for r in range(world_size))
    return Level(world_size, num_workers, delivered)


def _dataset(manifest, options: dict, **kwargs) -> ShardDataset:
    return ShardDataset(manifest, mode="infinite", seed=SEED, epoch=EPOCH, **options, **kwargs)


def _setup(make_shards, options: dict) -> tuple[ShardDataset, Model]:
    ds = _dataset(make_shards(SIZES), options)
    return ds, Model(SIZES, seed=SEED, buffer_size=options["buffer_size"], interleave=options["interleave"], start=EPOCH)


def _untagged(tagged: dict[Slot, list[tuple[int, str]]]) -> dict[Slot, list[str]]:
    return {slot: [k for _, k in items] for slot, items in tagged.items()}


def _drain_takes(model: Model, plan: ModelPlan, topology: tuple[int, int]) -> dict[Slot, int]:
    """Per new slot: its share of the carried epochs and of one whole epoch, plus :data:`DRAIN`."""
    out = {}
    for world in _slots(topology):
        share = 0
        for epoch in range(plan.epoch, plan.epoch + len(plan.carried) + 1):
            lo, hi = slot_span(len(model.keys_of(plan, epoch)), world, mode="infinite")
            share += hi - lo
        out[world.rank, world.worker] = share + DRAIN
    return out


def _check_epochs(plan: ModelPlan, *levels) -> None:
    """Every epoch up to the first whole one after ``plan``'s carried epochs
    was delivered exactly once; no epoch has a key twice."""
    counts = per_epoch(*levels)
    settled = plan.epoch + len(plan.carried)  # the first whole epoch of the new topology
    for epoch in range(EPOCH, settled + 1):
        assert counts[epoch] == ALL_KEYS, f"epoch {epoch}"
    assert all(max(c.values()) == 1 for c in counts.values())


@pytest.mark.parametrize("pattern", ["uneven", "shard_end", "boundary", "epoch_end", "start"])
@pytest.mark.parametrize("old,new", [((3, 2), (2, 1)), ((3, 2), (4, 2)), ((1, 1), (2, 2))])
@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
def test_changed_topology_delivers_each_epoch_in_flight_once_then_whole_epochs(
    make_shards, options, old, new, pattern
):
    ds, model = _setup(make_shards, OPTIONS[options])
    stops = _stops(pattern, old)
    start = ModelPlan(EPOCH)
    before = model.read_level(start, old, stops)
    assert read_slots(ds, old, epoch=EPOCH, state=None, takes=stops) == _untagged(before)
    if pattern == "uneven":
        assert len({epoch for tagged in before.values() for epoch, _ in tagged}) >= 2  # slots in different epochs
    state = ReaderState(dataset_fingerprint(ds.catalog), ds.options, EPOCH, (_level(old, stops),)).to_dict()

    plan = model.next_plan(start, before)
    if pattern in ("epoch_end", "start") and OPTIONS[options]["buffer_size"] == 1:
        assert plan == ModelPlan(EPOCH + (pattern == "epoch_end"))  # nothing carried: a fresh start
    takes = _drain_takes(model, plan, new)
    after = model.read_level(plan, new, takes)
    assert read_slots(ds, new, epoch=EPOCH, state=state, takes=takes) == _untagged(after)
    _check_epochs(plan, before, after)
    # The new slots' shares of each carried remainder differ by at most one.
    for epoch in range(plan.epoch, plan.epoch + len(plan.carried)):
        shares = [sum(e == epoch for e, _ in tagged) for tagged in after.values()]
        assert max(shares) - min(shares) <= 1


def test_topology_changes_twice_and_a_changed_state_resumes_exactly(make_shards):
    ds, model = _setup(make_shards, OPTIONS["buffer, interleave"])
    a, b, c = (3, 2), (2, 1), (4, 2)
    stops_a = _stops("uneven", a)
    start = ModelPlan(EPOCH)
    first = model.read_level(start, a, stops_a)
    levels: tuple[Level, ...] = (_level(a, stops_a),)
    state_a = ReaderState(dataset_fingerprint(ds.catalog), ds.options, EPOCH, levels).to_dict()
    plan_b = model.next_plan(start, first)

    stops_b = {(0, 0): 9, (1, 0): 60}  # rank 1 runs past the carried epochs into whole ones
    second = model.read_level(plan_b, b, stops_b)
    assert max(epoch for epoch, _ in second[1, 0]) >= plan_b.epoch + len(plan_b.carried)
    assert read_slots(ds, b, epoch=EPOCH, state=state_a, takes=stops_b) == _untagged(second)
    state_b = ReaderState(dataset_fingerprint(ds.catalog), ds.options, EPOCH, levels + (_level(b, stops_b),)).to_dict()

    # The same topology goes on with exactly the sequence it had.
    going_on = read_slots(ds, b, epoch=EPOCH, state=state_b, takes={(0, 0): 25, (1, 0): 25})
    longer = model.read_level(plan_b, b, {slot: n + 25 for slot, n in stops_b.items()})
    assert going_on == {slot: [k for _, k in longer[slot][stops_b[slot] :]] for slot in stops_b}

    # Another topology takes what neither earlier one delivered.
    plan_c = model.next_plan(plan_b, second)
    assert plan_c.epoch >= EPOCH
    takes = _drain_takes(model, plan_c, c)
    third = model.read_level(plan_c, c, takes)
    assert read_slots(ds, c, epoch=EPOCH, state=state_b, takes=takes) == _untagged(third)
    _check_epochs(plan_c, first, second, third)


def test_load_state_dict_resumes_infinite_mode_on_another_world_size(make_shards):
    ds, model = _setup(make_shards, OPTIONS["buffer"])
    old, new = (2, 1), (3, 1)
    stops = {(0, 0): 11, (1, 0): 30}
    start = ModelPlan(EPOCH)
    before = model.read_level(start, old, stops)
    # Each old rank saves its own state; the merged one moves to 3 ranks.
    rank_states = []
    for rank in range(old[0]):
        own = _dataset(ds.catalog.manifest, OPTIONS["buffer"], rank=rank, world_size=old[0])
        got = [s["__key__"] for s in itertools.islice(iter(own), stops[rank, 0])]
        assert got == [k for _, k in before[rank, 0]]
        rank_states.append(own.state_dict())
    state = merge_states(rank_states)
    after = model.read_level(model.next_plan(start, before), new, {(r, 0): 40 for r in range(new[0])})
    for rank in range(new[0]):
        resumed = _dataset(ds.catalog.manifest, OPTIONS["buffer"], rank=rank, world_size=new[0])
        resumed.set_epoch(0)  # loading the state sets its epoch
        resumed.load_state_dict(state)
        assert resumed.epoch == EPOCH
        assert [s["__key__"] for s in itertools.islice(iter(resumed), 40)] == [k for _, k in after[rank, 0]]
