#!/usr/bin/env python3
"""Generate photo-like JPEGs: smooth lighting, objects with edges, texture, grain.

tools/gen_images.py makes sinusoids plus white noise, which compress like
noise; a decoder benchmark and a quality test want the structure of a
photograph instead: low-frequency shading, a few objects with hard edges and
their own shading, mid-frequency texture and a little sensor grain. The two
presets match the issue's sets:

- ``imagenet``: about 500x375, about 110 KB (quality 95);
- ``highres``: about 1600x1200, about 500 KB (quality 90).

Sizes vary a little per image (and about one in four is portrait), so a batch
of decoded images really has mixed shapes.

    python tools/gen_photos.py OUT --preset highres --count 100
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


@dataclass(frozen=True)
class PhotoPreset:
    """Size and texture of one family of generated photos.

    Attributes:
        width: Nominal width in pixels (landscape orientation).
        height: Nominal height in pixels.
        texture: Amplitude of the mid-frequency texture, in grey levels.
        grain: Standard deviation of the per-pixel grain, in grey levels.
        quality: JPEG quality.
    """

    width: int
    height: int
    texture: float
    grain: float
    quality: int = 90


PRESETS: dict[str, PhotoPreset] = {
    "imagenet": PhotoPreset(width=500, height=375, texture=50.0, grain=10.0, quality=95),
    "highres": PhotoPreset(width=1600, height=1200, texture=34.0, grain=6.0, quality=90),
}


def _smooth_field(rng: np.random.Generator, height: int, width: int, cells: int) -> np.ndarray:
    """A random field of about ``cells`` cells across, upsampled smoothly to the image size."""
    small_w = max(2, cells)
    small_h = max(2, int(round(cells * height / width)))
    small = rng.random((small_h, small_w), dtype=np.float32)
    image = Image.fromarray(small, "F").resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(image, dtype=np.float32)


def make_photo(rng: np.random.Generator, width: int, height: int, *, texture: float, grain: float) -> Image.Image:
    """Draw one photo-like RGB image.

    Args:
        rng: Source of randomness; the same state gives the same image.
        width: Width in pixels.
        height: Height in pixels.
        texture: Amplitude of the mid-frequency texture, in grey levels.
        grain: Standard deviation of the per-pixel grain, in grey levels.

    Returns:
        The image, mode ``RGB``.
    """
    tint = rng.uniform(60, 200, size=3).astype(np.float32)
    light = _smooth_field(rng, height, width, 3)[..., None]
    base = tint * (0.5 + light) + 40 * (_smooth_field(rng, height, width, 5)[..., None] - 0.5)
    canvas = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(6, 14))):
        x0, x1 = sorted(rng.integers(-width // 4, width + width // 4, size=2).tolist())
        y0, y1 = sorted(rng.integers(-height // 4, height + height // 4, size=2).tolist())
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        kind = rng.integers(0, 3)
        if kind == 0:
            draw.ellipse((x0, y0, x1 + 1, y1 + 1), fill=colour)
        elif kind == 1:
            draw.rectangle((x0, y0, x1 + 1, y1 + 1), fill=colour)
        else:
            points = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(3)]
            draw.polygon(points, fill=colour)
    # Soften the edges a little, as a lens does.
    canvas = canvas.filter(ImageFilter.GaussianBlur(radius=max(0.6, width / 1600)))
    pixels = np.asarray(canvas, dtype=np.float32)
    shade = 0.75 + 0.5 * _smooth_field(rng, height, width, 4)[..., None]
    detail = _smooth_field(rng, height, width, max(8, width // 6)) - 0.5
    detail += 0.5 * (_smooth_field(rng, height, width, max(16, width // 3)) - 0.5)
    pixels = pixels * shade + texture * detail[..., None]
    pixels += rng.normal(0.0, grain, size=pixels.shape).astype(np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def photo_jpeg(rng: np.random.Generator, preset: PhotoPreset) -> bytes:
    """Encode one photo of ``preset`` (size jittered by up to 10%, one in four portrait) as JPEG."""
    width = int(preset.width * rng.uniform(0.9, 1.1))
    height = int(preset.height * rng.uniform(0.9, 1.1))
    if rng.random() < 0.25:
        width, height = height, width
    image = make_photo(rng, width, height, texture=preset.texture, grain=preset.grain)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=preset.quality)
    return out.getvalue()


def photo_jpegs(preset: str | PhotoPreset, count: int, *, seed: int = 0) -> list[bytes]:
    """``count`` JPEGs of a preset (a name in :data:`PRESETS` or a :class:`PhotoPreset`)."""
    chosen = PRESETS[preset] if isinstance(preset, str) else preset
    rng = np.random.default_rng(seed)
    return [photo_jpeg(rng, chosen) for _ in range(count)]


def generate(out: str, *, preset: str, count: int, classes: int = 10, seed: int = 0) -> int:
    """Write ``count`` photos as an ImageFolder tree under ``out/class_XXX/``; returns total bytes."""
    total = 0
    for i, data in enumerate(photo_jpegs(preset, count, seed=seed)):
        folder = os.path.join(out, f"class_{i % classes:03d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"img_{i:06d}.jpg"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="imagenet")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    total = generate(args.out, preset=args.preset, count=args.count, classes=args.classes, seed=args.seed)
    sys.stdout.write(f"{args.count} images, {total / args.count / 1000:.0f} KB on average\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
