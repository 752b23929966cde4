"""Corrupt and truncated shards under on_error="raise" and "skip"."""

from __future__ import annotations

import json
import os

import pytest
import torch

from shardkit import CorruptShardError, ShardDataset
from shardkit.format.index import load_index
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.format.tar import encode_header
from shardkit.world import World
from tests.conftest import sample_payload

BAD = 3  # the sample each fault lands in
NUM = 8


def _truncate(path: str, bounds) -> None:
    os.truncate(path, int(bounds[BAD]) + 700)  # inside the sample's first member


def _garbage(path: str, bounds) -> None:
    with open(path, "r+b") as f:  # from the second member's header on, still inside the sample
        f.seek(int(bounds[BAD]) + 1024)
        f.write(bytes(range(7, 250)) * 5)


def _checksum(path: str, bounds) -> None:
    with open(path, "r+b") as f:  # change one name byte of the third member, not the checksum
        f.seek(int(bounds[BAD]) + 2048 + 2)
        f.write(b"Z")


def _no_key(path: str, bounds) -> None:
    with open(path, "r+b") as f:  # rename the second member to a name without KEY.EXT, valid checksum
        f.seek(int(bounds[BAD]) + 1024)
        header = f.read(512)
        size = int(header[124:136].split(b"\0")[0], 8)
        f.seek(int(bounds[BAD]) + 1024)
        f.write(encode_header(f"s000_{BAD:05d}cls", size))


FAULTS = {"truncated": _truncate, "garbage": _garbage, "checksum": _checksum}
MESSAGES = {
    "truncated": "truncated",
    "garbage": "bad tar header checksum",
    "checksum": "bad tar header checksum",
}


def _broken_dataset(make_shards, fault: str):
    manifest = make_shards([NUM, 4])
    path = manifest.resolve(manifest.shards[0].path)
    FAULTS[fault](path, load_index(manifest.resolve(manifest.shards[0].index)))
    return manifest, path


def _check_complete(samples) -> None:
    for sample in samples:  # never a partial sample
        assert set(sample) == {"__key__", "bin", "cls", "json"}
        assert sample["bin"] == sample_payload(sample["__key__"], 100)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_raises_naming_shard_member_offset(make_shards, fault):
    manifest, path = _broken_dataset(make_shards, fault)
    ds = ShardDataset(manifest, mode="exact", shuffle=False)
    with pytest.raises(CorruptShardError, match=MESSAGES[fault]) as info:
        list(ds)
    assert info.value.path == path and path in str(info.value)
    assert info.value.offset is not None


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_is_skipped_counted_and_reading_resumes_after_the_bad_sample(make_shards, fault, caplog):
    manifest, path = _broken_dataset(make_shards, fault)
    ds = ShardDataset(manifest, mode="exact", shuffle=False, on_error="skip")
    samples = list(ds)
    _check_complete(samples)
    keys = {s["__key__"] for s in samples}
    lost = {f"s000_{i:05d}" for i in range(BAD, NUM)} if fault == "truncated" else {f"s000_{BAD:05d}"}
    everything = {f"s000_{i:05d}" for i in range(NUM)} | {f"s001_{i:05d}" for i in range(4)}
    assert keys == everything - lost
    assert ds.num_skipped == 1
    assert path in caplog.text


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_without_index_raises_or_drops_the_rest_of_the_shard(make_shards, fault):
    manifest, path = _broken_dataset(make_shards, fault)
    for shard in manifest.shards:
        os.remove(manifest.resolve(shard.index))
    shards = [manifest.resolve(s.path) for s in manifest.shards]
    with pytest.raises(CorruptShardError, match=MESSAGES[fault]) as info:
        list(ShardDataset(shards, mode="exact", shuffle=False))
    assert info.value.path == path
    ds = ShardDataset(shards, mode="exact", shuffle=False, on_error="skip")
    samples = list(ds)
    _check_complete(samples)
    keys = [s["__key__"] for s in samples]
    assert {f"s001_{i:05d}" for i in range(4)} <= set(keys)
    assert not {f"s000_{i:05d}" for i in range(BAD, NUM)} & set(keys)
    assert ds.num_skipped == 1


def test_member_renamed_out_of_key_ext_form_is_caught_by_checksums_else_skipped_as_webdataset_does(make_shards):
    """A member whose name lost its KEY.EXT form is, by webdataset's
    convention, an entry of no sample (like a README): skipped. The sample
    checksums of the offset index still catch the rename as damage."""
    import webdataset as wds

    manifest = make_shards([NUM, 4])
    path = manifest.resolve(manifest.shards[0].path)
    _no_key(path, load_index(manifest.resolve(manifest.shards[0].index)))
    bad = f"s000_{BAD:05d}"
    with pytest.raises(CorruptShardError, match="fails its checksum") as info:
        list(ShardDataset(manifest, mode="exact", shuffle=False, verify_checksums=True))
    assert info.value.path == path and bad in str(info.value)
    ds = ShardDataset(manifest, mode="exact", shuffle=False, verify_checksums=True, on_error="skip")
    samples = list(ds)
    _check_complete(samples)
    assert bad not in {s["__key__"] for s in samples} and len(samples) == NUM + 3 and ds.num_skipped == 1
    unchecked = {s["__key__"]: s for s in ShardDataset(manifest, mode="exact", shuffle=False)}
    theirs = {s["__key__"]: s for s in wds.WebDataset(path, shardshuffle=False)}
    assert set(unchecked[bad]) == set(theirs[bad]) - {"__url__", "__local_path__"} == {"__key__", "bin", "json"}


