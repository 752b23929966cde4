"""A field that does not decode (a broken image, a label that is no
number) is a data fault like a corrupt sample: raised naming field, sample
and shard, or under on_error="skip" logged, counted and left out."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader

from shardkit import IndexedDataset, ShardDataset, UsageError, make_loader
from shardkit.format.manifest import Manifest
from shardkit.write.destination import shard_name
from shardkit.write.publish import publish_manifest
from shardkit.write.shard import ShardFile

SIZES = (6, 5)
BROKEN = {"s000_00002": "png", "s001_00004": "cls"}  # the field each broken sample gets wrong


def _png(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (3, 2), (value, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def _keys() -> list[str]:
    return [f"s{s:03d}_{i:05d}" for s, n in enumerate(SIZES) for i in range(n)]


@pytest.fixture
def dataset(tmp_path) -> str:
    """Samples of a PNG and a label; the BROKEN ones carry bytes that are no
    PNG, or a label that is no number."""
    dest = str(tmp_path / "ds")
    os.makedirs(dest)
    entries = []
    for s, count in enumerate(SIZES):
        with ShardFile(os.path.join(dest, shard_name(s))) as shard:
            for i in range(count):
                key = f"s{s:03d}_{i:05d}"
                png = b"not an image" if BROKEN.get(key) == "png" else _png(i)
                cls = b"seven" if BROKEN.get(key) == "cls" else str(i).encode()
                shard.add(key, [("cls", cls), ("png", png)])
            entries.append(shard.commit().entry())
    publish_manifest(dest, Manifest(shards=tuple(entries), extensions=("cls", "png"), source={"format": "python"}, location=dest))
    return dest


def test_raise_names_the_field_the_sample_and_the_shard(dataset):
    with pytest.raises(UnidentifiedImageError) as info:
        list(ShardDataset(dataset, mode="exact", shuffle=False, decode="pil"))
    (note,) = info.value.__notes__
    assert note == f"while decoding field 'png' of sample 's000_00002' in {os.path.join(dataset, shard_name(0))}"


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_leaves_out_exactly_the_samples_that_do_not_decode_and_counts_them(dataset, workers, caplog):
    ds = ShardDataset(dataset, mode="exact", seed=3, decode="pil", on_error="skip")
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    samples = list(loader)
    assert sorted(s["__key__"] for s in samples) == sorted(set(_keys()) - set(BROKEN))
    assert all(isinstance(s["png"], Image.Image) and isinstance(s["cls"], int) for s in samples)
    assert ds.num_skipped == len(BROKEN)
    if workers == 0:  # the warnings of worker processes do not reach caplog
        skipped = [r.getMessage() for r in caplog.records if "skipping sample" in r.getMessage()]
        assert len(skipped) == 2 and any("'s000_00002'" in m and shard_name(0) in m for m in skipped)


@pytest.mark.parametrize("cut", [2, 5, 8])
def test_a_checkpoint_after_a_skipped_field_resumes_where_the_run_was(dataset, cut):
    def loader():
        ds = ShardDataset(dataset, mode="exact", seed=5, decode="pil", on_error="skip")
        return make_loader(ds, num_workers=2, in_order=True)

    whole = [s["__key__"] for s in loader()]
    assert sorted(whole) == sorted(set(_keys()) - set(BROKEN))
    first = loader()
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(cut)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [s["__key__"] for s in resumed] == whole


def test_indexed_dataset_returns_none_for_a_sample_that_does_not_decode(dataset):
    ds = IndexedDataset(dataset, decode="pil", on_error="skip")
    keys = _keys()
    got = [ds[i] for i in range(len(ds))]
    assert [g is None for g in got] == [k in BROKEN for k in keys]
    assert ds.num_skipped == len(BROKEN)
    with pytest.raises(ValueError, match="invalid literal for int"):
        IndexedDataset(dataset, decode="pil")[keys.index("s001_00004")]


def test_a_setting_that_forbids_a_field_is_not_skipped(tmp_path):
    dest = str(tmp_path / "p")
    os.makedirs(dest)
    with ShardFile(os.path.join(dest, shard_name(0))) as shard:
        shard.add("k0", [("pickle", b"\x80\x04K\x01.")])
        entry = shard.commit().entry()
    publish_manifest(dest, Manifest(shards=(entry,), extensions=("pickle",), source={"format": "python"}, location=dest))
    with pytest.raises(UsageError, match="pickle"):
        list(ShardDataset(dest, mode="exact", decode="pil", on_error="skip"))
