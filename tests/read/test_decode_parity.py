"""decode= against webdataset's own decoder, on shards webdataset wrote.

Every field type of webdataset's default table is written with
``webdataset.ShardWriter`` (its encoders, including ``.gz`` members), then
the shards are read twice: with ``webdataset.WebDataset(...).decode(mode)``
and with ``shardkit.ShardDataset(..., decode=...)``. The values are compared
field by field. Where shardkit decodes differently on purpose (images keep
their stored mode, a few extra extensions), the test says so and checks the
documented relation instead of equality.
"""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit import ShardDataset

wds = pytest.importorskip("webdataset")
cbor2 = pytest.importorskip("cbor2")
msgpack = pytest.importorskip("msgpack")

pytestmark = pytest.mark.filterwarnings(
    "ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning"
)

NUM_SAMPLES = 5


def _image(rng: np.random.Generator, mode: str, height: int = 12, width: int = 10) -> Image.Image:
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)


def _encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def _sample(i: int) -> dict:
    """One sample holding every type of webdataset's table, as webdataset writes them."""
    rng = np.random.default_rng(i)
    rgb = _image(rng, "RGB")
    return {
        "__key__": f"sample{i:03d}",
        # Images: webdataset encodes PIL images for png / jpg / ppm / pgm / tiff;
        # other formats go in as bytes.
        "png": rgb,
        "jpg": rgb,
        "ppm": rgb,
        "tiff": rgb,
        "seg.png": _image(rng, "L"),  # decoded by its last extension component
        "rgba.png": _image(rng, "RGBA"),
        "gif": _encoded(rgb.convert("P"), "GIF"),
        "bmp": _encoded(rgb, "BMP"),
        "webp": _encoded(rgb, "WEBP") if i % 2 else _encoded(rgb, "PNG"),  # the bytes decide, not the name
        # Text and labels.
        "txt": f"caption {i} \u00e9",
        "input.txt": f"prompt {i}",
        "transcript": f"said {i}",
        "txt.gz": f"compressed caption {i} " * 20,
        "cls": i,
        "cls2": 100 + i,
        "index": 1000 + i,
        "inx": i * 7,
        "id": 555 + i,
        # Structured.
        "json": {"i": i, "tags": ["a", "b"], "score": 0.25 * i},
        "jsn": [i, None, True],
        "json.gz": {"zipped": i},
        "mp": {"i": i, "name": f"n{i}", "values": [1, 2, 3]},
        "msg": [i, "x"],
        "cbor": {"i": i, "blob": b"\x00\x01", "nested": {"f": 1.5}},
        # Arrays.
        "npy": rng.standard_normal((3, 4)).astype(np.float32),
        "npy.gz": np.arange(i + 50, dtype=np.int64),
        "npz": {"a": np.arange(6, dtype=np.int16).reshape(2, 3) + i, "b": rng.random(4)},
        "ten": [rng.standard_normal((2, 5)).astype(np.float32), np.arange(7, dtype=np.int64) * i],
        # Not in the table: bytes both ways.
        "bin": bytes([i, 255, 0]),
        "html": f"<p>{i}</p>",
    }


@pytest.fixture(scope="module")
def wds_shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two shards written by webdataset's ShardWriter; returns a brace pattern."""
    root = tmp_path_factory.mktemp("wds")
    pattern = str(root / "parity-%06d.tar")
    with pytest.MonkeyPatch.context() as mp:
        # webdataset writes and reads CBOR with the old `cbor` package (last
        # released 2016); cbor2 has the same loads/dumps and stands in for it.
        mp.setitem(sys.modules, "cbor", cbor2)
        with wds.ShardWriter(pattern, maxcount=3, verbose=0) as sink:
            for i in range(NUM_SAMPLES):
                sink.write(_sample(i))
    assert sorted(os.listdir(root)) == ["parity-000000.tar", "parity-000001.tar"]
    return str(root / "parity-{000000..000001}.tar")


def _read_webdataset(pattern: str, mode: str) -> dict[str, dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "cbor", cbor2)
        dataset = wds.WebDataset(pattern, shardshuffle=False, empty_check=False).decode(mode)
        return {s["__key__"]: s for s in dataset}


def _read_shardkit(pattern: str, decode: str) -> dict[str, dict]:
    return {s["__key__"]: s for s in ShardDataset(pattern, mode="exact", shuffle=False, decode=decode)}


