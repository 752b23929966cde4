"""Checking and resizing images on the way in: sizes per mode, never upscaling,
bad bytes caught, only what the target needs decoded."""

from __future__ import annotations

import io

import pytest

from shardkit.errors import UsageError
from shardkit.write.resize import ImageOptions, ImageProblem, output_size, prepare_image
from tests.write.url_servers import photo_jpeg, png_bytes

Image = pytest.importorskip("PIL.Image")


def _size(data: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(data)).size


@pytest.mark.parametrize(
    ("mode", "size", "stored"),
    [
        ("keep_ratio", (1600, 1200), (341, 256)),
        ("keep_ratio", (1200, 1600), (256, 341)),
        ("keep_ratio", (200, 100), (200, 100)),  # smaller: kept, never upscaled
        ("center_crop", (1600, 1200), (256, 256)),
        ("center_crop", (200, 100), (100, 100)),  # the shorter side's square, not upscaled
        ("border", (1600, 1200), (256, 256)),
        ("border", (200, 100), (256, 256)),  # padded, not upscaled
    ],
)
def test_resize_modes_give_their_sizes_and_never_upscale(mode, size, stored):
    data = photo_jpeg(*size)
    image = prepare_image(data, ImageOptions(resize=256, mode=mode))
    assert (image.width, image.height) == stored == _size(image.data)
    assert (image.original_width, image.original_height) == size
    assert image.ext == "jpg"
    if mode == "keep_ratio" and size == (200, 100):
        assert image.data is data  # nothing to change: the original bytes, not a re-encode


def test_border_pads_with_the_colour_around_the_centred_image():
    image = prepare_image(photo_jpeg(200, 100), ImageOptions(resize=256, mode="border", border_rgb=(255, 0, 0)))
    pixels = Image.open(io.BytesIO(image.data)).convert("RGB")
    red, green, blue = pixels.getpixel((128, 5))  # above the image: border
    assert red > 200 and green < 60 and blue < 60
    assert pixels.getpixel((128, 128)) != pixels.getpixel((128, 5))


def test_output_format_and_alpha():
    rgba = png_bytes(300, 300, "RGBA")
    as_jpg = prepare_image(rgba, ImageOptions(resize=100, output_format="jpg"))
    assert as_jpg.ext == "jpg" and Image.open(io.BytesIO(as_jpg.data)).mode == "RGB"
    as_png = prepare_image(rgba, ImageOptions(resize=100))  # None: the input's format, alpha kept
    assert as_png.ext == "png" and Image.open(io.BytesIO(as_png.data)).mode == "RGBA"
    webp = prepare_image(photo_jpeg(400, 300), ImageOptions(resize=64, output_format="webp", quality=50))
    assert webp.ext == "webp" and _size(webp.data) == (85, 64)
    unchanged_but_converted = prepare_image(png_bytes(50, 50, "L"), ImageOptions(output_format="jpg"))
    assert unchanged_but_converted.ext == "jpg" and _size(unchanged_but_converted.data) == (50, 50)


def test_a_large_jpeg_is_decoded_at_a_reduced_dct_scale():
    # The draft decode: Pillow reports the scaled size it decoded at.
    data = photo_jpeg(2048, 1536)
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", output_size(2048, 1536, 256, "keep_ratio")[0])
    assert image.size == (512, 384)  # 1/4 scale still covers 341x256
    assert _size(prepare_image(data, ImageOptions(resize=256)).data) == (341, 256)


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("truncated jpeg", photo_jpeg(640, 480)[:-2000], "not_image"),
        ("half a jpeg", photo_jpeg(640, 480)[:6000], "not_image"),
        ("html served as jpeg", b"<!doctype html><html><body>Not found</body></html>", "not_image"),
        ("nothing", b"", "not_image"),
        ("too small", photo_jpeg(16, 16), "too_small"),
    ],
)
def test_bad_bytes_are_refused_with_a_reason(name, data, reason):
    for options in (ImageOptions(min_side=32), ImageOptions(resize=64, min_side=32)):
        with pytest.raises(ImageProblem) as caught:
            prepare_image(data, options)
        assert caught.value.reason == reason, name


def test_an_image_claiming_too_many_pixels_is_refused_before_decoding():
    with pytest.raises(ImageProblem) as caught:
        prepare_image(png_bytes(400, 300, "L"), ImageOptions(max_pixels=100_000))
    assert caught.value.reason == "image_too_large" and "400x300" in caught.value.detail


def test_options_are_checked():
    with pytest.raises(UsageError, match="--resize-mode"):
        ImageOptions(resize=256, mode="stretch")
    with pytest.raises(UsageError, match="--resize"):
        ImageOptions(resize=0)
    with pytest.raises(UsageError, match="quality"):
        ImageOptions(quality=101)


def test_missing_pillow_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "PIL", None)
    with pytest.raises(ImportError, match=r"pip install 'shardkit\[images\]'"):
        prepare_image(b"x", ImageOptions())
