"""make_loader: a real DataLoader over ShardDataset with the helper's defaults."""

from __future__ import annotations

import sys

import pytest
import torch

from shardkit import ShardDataset, make_loader
from shardkit.errors import UsageError
from shardkit.read.loader import ShardLoader, fork_can_deadlock, fork_hazard, supports_out_of_order


def test_loader_delivers_each_sample_once_per_epoch_with_persistent_workers(make_shards):
    manifest = make_shards([7, 0, 5, 6])
    ds = ShardDataset(manifest, mode="exact", seed=4, buffer_size=5)
    loader = make_loader(ds, batch_size=4, num_workers=2)
    assert loader.persistent_workers
    if supports_out_of_order():
        assert loader.in_order is False
    epochs = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        keys = [k for batch in loader for k in batch["__key__"]]
        assert sorted(keys) == sorted(f"s{i:03d}_{j:05d}" for i, n in enumerate([7, 0, 5, 6]) for j in range(n))
        epochs.append(keys)
    assert epochs[0] != epochs[1]


def test_loader_in_process_and_with_in_worker_batches(make_shards):
    manifest = make_shards([5, 4])
    ds = ShardDataset(manifest, mode="exact", decode="pil", batch_size=3)
    batches = list(make_loader(ds, num_workers=0))
    assert sum(len(b["cls"]) for b in batches) == 9
    assert all(isinstance(b["cls"], torch.Tensor) for b in batches)
    with pytest.raises(UsageError, match="already batches"):
        make_loader(ds, batch_size=4)


@pytest.mark.parametrize("context", ["spawn"])  # the strictest: everything is pickled
def test_set_epoch_and_skip_counter_work_with_spawned_workers(make_shards, context):
    manifest = make_shards([3, 4, 2, 5])
    ds = ShardDataset(manifest, mode="exact", seed=1, buffer_size=4)
    loader = make_loader(ds, num_workers=2, multiprocessing_context=context, in_order=True)
    first = [s["__key__"] for s in loader]
    ds.set_epoch(1)
    second = [s["__key__"] for s in loader]
    assert sorted(first) == sorted(second) and first != second
    assert ds.num_skipped == 0


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_started_by_spawn_or_forkserver_yield_every_sample_once_and_count_skips(make_shards, context):
    from shardkit.format.index import load_index

    manifest = make_shards([6, 6])
    for shard in manifest.shards:  # one bad sample in each shard: each worker skips one
        bounds = load_index(manifest.resolve(shard.index))
        with open(manifest.resolve(shard.path), "r+b") as f:
            f.seek(int(bounds[2]) + 1024 + 2)  # a name byte of sample 2's second member header
            f.write(b"Z")
    ds = ShardDataset(manifest, mode="exact", seed=6, buffer_size=3, on_error="skip")
    loader = make_loader(ds, batch_size=2, num_workers=2, multiprocessing_context=context, persistent_workers=False)
    keys = [k for batch in loader for k in batch["__key__"]]
    expected = [f"s{i:03d}_{j:05d}" for i in range(2) for j in range(6) if j != 2]
    assert sorted(keys) == expected
    assert ds.num_skipped == 2
    assert sum(sum(row) for row in loader.state_dict()["levels"][-1]["delivered"]) == len(keys)


def test_fork_deadlock_is_known_by_version():
    assert fork_can_deadlock((3, 10, 14)) and fork_can_deadlock((3, 11, 7)) and fork_can_deadlock((3, 11, 9))
    assert not fork_can_deadlock((3, 11, 10)) and not fork_can_deadlock((3, 12, 0)) and not fork_can_deadlock((3, 13, 1))


def test_forking_workers_beside_a_process_group_names_the_cpython_hang_and_the_remedy(make_shards, tmp_path):
    """No worker is started here: forking beside gloo's thread is the hazard itself."""
    import torch.distributed as dist

    ds = ShardDataset(make_shards([3]), mode="exact", rank=0, world_size=1)
    assert fork_hazard(make_loader(ds, num_workers=1)) is None  # no process group: no thread of its
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        hazard = fork_hazard(make_loader(ds, num_workers=1))
        if fork_can_deadlock():  # as on this project's pinned Python, 3.11.7
            assert hazard is not None and "gh-112275" in hazard and 'multiprocessing_context="forkserver"' in hazard
            assert sys.version.split()[0] in hazard
        else:
            assert hazard is None
        assert fork_hazard(make_loader(ds, num_workers=1, multiprocessing_context="forkserver")) is None
        assert fork_hazard(make_loader(ds, num_workers=0)) is None
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("workers", "batch_size", "drop_last", "rank", "world_size", "mode"),
    [
        (4, 10, False, 0, 1, "exact"),  # 4 workers x 12 or 13 samples: 2 batches each, not ceil(49 / 10) = 5
        (4, 10, True, 0, 1, "exact"),
        (3, 4, False, 1, 2, "exact"),
        (3, 4, False, 2, 3, "balanced"),
        (0, 7, False, 0, 1, "exact"),
        (2, None, False, 1, 2, "balanced"),
    ],
)
def test_len_of_the_loader_is_the_number_of_batches_it_yields(make_shards, workers, batch_size, drop_last, rank, world_size, mode):
    manifest = make_shards([13, 9, 11, 16])
    ds = ShardDataset(manifest, mode=mode, seed=2, rank=rank, world_size=world_size)
    loader = make_loader(ds, batch_size=batch_size, num_workers=workers, drop_last=drop_last)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert len(loader) == sum(1 for _ in loader)
    counts = ds.samples_per_worker(max(workers, 1))
    assert sum(counts) == ds.num_samples and max(counts) - min(counts) <= 1


