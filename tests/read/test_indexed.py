"""IndexedDataset over local shards: same samples as the stream, errors, workers."""

from __future__ import annotations

import builtins
import gzip
import os
import pickle
import tracemalloc

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import shardkit
from shardkit.errors import CorruptShardError, TruncatedShardError, UsageError
from shardkit.format.manifest import Manifest, ShardEntry
from shardkit.format.table import build_table
from shardkit.read.indexed import IndexedDataset, compression_of

SIZES = (7, 0, 5, 9, 3)


def streamed(source, **kwargs) -> list[dict]:
    ds = shardkit.ShardDataset(source, mode="exact", shuffle=False, **kwargs)
    return list(ds)


@pytest.fixture
def dataset(make_shards):
    return make_shards(SIZES)


def test_random_indices_give_the_streamed_samples(dataset):
    expected = streamed(dataset.location)
    ds = IndexedDataset(dataset.location)
    assert len(ds) == len(expected) == sum(SIZES)
    order = np.random.default_rng(0).permutation(len(ds))
    for i in order.tolist():
        got = ds[i]
        assert got.pop("__index__") == i
        assert got == expected[i]


def test_sources_manifest_object_and_sidecar_shards_agree(dataset):
    by_dir = IndexedDataset(dataset.location)
    by_manifest = IndexedDataset(dataset)
    shards = [dataset.resolve(s.path) for s in dataset.shards]
    by_list = IndexedDataset(shards)
    assert len(by_dir) == len(by_manifest) == len(by_list)
    for i in (0, 6, 7, 20, len(by_dir) - 1):
        assert by_dir[i] == by_manifest[i] == by_list[i]


def test_negative_indices_count_from_the_end_and_out_of_range_names_the_length(dataset):
    ds = IndexedDataset(dataset)
    assert ds[-1]["__key__"] == ds[len(ds) - 1]["__key__"] == "s004_00002"
    assert ds[np.int64(3)]["__index__"] == 3
    assert ds[torch.tensor(4)]["__index__"] == 4
    for bad in (len(ds), -len(ds) - 1, 10**9):
        with pytest.raises(IndexError, match=f"out of range for IndexedDataset of length {len(ds)}"):
            ds[bad]
    with pytest.raises(TypeError, match="must be integers"):
        ds[1.5]


@pytest.mark.parametrize(
    "batch", [[-1, 0, 3], np.array([5, -2, 7], dtype=np.int32), np.array([2, 9], dtype=np.uint64), torch.tensor([4, 1])],
    ids=["list", "int32", "uint64", "tensor"],
)
def test_a_batch_is_located_as_its_indices_one_by_one(dataset, batch):
    ds = IndexedDataset(dataset)
    assert ds.__getitems__(batch) == [ds[int(i)] for i in batch]


@pytest.mark.parametrize("batch, error", [([0, 10**9, 1], IndexError), ([0, 1.5], TypeError)], ids=["range", "type"])
def test_a_batch_with_a_bad_index_raises_its_error(dataset, batch, error):
    with pytest.raises(error, match="out of range for IndexedDataset|must be integers"):
        IndexedDataset(dataset).__getitems__(batch)


def test_decode_and_map_apply_in_order(dataset):
    ds = IndexedDataset(dataset, decode="pil", map=lambda s: (s["__index__"], s["cls"], s["json"]))
    assert ds[8] == (8, (2 * 7 + 1) % 10, {"shard": 2, "i": 1})


def test_needs_offsets_and_says_how_to_get_them(make_shards, tmp_path):
    manifest = make_shards((3,), name="noidx")
    shard = manifest.resolve(manifest.shards[0].path)
    os.remove(manifest.resolve(manifest.shards[0].index))
    with pytest.raises(UsageError, match="needs per-sample offsets.*manifest"):
        IndexedDataset([shard])


def test_compressed_shards_are_refused_with_reshard_advice(make_shards, tmp_path):
    manifest = make_shards((3,), name="gz")
    plain = manifest.resolve(manifest.shards[0].path)
    with open(plain, "rb") as f:
        data = f.read()
    for name in ("x.tar.gz", "x.bin"):  # named, and detected by its first bytes
        path = tmp_path / name
        path.write_bytes(gzip.compress(data))
        with pytest.raises(UsageError, match=r"gzip-compressed shard.*Reshard it uncompressed with `shardkit write"):
            IndexedDataset([str(path)])
    assert compression_of("a/b.tar.zst") == "zstd" and compression_of("a/b.tar") is None
    assert compression_of("b.tar", b"\x28\xb5\x2f\xfd....") == "zstd"


