"""A new user's first mistakes each get a message that says what, where and
what to do."""

from __future__ import annotations

import io
import os

import fsspec
import pytest
import torch
from PIL import Image

import shardkit
from shardkit.errors import InputFileError, ManifestError, UsageError
from shardkit.format.manifest import MANIFEST_NAME
from tests.conftest import build_dataset


def test_a_brace_pattern_naming_a_missing_shard_is_a_shardkit_error_naming_it(make_shards):
    manifest = make_shards([3, 3])
    pattern = os.path.join(manifest.location, "shard-{000000..000003}.tar")
    with pytest.raises(InputFileError, match=r"shard-000002.tar: no such shard \(and 1 more of the 4") as info:
        shardkit.ShardDataset(pattern, mode="exact")
    assert isinstance(info.value, OSError) and info.value.path.endswith("shard-000002.tar")


def test_a_folder_without_manifest_points_to_shardkit_index(tmp_path):
    build_dataset(str(tmp_path / "shards"), [3], with_manifest=False)
    with pytest.raises(ManifestError, match=f"`shardkit index {tmp_path / 'shards'}`"):
        shardkit.ShardDataset(str(tmp_path / "shards"))
    shard = str(tmp_path / "shards" / "shard-000000.tar")
    os.remove(shard.replace(".tar", ".idx"))
    with pytest.raises(UsageError, match=r"`shardkit index SOURCE`"):
        shardkit.ShardDataset([shard])  # balanced mode needs counts
    with pytest.raises(UsageError, match=r"`shardkit index SOURCE`"):
        shardkit.IndexedDataset([shard])


@pytest.mark.parametrize("slash", ["", "/"])
def test_an_fsspec_folder_url_finds_its_manifest_with_or_without_trailing_slash(tmp_path, slash):
    local = build_dataset(str(tmp_path / "ds"), [4, 3])
    fs = fsspec.filesystem("memory")
    for name in os.listdir(local.location):
        with open(os.path.join(local.location, name), "rb") as f:
            fs.pipe(f"/first-contact{slash or '-noslash'}/ds/{name}", f.read())
    url = f"memory://first-contact{slash or '-noslash'}/ds{slash}"
    assert fs.exists(f"/first-contact{slash or '-noslash'}/ds/{MANIFEST_NAME}")
    ds = shardkit.ShardDataset(url, mode="balanced", shuffle=False)
    assert len(ds) == 7 and len(list(ds)) == 7


def _jpeg(side: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (10, 20, 30)).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture
def images(tmp_path):
    """A dataset of JPEGs of two sizes."""
    dest = str(tmp_path / "img")
    with shardkit.ShardWriter(dest, max_samples=10) as writer:
        for i in range(6):
            writer.write({"__key__": f"k{i}", "jpg": _jpeg(8 + 4 * (i % 2)), "cls": str(i).encode()})
    return dest


def test_every_ragged_batch_gets_the_same_clear_error(images):
    ds = shardkit.ShardDataset(images, mode="exact", shuffle=False, decode="pil", batch_size=4)
    with pytest.raises(UsageError, match=r"cannot batch field 'jpg': it holds PIL images \(sample 'k0': \(8, 8\)\)"):
        next(iter(ds))
    tensors = shardkit.IndexedDataset(images, decode="tensor")
    loader = torch.utils.data.DataLoader(tensors, batch_size=4, collate_fn=shardkit.IndexedDataset.collate)
    with pytest.raises(UsageError, match=r"cannot batch field 'jpg': its tensors differ in shape, \(3, 8, 8\)"):
        next(iter(loader))
    pil = shardkit.IndexedDataset(images, decode="pil")
    with pytest.raises(UsageError, match="it holds PIL images"):
        shardkit.IndexedDataset.collate([pil[0], pil[1]])