def _assert_same_value(ours: object, theirs: object, where: str) -> None:
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), where
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        np.testing.assert_array_equal(ours, theirs, err_msg=where)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), where
        for k in theirs:
            _assert_same_value(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), where
        for n, (a, b) in enumerate(zip(ours, theirs)):
            _assert_same_value(a, b, f"{where}[{n}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, where


NON_IMAGE_FIELDS = [
    "txt", "input.txt", "transcript", "txt.gz", "cls", "cls2", "index", "inx", "id", "json", "jsn", "json.gz",
    "mp", "msg", "cbor", "npy", "npy.gz", "npz", "ten", "bin", "html",
]  # fmt: skip
IMAGE_FIELDS = ["png", "jpg", "ppm", "tiff", "seg.png", "rgba.png", "gif", "bmp", "webp"]


@pytest.mark.parametrize("ours_mode, their_mode", [("pil", "pil"), ("tensor", "torchrgb8")])
def test_every_non_image_type_decodes_as_webdataset_does(wds_shards, ours_mode, their_mode):
    ours = _read_shardkit(wds_shards, ours_mode)
    theirs = _read_webdataset(wds_shards, their_mode)
    assert sorted(ours) == sorted(theirs) == [f"sample{i:03d}" for i in range(NUM_SAMPLES)]
    for key, sample in theirs.items():
        assert set(ours[key]) == {k for k in sample if not k.startswith("__")} | {"__key__"}
        for field in NON_IMAGE_FIELDS:
            _assert_same_value(ours[key][field], sample[field], f"{key}.{field}")
    # The values are the ones written, not just the same on both sides.
    first = ours["sample001"]
    assert first["txt.gz"] == "compressed caption 1 " * 20 and first["cls"] == 1 and first["json.gz"] == {"zipped": 1}
    assert first["cbor"] == {"i": 1, "blob": b"\x00\x01", "nested": {"f": 1.5}} and first["msg"] == [1, "x"]
    np.testing.assert_array_equal(first["npy.gz"], np.arange(51))


def _image_pairs(pattern: str, ours_mode: str, their_mode: str) -> list[tuple[str, object, object]]:
    """(``key.field``, shardkit's value, webdataset's value) for every image field."""
    ours = _read_shardkit(pattern, ours_mode)
    theirs = _read_webdataset(pattern, their_mode)
    assert sorted(ours) == sorted(theirs)
    return [(f"{key}.{field}", ours[key][field], theirs[key][field]) for key in theirs for field in IMAGE_FIELDS]


def test_pil_images_match_webdataset_pil_pixel_for_pixel(wds_shards):
    for where, mine, other in _image_pairs(wds_shards, "pil", "pil"):
        assert isinstance(mine, Image.Image) and isinstance(other, Image.Image), where
        # webdataset's "pil" converts every image to RGB; shardkit keeps the
        # stored mode (L stays L, RGBA keeps alpha, GIF stays a palette).
        expected_mode = {"seg.png": "L", "rgba.png": "RGBA", "gif": "P"}.get(where.split(".", 1)[1], "RGB")
        assert mine.mode == expected_mode, where
        np.testing.assert_array_equal(np.asarray(mine.convert("RGB")), np.asarray(other), err_msg=where)


def test_tensor_images_match_webdataset_torchrgb8(wds_shards):
    for where, mine, other in _image_pairs(wds_shards, "tensor", "torchrgb8"):
        assert isinstance(mine, torch.Tensor) and isinstance(other, torch.Tensor), where
        assert mine.dtype == other.dtype == torch.uint8, where
        # Channels as stored: 1 for grayscale, 4 with alpha (webdataset's
        # torchrgb8 always gives 3).
        channels = {"seg.png": 1, "rgba.png": 4}.get(where.split(".", 1)[1], 3)
        assert mine.shape == (channels, *other.shape[1:]), where
        as_rgb = mine.expand(3, -1, -1) if channels == 1 else mine[:3]
        if where.endswith(".jpg"):
            # torchvision's and PIL's JPEG decoders may round a few pixels
            # differently across versions; the images agree to +-2.
            assert (as_rgb.int() - other.int()).abs().max() <= 2, where
        else:
            assert torch.equal(as_rgb, other), where
