"""ShardDataset end to end on real shards: split, order, epochs, options."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit import ShardDataset, ShardWriter
from shardkit.errors import ManifestError, UsageError
from shardkit.read.decode import Decoder
from shardkit.world import World
from tests.conftest import sample_payload


def _slot_keys(ds: ShardDataset, world_size: int, num_workers: int, epoch: int = 0) -> dict[tuple[int, int], list[str]]:
    out = {}
    for rank in range(world_size):
        for worker in range(num_workers):
            world = World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
            out[rank, worker] = [s["__key__"] for s in ds.iter_slot(world, epoch=epoch)]
    return out


def _all_keys(manifest) -> list[str]:
    return sorted(f"s{i:03d}_{j:05d}" for i, s in enumerate(manifest.shards) for j in range(s.num_samples))


def test_samples_are_dicts_of_raw_bytes_with_the_written_content(make_shards):
    make_shards([3, 2], payload_bytes=700)
    samples = list(ShardDataset(os.path.dirname(make_shards([3, 2], name="b", payload_bytes=700).resolve("x")), mode="exact"))
    assert len(samples) == 5
    for sample in samples:
        assert set(sample) == {"__key__", "bin", "cls", "json"}
        assert sample["bin"] == sample_payload(sample["__key__"], 700)
        assert isinstance(sample["cls"], bytes)


@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (3, 2), (4, 2)])
def test_exact_split_covers_every_sample_once_even_with_fewer_shards_than_slots(make_shards, world_size, num_workers):
    manifest = make_shards([9, 0, 4])
    ds = ShardDataset(manifest, mode="exact", seed=3)
    slots = _slot_keys(ds, world_size, num_workers)
    keys = [k for v in slots.values() for k in v]
    assert sorted(keys) == _all_keys(manifest)
    per_rank = [sum(len(slots[r, w]) for w in range(num_workers)) for r in range(world_size)]
    assert max(per_rank) - min(per_rank) <= 1


def test_balanced_gives_every_rank_the_same_count_and_pad_repeats(make_shards):
    manifest = make_shards([5, 4])  # 9 samples, 4 ranks x 2 workers
    dropped = ShardDataset(manifest, mode="balanced")
    per_rank = [sum(len(v) for (r, _), v in _slot_keys(dropped, 4, 2).items() if r == rank) for rank in range(4)]
    assert per_rank == [2, 2, 2, 2]
    padded = ShardDataset(manifest, mode="balanced", pad=True)
    slots = _slot_keys(padded, 4, 2)
    per_rank = [sum(len(v) for (r, _), v in slots.items() if r == rank) for rank in range(4)]
    assert per_rank == [3, 3, 3, 3]
    assert set(k for v in slots.values() for k in v) == set(_all_keys(manifest))


def test_same_seed_same_sequence_other_epoch_other_sequence(make_shards):
    manifest = make_shards([20, 7, 13, 0, 11])
    first = _slot_keys(ShardDataset(manifest, seed=11, buffer_size=8), 2, 2)
    again = _slot_keys(ShardDataset(manifest, seed=11, buffer_size=8), 2, 2)
    other_epoch = _slot_keys(ShardDataset(manifest, seed=11, buffer_size=8), 2, 2, epoch=1)
    assert first == again
    assert first != other_epoch


def test_slot_starting_inside_a_shard_reads_none_of_the_skipped_bytes(make_shards):
    manifest = make_shards([10], payload_bytes=100)
    path = manifest.resolve(manifest.shards[0].path)
    with open(path, "r+b") as f:  # wreck sample 0: only a reader that parses it would notice
        f.write(b"\xff" * 600)
    ds = ShardDataset(manifest, mode="exact", shuffle=False)
    late = World(rank=1, world_size=2)
    assert [s["__key__"] for s in ds.iter_slot(late, epoch=0)] == [f"s000_{i:05d}" for i in range(5, 10)]


def _round_robin(*streams: list[str]) -> list[str]:
    out = []
    for i in range(max(len(s) for s in streams)):
        out += [s[i] for s in streams if i < len(s)]
    return out


def test_set_epoch_reaches_persistent_dataloader_workers(make_shards):
    manifest = make_shards([6, 5, 0, 7])
    ds = ShardDataset(manifest, mode="exact", seed=2, buffer_size=4)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    seen = {}
    for epoch in (0, 1, 0):
        ds.set_epoch(epoch)
        keys = [s["__key__"] for s in loader]
        expected = _slot_keys(ds, 1, 2, epoch=epoch)
        assert keys == _round_robin(expected[0, 0], expected[0, 1])
        assert sorted(keys) == _all_keys(manifest)
        seen.setdefault(epoch, keys)
        assert seen[epoch] == keys
    assert seen[0] != seen[1]


def test_infinite_mode_runs_past_one_epoch_with_fresh_orders(make_shards):
    manifest = make_shards([4, 3, 2, 5])
    ds = ShardDataset(manifest, mode="infinite", buffer_size=0)
    stream = iter(ds)
    laps = [[next(stream)["__key__"] for _ in range(14)] for _ in range(4)]
    assert all(sorted(lap) == _all_keys(manifest) for lap in laps)
    assert len({tuple(lap) for lap in laps}) > 1
    with pytest.raises(TypeError):
        len(ds)


@pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning")
def test_decoders_by_extension(tmp_path):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 6, 3), dtype=np.uint8))
    png = io.BytesIO()
    image.save(png, format="PNG")
    npy = io.BytesIO()
    np.save(npy, np.arange(3))
    with ShardWriter(str(tmp_path / "d"), max_samples=10) as writer:
        writer.write({"__key__": "a", "png": png.getvalue(), "cls": b"7", "txt": b"hi", "json": b'{"x": 1}', "npy": npy.getvalue(), "raw": b"\x00"})
    as_pil = next(iter(ShardDataset(str(tmp_path / "d"), mode="exact", decode="pil")))
    assert as_pil["png"].size == (6, 8) and as_pil["cls"] == 7 and as_pil["txt"] == "hi"
    assert as_pil["json"] == {"x": 1} and as_pil["npy"].tolist() == [0, 1, 2] and as_pil["raw"] == b"\x00"
    as_tensor = next(iter(ShardDataset(str(tmp_path / "d"), mode="exact", decode="tensor")))
    assert as_tensor["png"].dtype == torch.uint8 and tuple(as_tensor["png"].shape) == (3, 8, 6)
    assert torch.equal(as_tensor["png"].permute(1, 2, 0), torch.from_numpy(np.array(image)))


def test_pickle_fields_need_explicit_consent(tmp_path):
    import pickle

    with ShardWriter(str(tmp_path / "p"), max_samples=10) as writer:
        writer.write({"__key__": "a", "pkl": pickle.dumps({"k": 1})})
    with pytest.raises(UsageError, match="allow_pickle=True"):
        next(iter(ShardDataset(str(tmp_path / "p"), mode="exact", decode="pil")))
    sample = next(iter(ShardDataset(str(tmp_path / "p"), mode="exact", decode=Decoder(allow_pickle=True))))
    assert sample["pkl"] == {"k": 1}


def test_map_and_in_worker_batching(make_shards):
    manifest = make_shards([5, 4])
    ds = ShardDataset(
        manifest,
        mode="exact",
        decode="pil",
        map=lambda s: {"label": s["cls"], "i": s["json"]["i"]},
        batch_size=4,
    )
    batches = list(ds)
    assert [len(b["label"]) for b in batches] == [4, 4, 1]
    assert batches[0]["label"].dtype == torch.int64
    dropped = ShardDataset(manifest, mode="exact", batch_size=4, partial_batches=False)
    assert [len(b["__key__"]) for b in dropped] == [4, 4]


def test_brace_pattern_and_shard_list_sources(make_shards):
    manifest = make_shards([3, 2, 4])
    pattern = os.path.join(manifest.location, "shard-{000000..000002}.tar")
    from_pattern = ShardDataset(pattern, mode="exact")
    assert from_pattern.catalog.counts is not None  # counts came from the .idx sidecars
    assert sorted(s["__key__"] for s in from_pattern) == _all_keys(manifest)
    listed = [manifest.resolve(s.path) for s in manifest.shards]
    assert sorted(s["__key__"] for s in ShardDataset(listed, mode="balanced")) == _all_keys(manifest)


def test_shard_list_without_indexes_works_at_shard_granularity(make_shards):
    manifest = make_shards([3, 2, 4])
    for shard in manifest.shards:
        os.remove(manifest.resolve(shard.index))
    listed = [manifest.resolve(s.path) for s in manifest.shards]
    ds = ShardDataset(listed, mode="exact")
    assert ds.catalog.counts is None and ds.num_samples is None
    slots = _slot_keys(ds, 2, 2)
    assert sorted(k for v in slots.values() for k in v) == _all_keys(manifest)
    with pytest.raises(UsageError, match="balanced' needs per-shard sample counts"):
        ShardDataset(listed)


def test_webdataset_tarwriter_shards_read_without_manifest(tmp_path):
    import webdataset as wds

    expected = {}
    paths = []
    for shard in range(3):
        path = str(tmp_path / f"wds-{shard}.tar")
        paths.append(path)
        with wds.TarWriter(path) as sink:
            for i in range(4 + shard):
                key = f"dir/sample{shard}_{i}"
                fields = {"txt": f"text {shard} {i}", "cls": shard * 10 + i, "json": {"i": i}}
                sink.write({"__key__": key, **fields})
                expected[key] = fields
    ds = ShardDataset(os.path.join(str(tmp_path), "wds-{0..2}.tar"), mode="exact", decode="pil")
    got = {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in ds}
    assert got == expected


def test_invalid_options_are_refused(make_shards, tmp_path):
    manifest = make_shards([3])
    with pytest.raises(UsageError, match="mode must be one of"):
        ShardDataset(manifest, mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="on_error"):
        ShardDataset(manifest, on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="pad=True applies"):
        ShardDataset(manifest, mode="exact", pad=True)
    with pytest.raises(UsageError, match="both rank= and world_size="):
        ShardDataset(manifest, rank=1)
    with pytest.raises(UsageError, match="rank 3 is not within world_size 2"):
        ShardDataset(manifest, rank=3, world_size=2)
    with pytest.raises(ManifestError, match="no such shard, manifest or dataset directory"):
        ShardDataset(str(tmp_path / "nothing"))
    with pytest.raises(UsageError, match="infinite' needs at least one sample per slot and read part"):
        next(iter(ShardDataset(manifest, mode="infinite", rank=0, world_size=4)))


def test_rank_and_world_size_come_from_torchrun_environment(make_shards, monkeypatch):
    manifest = make_shards([6])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = ShardDataset(manifest, mode="exact")
    assert (ds.world.rank, ds.world.world_size) == (1, 3)
    assert len(ds) == 2 and len(list(ds)) == 2


def test_json_metadata_survives(make_shards):
    manifest = make_shards([2])
    sample = next(iter(ShardDataset(manifest, mode="exact", shuffle=False)))
    assert json.loads(sample["json"]) == {"shard": 0, "i": 0}


@pytest.mark.parametrize("interleave", [2, 3])
def test_interleave_mixes_streams_and_keeps_exact_coverage(make_shards, interleave):
    manifest = make_shards([10, 0, 7, 9])
    plain = _slot_keys(ShardDataset(manifest, mode="exact", buffer_size=0), 2, 2)
    mixed_ds = ShardDataset(manifest, mode="exact", buffer_size=0, interleave=interleave)
    mixed = _slot_keys(mixed_ds, 2, 2)
    for slot, keys in mixed.items():
        assert sorted(keys) == sorted(plain[slot])  # same share, other order
    assert mixed != plain
    assert mixed == _slot_keys(mixed_ds, 2, 2)  # deterministic
    first = next(iter(mixed_ds))["__key__"]
    assert first == next(iter(mixed_ds))["__key__"]


@pytest.mark.parametrize("chunk_bytes", [1000, 7000, 1 << 20])
def test_any_read_size_gives_the_same_samples(make_shards, chunk_bytes):
    from shardkit.io.base import SourceOptions

    manifest = make_shards([9, 4, 0, 6], payload_bytes=1500)
    ds = ShardDataset(manifest, mode="exact", shuffle=False, source_options=SourceOptions(chunk_bytes=chunk_bytes))
    keys = _slot_keys(ds, 2, 2)
    assert keys == _slot_keys(ShardDataset(manifest, mode="exact", shuffle=False), 2, 2)
    for sample in ds.iter_slot(World(rank=1, world_size=2), epoch=0):
        assert sample["bin"] == sample_payload(sample["__key__"], 1500)


def test_stopping_early_stops_the_read_ahead_threads(make_shards):
    import gc
    import threading

    manifest = make_shards([50, 50, 50], payload_bytes=4000)
    stream = iter(ShardDataset(manifest, mode="exact", buffer_size=10, interleave=2, read_ahead_bytes=20_000))
    assert [next(stream) for _ in range(3)]
    assert any(t.name == "shardkit-read-ahead" for t in threading.enumerate())
    del stream
    gc.collect()
    assert not any(t.name == "shardkit-read-ahead" and t.is_alive() for t in threading.enumerate())


def test_pax_member_names_long_and_non_ascii_keys(tmp_path):
    keys = ["dir/" + "x" * 180 + "_0", "ключ_1", "plain_2"]
    with ShardWriter(str(tmp_path / "pax"), max_samples=10) as writer:
        for key in keys:
            writer.write({"__key__": key, "txt": key.encode(), "cls": b"1"})
    samples = list(ShardDataset(str(tmp_path / "pax"), mode="exact", shuffle=False, decode="pil"))
    assert [s["__key__"] for s in samples] == keys
    assert [s["txt"] for s in samples] == keys


@pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning")
def test_map_runs_torchvision_v2_transforms_on_decoded_images(tmp_path):
    from torchvision.transforms import v2

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8))
    jpg = io.BytesIO()
    image.save(jpg, format="JPEG")
    with ShardWriter(str(tmp_path / "img"), max_samples=10) as writer:
        for i in range(3):
            writer.write({"__key__": f"k{i}", "jpg": jpg.getvalue(), "cls": str(i).encode()})
    transform = v2.Compose([v2.Resize((8, 8), antialias=True), v2.ToDtype(torch.float32, scale=True)])
    ds = ShardDataset(
        str(tmp_path / "img"), mode="exact", decode="tensor", map=lambda s: (transform(s["jpg"]), s["cls"]), batch_size=3
    )
    images, labels = next(iter(ds))
    assert tuple(images.shape) == (3, 3, 8, 8) and images.dtype == torch.float32
    assert sorted(labels.tolist()) == [0, 1, 2]


def test_buffer_byte_cap_limits_how_far_samples_move(make_shards):
    manifest = make_shards([40], payload_bytes=1000)  # 3584 bytes per stored sample
    capped = [s["__key__"] for s in ShardDataset(manifest, mode="exact", buffer_size=1000, buffer_bytes=4 * 3584)]
    positions = [int(k.split("_")[1]) for k in capped]
    assert sorted(positions) == list(range(40))
    # With room for 4 samples, a sample leaves at most 3 places early.
    assert all(out >= pos - 3 for out, pos in zip(range(40), positions))


def test_a_pickled_dataset_yields_the_same_samples(make_shards):
    import copy
    import pickle

    manifest = make_shards([6, 0, 5, 4])
    ds = ShardDataset(manifest, mode="exact", seed=9, buffer_size=4, interleave=2, epoch=3, decode="pil")
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.epoch == 3 and clone.options == ds.options
    assert [s["__key__"] for s in clone] == [s["__key__"] for s in ds]
    # A copy has counters of its own: setting its epoch leaves the original's alone.
    deep = copy.deepcopy(ds)
    deep.set_epoch(5)
    assert (ds.epoch, deep.epoch) == (3, 5)


def test_a_pickled_dataset_keeps_a_loaded_state(make_shards):
    import itertools
    import pickle

    manifest = make_shards([6, 5, 4])
    ds = ShardDataset(manifest, mode="exact", seed=2, buffer_size=3)
    head = [s["__key__"] for s in itertools.islice(iter(ds), 4)]
    state = ds.state_dict()
    fresh = ShardDataset(manifest, mode="exact", seed=2, buffer_size=3)
    fresh.load_state_dict(state)
    rest = [s["__key__"] for s in pickle.loads(pickle.dumps(fresh))]
    assert head + rest == [s["__key__"] for s in ShardDataset(manifest, mode="exact", seed=2, buffer_size=3)]
