"""Checkpoint and resume of the reader: exact continuation in a new process,
changed topologies, and refused states."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from shardkit import ShardDataset, World, make_loader
from shardkit.errors import StateError, UsageError
from shardkit.read.resume import Level, ReaderState, merge_states
from shardkit.read.resume.state import STATE_VERSION, dataset_fingerprint
from tests.read.resume_child import batch_keys

SIZES = [7, 0, 5, 6, 4]  # 22 samples, one empty shard
CHILD = os.path.join(os.path.dirname(__file__), "resume_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL_KEYS = sorted(f"s{shard:03d}_{i:05d}" for shard, n in enumerate(SIZES) for i in range(n))

MODES = {
    "exact": dict(mode="exact", seed=7, buffer_size=4, rank=1, world_size=2),
    "balanced": dict(mode="balanced", seed=7, buffer_size=5, interleave=2, rank=0, world_size=3),
    "infinite": dict(mode="infinite", seed=7, buffer_size=6, buffer_bytes=4096, rank=0, world_size=2),
}


def _run_child(tmp_path, job: dict) -> dict:
    job_path = tmp_path / "job.json"
    job["out"] = str(tmp_path / "out.json")
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, CHILD, str(job_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_resume_in_a_new_process_continues_the_uninterrupted_sequence(make_shards, tmp_path, mode, num_workers):
    manifest = make_shards(SIZES)
    data = manifest.location
    dataset_kwargs = {**MODES[mode], "epoch": 1}
    loader_kwargs = dict(batch_size=2, num_workers=num_workers, in_order=True)

    def new_loader():
        ds = ShardDataset(data, **dataset_kwargs)
        return ds, make_loader(ds, **loader_kwargs)

    # In infinite mode the stream runs on into later epochs: compare a prefix
    # that spans more than one epoch.
    _, loader = new_loader()
    limit = 16 if mode == "infinite" else None
    batches = [batch_keys(b) for b in itertools.islice(loader, limit)]
    del loader
    full = [k for b in batches for k in b]
    stops = sorted({0, 1, 3, len(batches) // 2, len(batches) - 1, len(batches)})
    cases = []
    for step in stops:
        _, loader = new_loader()
        head = list(itertools.islice(loader, step))
        assert [k for b in head for k in batch_keys(b)] == [k for b in batches[:step] for k in b]
        path = tmp_path / f"state{step}.json"
        path.write_text(json.dumps(loader.state_dict()))
        del loader
        cases.append({"state": str(path), "take": None if limit is None else limit - step})
    finite = mode != "infinite"
    result = _run_child(
        tmp_path,
        {"data": data, "dataset": {**MODES[mode]}, "loader": loader_kwargs, "cases": cases, "next_epoch": finite},
    )
    for step, tail in zip(stops, result["runs"]):
        prefix = [k for b in batches[:step] for k in b]
        assert prefix + tail == full, f"stopped after {step} batches"
    if finite:
        # The epoch after a resumed one starts afresh, as it would have.
        ds, loader = new_loader()
        ds.set_epoch(2)
        expected = [k for b in loader for k in batch_keys(b)]
        assert all(following == expected for following in result["next"])


def test_dataset_state_round_trips_mid_shard_at_a_boundary_and_at_the_end(make_shards):
    manifest = make_shards(SIZES)
    kwargs = dict(mode="exact", seed=2, shuffle=False)
    full = [s["__key__"] for s in ShardDataset(manifest, **kwargs)]
    for step in (0, 3, 7, 12, len(full)):  # 7 and 12 end shards in manifest order
        ds = ShardDataset(manifest, **kwargs)
        it = iter(ds)
        head = [s["__key__"] for s in itertools.islice(it, step)]
        state = json.loads(json.dumps(ds.state_dict()))
        again = ShardDataset(manifest, **kwargs)
        again.load_state_dict(state)
        assert head + [s["__key__"] for s in again] == full


def _take_level(
    ds: ShardDataset, world_size: int, num_workers: int, epoch: int, state, takes
) -> tuple[list[str], Level]:
    """Read ``takes[rank][worker]`` samples (None: all) of every slot, resuming
    ``state``; return the keys and the level reached."""
    keys: list[str] = []
    counts = []
    start = ReaderState.from_dict(state) if state is not None else None
    for rank in range(world_size):
        row = []
        for worker in range(num_workers):
            world = World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
            samples = ds.iter_slot(world, epoch=epoch, state=state)
            got = [s["__key__"] for s in itertools.islice(samples, takes[rank][worker])]
            keys += got
            before = 0
            last = start.levels[-1] if start is not None and start.levels else None
            if last is not None and (last.world_size, last.num_workers) == (world_size, num_workers):
                before = last.count(rank, worker) or 0
            row.append(before + len(got))
        counts.append(row)
    return keys, Level(world_size, num_workers, tuple(tuple(r) for r in counts))


@pytest.mark.parametrize("mode,pad", [("exact", False), ("balanced", False), ("balanced", True)])
@pytest.mark.parametrize("old,new", [((3, 2), (2, 1)), ((2, 1), (4, 2)), ((1, 1), (3, 2))])
def test_changed_topology_delivers_the_rest_of_the_epoch_once(make_shards, mode, pad, old, new):
    manifest = make_shards([9, 0, 13, 5, 11])
    total = 38
    ds = ShardDataset(manifest, mode=mode, pad=pad, seed=4, buffer_size=5, interleave=2)
    epoch = 3
    takes = [[(r * 3 + w * 2) % 5 for w in range(old[1])] for r in range(old[0])]
    head, level = _take_level(ds, *old, epoch, None, takes)
    state = ReaderState(dataset_fingerprint(ds.catalog), ds.options, epoch, (level,)).to_dict()
    # Each old rank saves its own part; merging them gives the full state.
    rank_states = []
    for rank in range(old[0]):
        own = tuple(entry if i == rank else None for i, entry in enumerate(level.delivered))
        rank_level = Level(level.world_size, level.num_workers, own)
        rank_states.append(ReaderState(dataset_fingerprint(ds.catalog), ds.options, epoch, (rank_level,)).to_dict())
    assert merge_states(rank_states) == state
    everything = [[None] * new[1] for _ in range(new[0])]
    tail, _ = _take_level(ds, *new, epoch, state, everything)
    per_rank = []
    for rank in range(new[0]):
        slots = [World(rank=rank, world_size=new[0], worker=w, num_workers=new[1]) for w in range(new[1])]
        per_rank.append(sum(len(list(ds.iter_slot(slot, epoch=epoch, state=state))) for slot in slots))
    seen = head + tail
    assert len(set(head)) == len(head)
    if mode == "exact":
        assert sorted(seen) == sorted(manifest_keys(manifest))
        assert max(per_rank) - min(per_rank) <= 1
    else:
        assert len(set(per_rank)) == 1
        if not pad:
            assert len(set(seen)) == len(seen)
            # Fewer than world_size samples are dropped, at each level.
            assert total - len(seen) < old[0] + new[0]
        else:
            assert set(seen) == set(manifest_keys(manifest))


def test_changed_topology_twice_in_one_epoch(make_shards):
    manifest = make_shards([9, 0, 13, 5, 11])
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    head, level1 = _take_level(ds, 2, 2, 0, None, [[3, 0], [5, 2]])
    state1 = ReaderState(dataset_fingerprint(ds.catalog), ds.options, 0, (level1,)).to_dict()
    middle, level2 = _take_level(ds, 3, 1, 0, state1, [[2], [4], [0]])
    state2 = ReaderState(dataset_fingerprint(ds.catalog), ds.options, 0, (level1, level2)).to_dict()
    tail, _ = _take_level(ds, 1, 2, 0, state2, [[None, None]])
    assert sorted(head + middle + tail) == sorted(manifest_keys(manifest))


def manifest_keys(manifest) -> list[str]:
    return [f"s{i:03d}_{j:05d}" for i, s in enumerate(manifest.shards) for j in range(s.num_samples)]


def test_loader_state_counts_what_reached_the_caller_not_what_workers_prefetched(make_shards):
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", seed=3, buffer_size=3)
    loader = make_loader(ds, batch_size=2, num_workers=2, in_order=False, prefetch_factor=4)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    state = loader.state_dict()
    delivered = state["levels"][-1]["delivered"][0]
    assert sum(delivered) == sum(len(b["__key__"]) for b in got) == 6
    del it, loader


def test_a_rank_local_state_cannot_move_to_another_world_size(make_shards):
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", rank=1, world_size=2)
    list(itertools.islice(iter(ds), 2))
    state = ds.state_dict()
    with pytest.raises(StateError, match=r"needs every old rank's position.*merge_states"):
        ShardDataset(manifest, mode="exact", rank=0, world_size=3).load_state_dict(state)
    same_topology = ShardDataset(manifest, mode="exact", rank=0, world_size=2)
    same_topology.load_state_dict(state)  # rank 0 may hold a copy of rank 1's file; reading is refused
    with pytest.raises(StateError, match="no position for rank 0"):
        next(iter(same_topology))


def _state(manifest, **kwargs):
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4, **kwargs)
    list(itertools.islice(iter(ds), 3))
    return json.loads(json.dumps(ds.state_dict()))


@pytest.mark.parametrize(
    "option,value",
    [("seed", 2), ("buffer_size", 8), ("shuffle", False), ("mode", "balanced"), ("interleave", 2)],
)
def test_a_state_with_other_options_is_refused_naming_the_option(make_shards, option, value):
    manifest = make_shards(SIZES)
    state = _state(manifest)
    kwargs = {"mode": "exact", "seed": 1, "buffer_size": 4, option: value}
    with pytest.raises(StateError, match=rf"saved with {option}=.*has {option}="):
        ShardDataset(manifest, **kwargs).load_state_dict(state)


def test_a_state_of_another_dataset_is_refused(make_shards):
    state = _state(make_shards(SIZES, name="a"))
    other = make_shards([3, 3], name="b")
    with pytest.raises(StateError, match="another dataset.*fingerprint"):
        ShardDataset(other, mode="exact", seed=1, buffer_size=4).load_state_dict(state)


@pytest.mark.parametrize(
    "corrupt,message",
    [
        (lambda s: s.pop("levels"), r"missing \['levels'\]"),
        (lambda s: s.update(extra=1), r"unexpected \['extra'\]"),
        (lambda s: s.update(version=99), "version 99 is not supported"),
        (lambda s: s.pop("shuffle_algorithm"), r"missing \['shuffle_algorithm'\]"),
        (lambda s: s.update(epoch="1"), "'epoch' must be an integer"),
        (lambda s: s["levels"][0].update(delivered=[[-1]]), r"must be an integer >= 0, got -1"),
        (lambda s: s["levels"][0].update(delivered=[1, 2]), "must be a list of 1 entries"),
        (lambda s: s["levels"][0].pop("num_workers"), r"missing \['num_workers'\]"),
        (lambda s: s["levels"][0].update(delivered=[[99]]), "delivered 99 samples, but its share"),
    ],
)
def test_a_corrupt_state_is_refused_with_a_clear_message(make_shards, corrupt, message):
    manifest = make_shards(SIZES)
    state = _state(manifest)
    corrupt(state)
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    with pytest.raises(StateError, match=message):
        ds.load_state_dict(state)
        next(iter(ds))


def test_a_state_of_another_shuffle_algorithm_is_refused_naming_both(make_shards):
    from shardkit.read.shuffle import SHUFFLE_ALGORITHM

    manifest = make_shards(SIZES)
    state = _state(manifest)
    assert state["shuffle_algorithm"] == SHUFFLE_ALGORITHM
    state["shuffle_algorithm"] = "swap_buffer_v0"
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    with pytest.raises(StateError, match=rf"'swap_buffer_v0'.*{SHUFFLE_ALGORITHM!r}.*start the epoch afresh"):
        ds.load_state_dict(state)
    with pytest.raises(StateError, match="different shuffle algorithm"):
        merge_states([_state(manifest), state])


def test_a_version_1_state_is_read_as_the_swap_buffer_shuffle(make_shards):
    # A version 1 state names no shuffle: it is one of "swap_buffer_v1", which
    # this release no longer runs, so mid-epoch it is refused naming both.
    from shardkit.read.shuffle import SHUFFLE_ALGORITHM

    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    list(itertools.islice(iter(ds), 5))
    state = ds.state_dict()
    del state["shuffle_algorithm"], state["mixture"]  # what the release before the last wrote
    state["version"] = 1
    resumed = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    with pytest.raises(StateError, match=rf"'swap_buffer_v1'.*{SHUFFLE_ALGORITHM!r}.*start the epoch afresh"):
        resumed.load_state_dict(state)
    state["shuffle_algorithm"] = "swap_buffer_v1"
    with pytest.raises(StateError, match=r"unexpected \['shuffle_algorithm'\]"):
        ShardDataset(manifest, mode="exact", seed=1, buffer_size=4).load_state_dict(state)


def test_a_version_2_state_of_one_dataset_resumes_exactly(make_shards):
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    it = iter(ds)
    list(itertools.islice(it, 5))
    state = ds.state_dict()
    rest = [s["__key__"] for s in it]
    del state["mixture"]  # what the previous release wrote
    state["version"] = 2
    resumed = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    resumed.load_state_dict(state)
    assert [s["__key__"] for s in resumed] == rest


def test_a_state_between_epochs_of_another_shuffle_loads(make_shards):
    # No buffer position, so the shuffle it was saved with does not matter.
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    ds.set_epoch(1)
    state = ds.state_dict()
    assert state["levels"] == []
    del state["shuffle_algorithm"], state["mixture"]
    state["version"] = 1
    resumed = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["version"] == STATE_VERSION == 3
    fresh = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    fresh.set_epoch(1)
    assert [s["__key__"] for s in resumed] == [s["__key__"] for s in fresh]


def test_a_state_that_is_not_a_mapping_is_refused(make_shards):
    ds = ShardDataset(make_shards(SIZES), mode="exact")
    with pytest.raises(StateError, match="must be a mapping, not list"):
        ds.load_state_dict([1, 2])  # type: ignore[arg-type]


def test_resume_needs_offset_indexes(make_shards, tmp_path):
    manifest = make_shards([3, 3])
    shards = [manifest.resolve(s.path) for s in manifest.shards]
    for shard in manifest.shards:
        os.remove(manifest.resolve(shard.index))
    ds = ShardDataset(shards, mode="exact")
    with pytest.raises(UsageError, match="needs per-shard sample counts and offset indexes"):
        ds.state_dict()


def test_persistent_workers_refuse_a_late_load(make_shards):
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", seed=3)
    loader = make_loader(ds, num_workers=2)
    state = loader.state_dict()
    list(loader)
    with pytest.raises(UsageError, match="before this loader's first iteration"):
        loader.load_state_dict(state)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_the_dataset(make_shards, num_workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    manifest = make_shards(SIZES)

    def new():
        ds = ShardDataset(manifest, mode="exact", seed=5, buffer_size=4)
        return stateful.StatefulDataLoader(ds, batch_size=2, num_workers=num_workers)

    full = [k for b in new() for k in b["__key__"]]
    loader = new()
    it = iter(loader)
    head = [k for _ in range(4) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(loader.state_dict(), default=list))
    del it, loader
    again = new()
    again.load_state_dict(state)
    assert head + [k for b in again for k in b["__key__"]] == full


def test_loader_state_at_the_end_of_an_epoch_and_after_set_epoch(make_shards):
    manifest = make_shards(SIZES)
    ds = ShardDataset(manifest, mode="exact", seed=3, buffer_size=3)
    loader = make_loader(ds, batch_size=4, num_workers=2)
    keys = [k for b in loader for k in b["__key__"]]
    done = loader.state_dict()
    assert done["epoch"] == 0 and sum(done["levels"][-1]["delivered"][0]) == len(keys) == len(ALL_KEYS)
    ds.set_epoch(1)
    assert loader.state_dict()["levels"] == []  # the next epoch has not started
    # A finished epoch resumes as an empty one.
    again = ShardDataset(manifest, mode="exact", seed=3, buffer_size=3)
    resumed = make_loader(again, batch_size=4, num_workers=2)
    resumed.load_state_dict(done)
    assert list(resumed) == []