def test_worker_error_surfaces_in_the_main_process(make_shards):
    manifest, path = _broken_dataset(make_shards, "checksum")
    loader = torch.utils.data.DataLoader(ShardDataset(manifest, mode="exact"), batch_size=None, num_workers=2)
    try:
        list(loader)
    except CorruptShardError as exc:
        message = str(exc)
        # The traceback's frames hold the loader's iterator: dropped now, it
        # shuts its workers down at once. Left to the garbage collector,
        # torch's shutdown finds its index queues already closed and waits 5 s
        # a worker, in whichever test collects it.
        exc.__traceback__ = None
    else:
        pytest.fail("the worker's CorruptShardError did not reach the main process")
    assert "bad tar header checksum" in message and path in message


def test_skip_counter_adds_up_across_workers(make_shards):
    manifest = make_shards([NUM, NUM])
    for shard in manifest.shards:  # one bad sample in each shard, read by different workers
        _checksum(manifest.resolve(shard.path), load_index(manifest.resolve(shard.index)))
    ds = ShardDataset(manifest, mode="exact", on_error="skip")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert len(list(loader)) == 2 * NUM - 2
    assert ds.num_skipped == 2


def test_manifest_count_that_disagrees_with_the_index_is_reported(make_shards):
    manifest = make_shards([5, 3])
    file = os.path.join(manifest.location, MANIFEST_NAME)
    data = json.loads(manifest.to_format1_json())  # format 1: the counts are in the JSON
    data["shards"][0]["num_samples"] = 6
    data["num_samples"] = 9
    with open(file, "w") as f:
        json.dump(data, f)
    # Read whole or split between ranks, the index is checked against the manifest's count.
    with pytest.raises(CorruptShardError, match="shard-000000.idx: offset index is corrupt: it lists 5 samples but the manifest says 6"):
        list(ShardDataset(manifest.location, mode="exact"))
    ds = ShardDataset(manifest.location, mode="exact", shuffle=False)
    with pytest.raises(CorruptShardError, match="it lists 5 samples but the manifest says 6"):
        list(ds.iter_slot(World(rank=1, world_size=2), epoch=0))


def test_shard_with_more_samples_than_its_index_is_reported(make_shards):
    manifest = make_shards([5])
    other = make_shards([6], name="longer")
    os.replace(other.resolve(other.shards[0].path), manifest.resolve(manifest.shards[0].path))
    # The file's size disagrees with the manifest: refused when opened, read whole or split.
    wrong_size = r"shard-000000.tar: the shard has \d+ bytes but the manifest says 16384: it was rewritten"
    with pytest.raises(CorruptShardError, match=wrong_size):
        list(ShardDataset(manifest, mode="exact"))
    ds = ShardDataset(manifest, mode="exact", shuffle=False)  # split: read through the index
    with pytest.raises(CorruptShardError, match=wrong_size):
        list(ds.iter_slot(World(rank=1, world_size=2), epoch=0))
    # Listed without a manifest (sizes unknown), the index still catches the extra samples.
    shards = [manifest.resolve(s.path) for s in manifest.shards]
    with pytest.raises(CorruptShardError, match="holds more samples than its index lists"):
        list(ShardDataset(shards, mode="exact", shuffle=False).iter_slot(World(rank=1, world_size=2), epoch=0))


def test_a_rewritten_shard_with_extra_samples_never_yields_them_when_skipping(make_shards):
    manifest = make_shards([5, 3])
    other = make_shards([7], name="longer")
    os.replace(other.resolve(other.shards[0].path), manifest.resolve(manifest.shards[0].path))
    ds = ShardDataset(manifest, mode="exact", on_error="skip")
    keys = [s["__key__"] for s in ds]
    assert sorted(keys) == [f"s000_{i:05d}" for i in range(5)] + [f"s001_{i:05d}" for i in range(3)]
    assert ds.num_skipped == 1


def _die(sample):
    os._exit(3)  # a worker process that dies without raising


def test_a_worker_that_dies_is_reported_not_waited_for(make_shards):
    manifest = make_shards([4, 4])
    loader = torch.utils.data.DataLoader(ShardDataset(manifest, mode="exact", map=_die), batch_size=None, num_workers=2)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(loader)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_samples_carry_their_shard_and_index_through_recovery(make_shards, fault):
    from shardkit.read.pieces import PieceReader
    from shardkit.world import World

    manifest, _ = _broken_dataset(make_shards, fault)
    ds = ShardDataset(manifest, mode="exact", on_error="skip")
    reader = PieceReader(
        ds.catalog, on_error="skip", on_skip=lambda exc: None, options=ds.source_options, read_ahead_bytes=1 << 20
    )
    located = list(reader.read(ds.plan.pieces(World(), epoch=0)))
    assert located
    for shard, index, raw in located:
        assert raw.key == f"s{shard:03d}_{index:05d}"