@pytest.mark.parametrize("partial", [True, False])
def test_len_counts_batches_made_in_the_workers_and_of_a_mixture(make_shards, tmp_path, partial):
    from shardkit import Stream
    from tests.conftest import build_dataset

    manifest = make_shards([13, 9, 11, 16])
    ds = ShardDataset(manifest, mode="exact", seed=2, batch_size=5, partial_batches=partial)
    loader = make_loader(ds, num_workers=3)
    assert len(loader) == sum(1 for _ in loader)
    with pytest.raises(TypeError, match=r"len\(make_loader"):
        len(ds)
    build_dataset(str(tmp_path / "small"), [3, 2])
    mixture = ShardDataset(
        [Stream(manifest.location, weight=0.5), Stream(str(tmp_path / "small"), weight=0.5)], mode="exact", seed=1
    )
    loader = make_loader(mixture, batch_size=4, num_workers=3)
    assert len(loader) == sum(1 for _ in loader)


def test_len_of_an_endless_loader_says_why_it_has_none(make_shards):
    ds = ShardDataset(make_shards([4, 4]), mode="infinite")
    with pytest.raises(TypeError, match="mode='infinite'"):
        len(make_loader(ds, num_workers=2))


@pytest.mark.parametrize(("batch_size", "drop_last", "taken"), [(3, False, 4), (4, True, 3), (None, False, 7)])
def test_len_after_load_state_dict_counts_the_batches_left_of_the_epoch(make_shards, batch_size, drop_last, taken):
    manifest = make_shards([13, 9, 11, 16])

    def loader() -> ShardLoader:
        ds = ShardDataset(manifest, mode="exact", seed=5, buffer_size=4)
        ds.set_epoch(2)
        return make_loader(ds, batch_size=batch_size, num_workers=2, drop_last=drop_last)

    first = loader()
    whole = len(first)
    for step, _ in enumerate(first):
        if step + 1 == taken:
            state = first.state_dict()
            break
    resumed = loader()
    resumed.load_state_dict(state)
    left = len(resumed)
    lengths_while_reading = [len(resumed) for _ in resumed]
    assert left == len(lengths_while_reading) == whole - taken  # the resumed epoch, as it is read
    assert set(lengths_while_reading) == {left}  # and while it is read (a progress bar asks each step)
    resumed.shard_dataset.set_epoch(3)
    assert len(resumed) == whole == sum(1 for _ in resumed)  # the next epoch is whole again


_WORKER_MARK: list[int] = []


def _mark_worker(worker_id: int) -> None:
    _WORKER_MARK[:] = [100 + worker_id]


def _keys_and_mark(samples: list[dict]) -> tuple[list[int], list[str]]:
    """A collation of one's own: the batch's keys, and what the worker's init left."""
    return list(_WORKER_MARK), [s["__key__"] for s in samples]


def test_collate_fn_and_worker_init_fn_are_the_dataloaders_and_resume_stays_exact(make_shards):
    manifest = make_shards([7, 5, 6, 4])
    every = sorted(f"s{i:03d}_{j:05d}" for i, n in enumerate([7, 5, 6, 4]) for j in range(n))

    def loader() -> torch.utils.data.DataLoader:
        ds = ShardDataset(manifest, mode="exact", seed=3, buffer_size=4)
        ds.set_epoch(1)
        return make_loader(ds, batch_size=3, num_workers=2, in_order=True,
                           collate_fn=_keys_and_mark, worker_init_fn=_mark_worker)

    full = list(loader())
    assert {tuple(mark) for mark, _ in full} == {(100,), (101,)}  # each worker's init ran there
    assert sorted(k for _, keys in full for k in keys) == every

    first = loader()
    seen = []
    for step, (_, keys) in enumerate(first):
        seen += keys
        if step == 2:
            state = first.state_dict()
            break
    resumed = loader()
    resumed.load_state_dict(state)
    assert seen + [k for _, keys in resumed for k in keys] == [k for _, keys in full for k in keys]