def test_a_gzip_shard_behind_an_index_is_refused_at_read(make_shards):
    manifest = make_shards((3,), name="gzidx")
    plain = manifest.resolve(manifest.shards[0].path)
    with open(plain, "rb") as f:
        data = f.read()
    with open(plain, "wb") as f:
        f.write(gzip.compress(data))
    ds = IndexedDataset(manifest)
    with pytest.raises(UsageError, match="Reshard it uncompressed"):
        ds[0]


def corrupt_sample(manifest: Manifest, shard: int, position: int) -> tuple[str, int]:
    """Zero the first header of a sample; returns (shard path, its offset)."""
    entry = manifest.shards[shard]
    bounds = np.load(manifest.resolve(entry.index))
    path = manifest.resolve(entry.path)
    offset = int(bounds[position])
    with open(path, "r+b") as f:
        f.seek(offset + 148)
        f.write(b"XXXXXXXX")  # a bad header checksum
    return path, offset


def test_corrupt_sample_names_shard_and_offset(dataset):
    path, offset = corrupt_sample(dataset, 2, 1)
    ds = IndexedDataset(dataset)
    bad = 7 + 0 + 1
    with pytest.raises(CorruptShardError) as info:
        ds[bad]
    assert info.value.path == path and info.value.offset == offset
    assert path in str(info.value) and f"at byte {offset}" in str(info.value)
    assert ds[bad + 1]["__index__"] == bad + 1  # neighbours still read


def test_skip_returns_none_counts_it_and_collate_leaves_it_out(dataset):
    corrupt_sample(dataset, 2, 1)
    ds = IndexedDataset(dataset, on_error="skip")
    assert ds[8] is None and ds.num_skipped == 1
    loader = DataLoader(ds, batch_size=4, collate_fn=IndexedDataset.collate, num_workers=2)
    keys = [k for batch in loader for k in batch["__key__"]]
    assert len(keys) == len(ds) - 1 and "s002_00001" not in keys
    assert ds.num_skipped == 2  # the worker's skip is summed in


def test_truncated_shard_is_refused_at_open_against_the_manifest_size(dataset):
    entry = dataset.shards[3]
    path = dataset.resolve(entry.path)
    bounds = np.load(dataset.resolve(entry.index))
    os.truncate(path, int(bounds[5]) + 100)
    with pytest.raises(TruncatedShardError, match=rf"{path}: truncated: the shard has {int(bounds[5]) + 100} bytes but the manifest says"):
        IndexedDataset(dataset)[7 + 5 + 4]


def test_truncated_shard_without_manifest_is_a_corrupt_shard_error_at_the_cut(dataset):
    entry = dataset.shards[3]
    path = dataset.resolve(entry.path)
    bounds = np.load(dataset.resolve(entry.index))
    os.truncate(path, int(bounds[5]) + 100)
    ds = IndexedDataset([dataset.resolve(s.path) for s in dataset.shards])  # .idx sidecars, no sizes
    assert ds[7 + 5 + 4]["__index__"] == 16
    start, end = int(bounds[5]), int(bounds[6])
    with pytest.raises(TruncatedShardError) as info:
        ds[7 + 5 + 5]
    assert str(info.value).startswith(
        f"{path}: bytes [{start}, {end}) asked for, but the object ends at byte {start + 100}: it was cut short"
    )
    assert "shardkit verify" in str(info.value) and info.value.offset == start + 100


def test_a_shard_whose_size_changed_is_one_warning_under_skip(dataset, caplog):
    entry = dataset.shards[3]  # 9 samples, every one refused against the manifest's size
    os.truncate(dataset.resolve(entry.path), entry.num_bytes - 512)
    ds = IndexedDataset(dataset, on_error="skip")
    with caplog.at_level("DEBUG", logger="shardkit.read.indexed"):
        got = [ds[i] for i in range(len(ds))]
    assert sum(sample is None for sample in got) == ds.num_skipped == 9
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "shard-000003.tar" in warnings[0] and "not logged" in warnings[0]
    assert sum("skipping sample" in r.getMessage() for r in caplog.records if r.levelname == "DEBUG") == 8
    corrupt_sample(dataset, 0, 2)  # another shard's fault is a warning of its own
    with caplog.at_level("WARNING", logger="shardkit.read.indexed"):
        assert ds[2] is None
    assert "shard-000000.tar" in caplog.records[-1].getMessage()


def test_index_disagreeing_with_manifest_is_refused(dataset):
    entries = list(dataset.shards)
    entries[0] = ShardEntry(**{**entries[0].__dict__, "num_samples": 8})
    wrong = Manifest(shards=tuple(entries), location=dataset.location)
    with pytest.raises(CorruptShardError, match="shard-000000.idx: offset index is corrupt: it lists 7 samples but the manifest says 8"):
        IndexedDataset(wrong)[0]


