#!/usr/bin/env python3
"""Generate a synthetic ImageFolder tree of JPEGs (no downloads).

Each image mixes a smooth per-class colour gradient with seeded noise, so the
JPEGs compress like photos of varied content rather than like flat colour.
``--target-kb`` steers the average file size through the image side length
(about 110 KB gives an ImageNet-like set).

    python tools/gen_images.py OUT --classes 10 --per-class 30 --target-kb 20
"""

from __future__ import annotations

import argparse
import io
import os
import sys

import numpy as np
from PIL import Image


def make_image(rng: np.random.Generator, label: int, side: int, noise: float) -> Image.Image:
    y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
    base = np.stack(
        [
            128 + 100 * np.sin(2 * np.pi * (x * (1 + label % 3) + rng.random())),
            128 + 100 * np.cos(2 * np.pi * (y * (1 + label % 5) + rng.random())),
            128 + 100 * np.sin(2 * np.pi * (x + y) * (1 + label % 7)),
        ],
        axis=-1,
    )
    grain = rng.normal(0, noise, size=(side, side, 3))
    pixels = np.clip(base + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def jpeg_bytes(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def side_for(target_kb: float, noise: float) -> int:
    """Pick an image side whose JPEG lands near ``target_kb`` (one probe)."""
    probe_side = 128
    probe = jpeg_bytes(make_image(np.random.default_rng(0), 0, probe_side, noise))
    scale = (target_kb * 1000 / len(probe)) ** 0.5
    return max(16, int(probe_side * scale))


def generate(out: str, *, classes: int, per_class: int, target_kb: float, seed: int = 0, noise: float = 40.0) -> int:
    """Write ``classes * per_class`` JPEGs under ``out/class_XXX/``; returns total bytes."""
    rng = np.random.default_rng(seed)
    side = side_for(target_kb, noise)
    total = 0
    for label in range(classes):
        folder = os.path.join(out, f"class_{label:03d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            # Vary the size a little around the target, like real photos.
            jitter = int(side * rng.uniform(0.8, 1.2))
            data = jpeg_bytes(make_image(rng, label, jitter, noise))
            with open(os.path.join(folder, f"img_{label:03d}_{i:05d}.jpg"), "wb") as f:
                f.write(data)
            total += len(data)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="output folder (created)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=30)
    parser.add_argument("--target-kb", type=float, default=20.0, help="average JPEG size to aim for")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    total = generate(args.out, classes=args.classes, per_class=args.per_class, target_kb=args.target_kb, seed=args.seed)
    count = args.classes * args.per_class
    print(f"generated {count} JPEGs in {args.out}: {total / 1e6:.1f} MB, {total / count / 1e3:.1f} KB average")
    return 0


if __name__ == "__main__":
    sys.exit(main())
