"""shardkit.transforms: fused decode + crop against torchvision's decode-then-crop.

Photo-like JPEGs come from tools/gen_photos.py (a few of each preset, so the
file stays fast); torchvision's own decoder and ``resized_crop`` give the
reference for the same box.
"""

from __future__ import annotations

import importlib.util
import io
import math
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

import shardkit
from shardkit.errors import UsageError
from shardkit.transforms import (
    DecodeRandomResizedCrop,
    DecodeResizeCenterCrop,
    MapField,
    image_size,
    random_resized_crop_box,
)

ROOT = Path(__file__).resolve().parents[1]
# torchvision.io is the reference decoder here; its deprecation notice is not news to these tests.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


def _gen_photos():
    spec = importlib.util.spec_from_file_location("_gen_photos", ROOT / "tools" / "gen_photos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def photos() -> dict[str, list[bytes]]:
    gen = _gen_photos()
    return {"imagenet": gen.photo_jpegs("imagenet", 20, seed=3), "highres": gen.photo_jpegs("highres", 12, seed=3)}


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = ((a.float() - b.float()) ** 2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def reference_decode(data: bytes) -> torch.Tensor:
    return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def pil_reference(data: bytes) -> torch.Tensor:
    return TF.pil_to_tensor(Image.open(io.BytesIO(data)).convert("RGB"))


# -- boxes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(375, 500), (1200, 1600), (500, 333), (64, 2000), (2000, 40)])
def test_boxes_equal_torchvision_get_params_for_the_same_seed(size):
    height, width = size
    image = torch.empty((3, height, width), dtype=torch.uint8)
    for seed in range(60):
        torch.manual_seed(seed)
        ours = random_resized_crop_box(height, width)
        torch.manual_seed(seed)
        theirs = T1.RandomResizedCrop.get_params(image, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3])
        assert ours == tuple(theirs)


def test_boxes_equal_torchvision_in_the_fallback_branch():
    # A very wide image with a large minimum area never fits in ten tries.
    image = torch.empty((3, 50, 1000), dtype=torch.uint8)
    torch.manual_seed(0)
    ours = random_resized_crop_box(50, 1000, scale=(0.9, 1.0))
    torch.manual_seed(0)
    assert ours == tuple(T1.RandomResizedCrop.get_params(image, scale=[0.9, 1.0], ratio=[3 / 4, 4 / 3]))
    assert ours == (0, (1000 - 67) // 2, 50, 67)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def test_box_distribution_matches_torchvision_v2_two_sample_ks():
    sizes = [(375, 500), (500, 375), (1200, 1600), (333, 500), (600, 180)]
    n = 3000
    torch.manual_seed(1)
    ours = [random_resized_crop_box(*sizes[i % len(sizes)]) + sizes[i % len(sizes)] for i in range(n)]
    torch.manual_seed(2)
    crop = T2.RandomResizedCrop(224)
    theirs = []
    for i in range(n):
        h_img, w_img = sizes[i % len(sizes)]
        params = crop.make_params([torch.empty((3, h_img, w_img), dtype=torch.uint8)])
        theirs.append((params["top"], params["left"], params["height"], params["width"], h_img, w_img))
    # 0.1% critical value of the two-sample KS statistic: c(alpha) * sqrt((n + m) / (n m)).
    critical = math.sqrt(-math.log(0.001 / 2) / 2) * math.sqrt(2 / n)
    for name, feature in {
        "area fraction": lambda b: b[2] * b[3] / (b[4] * b[5]),
        "aspect": lambda b: b[3] / b[2],
        "centre row": lambda b: (b[0] + b[2] / 2) / b[4],
    }.items():
        d = ks_statistic(np.array([feature(b) for b in ours]), np.array([feature(b) for b in theirs]))
        assert d < critical, f"{name}: KS statistic {d:.4f} >= {critical:.4f}"


# -- quality -------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["imagenet", "highres"])
def test_train_crop_within_30_db_of_torchvision_for_the_same_box(photos, preset):
    crop = DecodeRandomResizedCrop(224)
    torch.manual_seed(0)
    values = []
    for data in photos[preset]:
        height, width = image_size(data)
        box = random_resized_crop_box(height, width)
        expected = TF.resized_crop(reference_decode(data), *box, [224, 224], antialias=True)
        values.append(psnr(crop(data, box=box), expected))
    assert min(values) >= 30, values


@pytest.mark.parametrize("preset", ["imagenet", "highres"])
def test_eval_crop_within_30_db_of_torchvision_resize_center_crop(photos, preset):
    fused = DecodeResizeCenterCrop(224)
    assert fused.resize == 256
    reference = T2.Compose([T2.Resize(256, antialias=True), T2.CenterCrop(224)])
    values = [psnr(fused(data), reference(reference_decode(data))) for data in photos[preset]]
    assert min(values) >= 30, values


def test_random_call_draws_box_then_flip_like_torchvision(photos):
    data = photos["imagenet"][0]
    crop = DecodeRandomResizedCrop(224)
    height, width = image_size(data)
    flipped = 0
    for seed in range(8):
        torch.manual_seed(seed)
        got = crop(data)
        torch.manual_seed(seed)
        box = T1.RandomResizedCrop.get_params(torch.empty((3, height, width)), [0.08, 1.0], [3 / 4, 4 / 3])
        flip = bool(torch.rand(1) < 0.5)
        expected = crop(data, box=box)
        flipped += flip
        assert torch.equal(got, expected.flip(-1) if flip else expected)
    assert 0 < flipped < 8


def test_no_flip_option_draws_no_flip(photos):
    data = photos["imagenet"][1]
    torch.manual_seed(5)
    got = DecodeRandomResizedCrop(224, flip=False)(data)
    torch.manual_seed(5)
    box = random_resized_crop_box(*image_size(data))
    assert torch.equal(got, DecodeRandomResizedCrop(224)(data, box=box))


# -- formats and fallbacks -----------------------------------------------------------------------


def _pattern(mode: str, size=(300, 200)) -> Image.Image:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, size=(size[1] // 10, size[0] // 10, 3), dtype=np.uint8), "RGB")
    return rgb.resize(size, Image.Resampling.BICUBIC).convert(mode)


@pytest.mark.parametrize(
    "name, data",
    [
        ("png rgb", encoded(_pattern("RGB"), "PNG")),
        ("png rgba", encoded(_pattern("RGBA"), "PNG")),
        ("png palette", encoded(_pattern("P"), "PNG")),
        ("png grey", encoded(_pattern("L"), "PNG")),
        ("webp", encoded(_pattern("RGB"), "WEBP", quality=90)),
        ("jpeg grey", encoded(_pattern("L"), "JPEG", quality=92)),
        ("jpeg cmyk", encoded(_pattern("CMYK"), "JPEG", quality=92)),
        ("jpeg progressive", encoded(_pattern("RGB"), "JPEG", quality=92, progressive=True)),
        ("jpeg 4:4:4", encoded(_pattern("RGB"), "JPEG", quality=92, subsampling=0)),
        ("jpeg 4:2:2", encoded(_pattern("RGB"), "JPEG", quality=92, subsampling=1)),
    ],
)
def test_other_formats_decode_like_pil_rgb(name, data):
    box = (20, 30, 150, 210)
    expected = TF.resized_crop(pil_reference(data), *box, [64, 64], antialias=True)
    got = DecodeRandomResizedCrop(64)(data, box=box)
    assert got.shape == (3, 64, 64) and got.dtype == torch.uint8
    assert psnr(got, expected) >= 35, name
    eval_got = DecodeResizeCenterCrop(64, resize=80)(data)
    eval_expected = T2.Compose([T2.Resize(80, antialias=True), T2.CenterCrop(64)])(pil_reference(data))
    assert psnr(eval_got, eval_expected) >= 30, name


def test_grey_jpeg_repeats_the_channel():
    data = encoded(_pattern("L"), "JPEG", quality=92)
    got = DecodeResizeCenterCrop(32)(data)
    assert torch.equal(got[0], got[1]) and torch.equal(got[1], got[2])


def test_small_image_is_upscaled_to_the_output_size():
    data = encoded(_pattern("RGB", size=(40, 30)), "JPEG")
    torch.manual_seed(0)
    assert DecodeRandomResizedCrop(224)(data).shape == (3, 224, 224)
    assert DecodeResizeCenterCrop(224)(data).shape == (3, 224, 224)


def test_a_box_already_at_the_output_size_is_the_decoded_pixels():
    # No resize runs then: the region itself is the output (a 48-pixel image
    # cropped to 32 at full scale met this).
    image = _pattern("RGB", size=(32, 32))
    data = encoded(image, "PNG")
    pixels = TF.pil_to_tensor(image)
    whole = DecodeRandomResizedCrop(32, scale=(1.0, 1.0), ratio=(1.0, 1.0))  # the whole image, flipped or not
    torch.manual_seed(0)
    got = [whole(data) for _ in range(8)] + [DecodeResizeCenterCrop(32, resize=32)(data)]
    flipped = [torch.equal(g, pixels.flip(-1)) for g in got]
    assert all(f or torch.equal(g, pixels) for f, g in zip(flipped, got))
    assert any(flipped) and not all(flipped)
    assert all(g.stride() == (1, 32 * 3, 3) for g in got)  # channels-last, as after a resize


# -- outputs, options, pickling ------------------------------------------------------------------


def test_outputs_tensor_and_pil_with_rectangular_sizes(photos):
    data = photos["imagenet"][2]
    tensor = DecodeRandomResizedCrop((160, 192))(data)
    assert tensor.shape == (3, 160, 192) and tensor.dtype == torch.uint8
    assert tensor.stride() == (1, 192 * 3, 3)  # channels-last, as ToImage gives
    image = DecodeRandomResizedCrop((160, 192), output="pil")(data, box=(0, 0, 300, 300))
    assert image.mode == "RGB" and image.size == (192, 160)
    assert torch.equal(TF.pil_to_tensor(image), DecodeRandomResizedCrop((160, 192))(data, box=(0, 0, 300, 300)))
    assert DecodeResizeCenterCrop(224, output="pil")(data).size == (224, 224)


def test_options_are_validated():
    with pytest.raises(UsageError, match="scale"):
        DecodeRandomResizedCrop(224, scale=(1.0, 0.5))
    with pytest.raises(UsageError, match="ratio"):
        DecodeRandomResizedCrop(224, ratio=(0, 1))
    with pytest.raises(UsageError, match="output"):
        DecodeRandomResizedCrop(224, output="numpy")
    with pytest.raises(UsageError, match="resize"):
        DecodeResizeCenterCrop(224, resize=200)


def test_decoded_input_gets_a_remedy():
    with pytest.raises(UsageError, match=r"Decoder\(image=None\)"):
        DecodeRandomResizedCrop(224)(torch.zeros(3, 10, 10, dtype=torch.uint8))


def test_transforms_pickle_and_give_the_same_result(photos):
    data = photos["imagenet"][3]
    for transform in (DecodeRandomResizedCrop(224), DecodeResizeCenterCrop(224), MapField("jpg", DecodeResizeCenterCrop(224))):
        copy = pickle.loads(pickle.dumps(transform))
        torch.manual_seed(7)
        a = transform({"jpg": data}) if isinstance(transform, MapField) else transform(data)
        torch.manual_seed(7)
        b = copy({"jpg": data}) if isinstance(copy, MapField) else copy(data)
        if isinstance(a, dict):
            a, b = a["jpg"], b["jpg"]
        assert torch.equal(a, b)


def test_map_field_takes_the_first_present_name_and_names_missing_ones():
    data = encoded(_pattern("RGB"), "PNG")
    mapped = MapField(("jpg", "png"), DecodeResizeCenterCrop(32))({"__key__": "k", "png": data, "cls": 3})
    assert mapped["png"].shape == (3, 32, 32) and mapped["cls"] == 3
    with pytest.raises(KeyError, match=r"no field 'jpg'.*\['cls', 'png'\]"):
        MapField("jpg", DecodeResizeCenterCrop(32))({"__key__": "k", "png": data, "cls": 3})


# -- with the readers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def variable_shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("variable") / "shards"
    rng = np.random.default_rng(0)
    with shardkit.ShardWriter(str(root), max_samples=6, max_bytes=None) as writer:
        for i in range(24):
            width, height = (int(v) for v in rng.integers(60, 400, size=2))
            image = _pattern("RGB", size=(max(width, 10), max(height, 10)))
            writer.write({"__key__": f"{i:04d}", "jpg": encoded(image, "JPEG"), "cls": str(i % 5).encode()})
    return root


def test_as_map_on_shard_dataset_gives_fixed_size_batches_with_two_workers(variable_shards):
    dataset = shardkit.ShardDataset(
        str(variable_shards), mode="exact", shuffle=False, decode=shardkit.Decoder(image=None),
        map=MapField("jpg", DecodeRandomResizedCrop(224)),
    )  # fmt: skip
    loader = shardkit.make_loader(dataset, batch_size=5, num_workers=2)
    seen = 0
    for batch in loader:
        images = batch["jpg"]
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
        assert batch["cls"].dtype == torch.int64
        seen += len(images)
    assert seen == 24


def test_as_map_on_indexed_dataset(variable_shards):
    dataset = shardkit.IndexedDataset(
        str(variable_shards), decode=shardkit.Decoder(image=None), map=MapField("jpg", DecodeResizeCenterCrop(96))
    )
    sample = dataset[7]
    assert sample["jpg"].shape == (3, 96, 96) and sample["cls"] == 2


def test_to_tuple_rename_and_compose_port_webdataset_steps():
    from shardkit.transforms import Compose, MapField, Rename, ToTuple

    sample = {"__key__": "k", "png": b"img", "cls": 3, "txt": "t"}
    assert ToTuple("jpg;png", "cls")(dict(sample)) == (b"img", 3)
    assert Rename(image="jpg;png", label="cls")(dict(sample)) == {"__key__": "k", "image": b"img", "label": 3, "txt": "t"}
    assert Rename(image="png", keep=False)(dict(sample)) == {"__key__": "k", "image": b"img"}
    chained = Compose(MapField("cls", lambda c: c + 1), ToTuple("__key__", "cls"))
    assert chained(dict(sample)) == ("k", 4)
    with pytest.raises(KeyError, match=r"sample 'k' has none of the fields 'jpg;jpeg' \(it has \['cls', 'png', 'txt'\]\)"):
        ToTuple("jpg;jpeg")(dict(sample))
    assert pickle.loads(pickle.dumps(ToTuple("jpg;png", "cls"))).fields == (("jpg", "png"), ("cls",))