def test_million_shard_manifest_opens_without_touching_a_shard(monkeypatch):
    num_shards = 1_000_000
    # Built from columns, as a format-2 manifest's table is (a million
    # ShardEntry objects would take most of this test's time to build).
    table = build_table(
        np.full(num_shards, 1000), np.full(num_shards, 1 << 20), np.zeros((num_shards, 32), dtype=np.uint8)
    )
    manifest = Manifest.from_table(table, location="/nonexistent")
    opened: list[str] = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    real_os_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(str(a[0])) or real_os_open(*a, **k))
    tracemalloc.start()
    try:
        ds = IndexedDataset(manifest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [f for f in opened if f.startswith("/nonexistent")] == []  # (shared counters map /dev/shm)
    assert len(ds) == num_shards * 1000
    # Two int64 arrays of num_shards + 1 entries, and a temporary: ~24 MB.
    assert peak < 40 << 20, f"opening took {peak / 2**20:.1f} MiB"
    assert ds.locate(len(ds) - 1) == (num_shards - 1, 999)
    assert ds.locate(123_456_789) == (123_456, 789)


def test_open_shards_are_bounded(make_shards):
    manifest = make_shards((2,) * 10, name="many")
    ds = IndexedDataset(manifest, max_open_shards=3)
    for i in range(len(ds)):
        ds[i]
    assert len(ds._held) == 3
    ds.close()
    assert ds[0]["__index__"] == 0


def _open_shard_files(folder: str, suffix: str = ".tar") -> list[str]:
    """Files of ``folder`` ending in ``suffix`` this process holds open, one
    entry a descriptor (other tests' datasets may still wait for the garbage
    collector)."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # closed meanwhile
    return [p for p in paths if p.endswith(suffix) and os.path.dirname(p) == folder]


def test_shards_dropped_from_the_open_table_are_closed(make_shards):
    manifest = make_shards((2,) * 10, name="fds")
    ds = IndexedDataset(manifest, max_open_shards=3)
    folder = os.path.realpath(manifest.base)
    assert _open_shard_files(folder) == []
    for i in range(len(ds)):
        ds[i]
    assert len(_open_shard_files(folder)) == 3
    ds.close()
    assert _open_shard_files(folder) == []


def test_pickles_without_open_files(dataset):
    ds = IndexedDataset(dataset, decode="pil")
    ds[0]
    state = ds.__getstate__()
    assert "_counts" not in state and "_starts" not in state, "arrays are derived from the catalog, not pickled"
    copy = pickle.loads(pickle.dumps(ds))
    assert len(copy._held) == 0
    assert copy[5] == ds[5]


def test_distributed_sampler_over_three_ranks_covers_every_index_once(dataset):
    ds = IndexedDataset(dataset)
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=1, drop_last=False)
        loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=2)
        seen += [s["__index__"] for s in loader]
    # DistributedSampler pads to a multiple of 3 by repeating the first indices.
    padded = -(-len(ds) // 3) * 3
    assert len(seen) == padded and set(seen) == set(range(len(ds)))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_processes_fork_and_spawn(dataset, context):
    ds = IndexedDataset(dataset)
    ds[0]  # the parent holds an open file: workers must not share it
    loader = DataLoader(
        ds, batch_size=5, shuffle=True, num_workers=2, multiprocessing_context=context,
        generator=torch.Generator().manual_seed(0),
    )
    keys = sorted(k for batch in loader for k in batch["__key__"])
    assert keys == sorted(s["__key__"] for s in streamed(dataset.location))


def test_stateful_dataloader_resumes_with_the_window_sampler(dataset):
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = IndexedDataset(dataset)

    def loader():
        sampler = shardkit.ShardWindowSampler(ds, window_shards=2, seed=3, rank=0, world_size=1)
        return StatefulDataLoader(ds, sampler=sampler, batch_size=4, num_workers=2)

    full = [i for batch in loader() for i in batch["__index__"].tolist()]
    first = loader()
    it = iter(first)
    head = [i for _ in range(2) for i in next(it)["__index__"].tolist()]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    tail = [i for batch in resumed for i in batch["__index__"].tolist()]
    assert head + tail == full and sorted(full) == list(range(len(ds)))


@pytest.mark.parametrize("decode", [None, "pil"])
def test_batches_are_read_in_order_by_threads_only_when_there_is_work_to_overlap(make_shards, decode):
    manifest = make_shards((3,) * 30, name="wide")
    ds = IndexedDataset(manifest, max_open_shards=4, decode=decode)
    order = np.random.default_rng(2).permutation(len(ds)).tolist()
    batch = ds.__getitems__(order)
    assert [s["__index__"] for s in batch] == order
    assert len(ds._held) <= 4
    assert batch == [ds[i] for i in order]
    assert (ds._pool is None) == (decode is None)  # local raw bytes: a pread and a parse, read in turn
