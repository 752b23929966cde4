"""Generated benchmark data: an ImageNet-like JPEG set, its shards, and a
large file for the sequential ceiling.

Images are smooth random fields (a small random grid scaled up) plus noise of
random strength, saved at a random JPEG quality, so sizes vary like photos
(tens to a couple of hundred KB, ~110 KB on average) and no two compress alike.
Everything is a function of the seed; a folder already holding data made with
the same parameters is reused.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import asdict, dataclass

import numpy as np

#: Parameters file written last into a finished data folder.
SPEC_NAME = "spec.json"


@dataclass(frozen=True)
class DataSpec:
    """What to generate.

    Attributes:
        num_images: Images in total.
        num_classes: Class folders.
        num_shards: Shards the same images are packed into.
        ceiling_bytes: Size of the file read by the sequential-ceiling test.
        seed: Seed of everything.
        generator: Version of :func:`make_jpeg`; bump it when the images change.
    """

    num_images: int = 3000
    num_classes: int = 100
    num_shards: int = 32
    ceiling_bytes: int = 512 << 20
    seed: int = 0
    generator: int = 3


def make_jpeg(rng: np.random.Generator) -> bytes:
    """One synthetic photo-like JPEG."""
    from PIL import Image

    width, height = int(rng.integers(430, 670)), int(rng.integers(330, 510))
    grid = int(rng.integers(4, 32))
    small = rng.integers(0, 256, size=(grid, grid, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(small).resize((width, height), Image.BICUBIC), dtype=np.int16)
    noise = rng.normal(0.0, rng.uniform(6, 40), size=field.shape).astype(np.int16)
    pixels = np.clip(field + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=int(rng.integers(80, 95)))
    return out.getvalue()


def class_name(label: int) -> str:
    return f"n{label:08d}"


def ensure_data(root: str, spec: DataSpec) -> dict[str, str]:
    """Generate (or reuse) the data under ``root``.

    Returns:
        Paths: ``imagefolder`` (class folders of JPEGs), ``shards`` (shardkit
        dataset folder, also readable by webdataset) and ``ceiling`` (one
        large file).
    """
    paths = {
        "imagefolder": os.path.join(root, "imagefolder"),
        "shards": os.path.join(root, "shards"),
        "ceiling": os.path.join(root, "ceiling.bin"),
    }
    spec_path = os.path.join(root, SPEC_NAME)
    try:
        with open(spec_path) as f:
            stored = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        stored = None
    if stored == asdict(spec):
        return paths
    if stored is not None and {**stored, "num_shards": spec.num_shards} == asdict(spec):
        # Only the packing changed: keep the images and the ceiling file.
        os.unlink(spec_path)
        shutil.rmtree(paths["shards"], ignore_errors=True)
        _write_shards(paths["imagefolder"], paths["shards"], spec)
    else:
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        _write_images(paths["imagefolder"], spec)
        _write_shards(paths["imagefolder"], paths["shards"], spec)
        _write_ceiling(paths["ceiling"], spec.ceiling_bytes, spec.seed)
    with open(spec_path, "w") as f:
        json.dump(asdict(spec), f)
    return paths


def _write_image(job: tuple[str, int, int]) -> None:
    path, seed, index = job
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    with open(path, "wb") as f:
        f.write(make_jpeg(rng))


def _write_images(dest: str, spec: DataSpec) -> None:
    """Each image comes from its own seed, so a pool of any size writes the
    same files."""
    from multiprocessing import get_context

    for label in range(spec.num_classes):
        os.makedirs(os.path.join(dest, class_name(label)))
    jobs = [
        (os.path.join(dest, class_name(i % spec.num_classes), f"img_{i:07d}.jpg"), spec.seed, i)
        for i in range(spec.num_images)
    ]
    with get_context("fork").Pool(max(1, os.cpu_count() or 1)) as pool:
        for _ in pool.imap_unordered(_write_image, jobs, chunksize=32):
            pass


def list_images(imagefolder: str) -> list[tuple[str, int]]:
    """``(path, label)`` for each image, in sorted (class, name) order."""
    items = []
    for label, cls in enumerate(sorted(os.listdir(imagefolder))):
        folder = os.path.join(imagefolder, cls)
        items.extend((os.path.join(folder, name), label) for name in sorted(os.listdir(folder)))
    return items


def _write_shards(imagefolder: str, dest: str, spec: DataSpec) -> None:
    """Pack the images in a seeded random order (as packing tools do) into
    ``num_shards`` shards of about equal size."""
    from shardkit import ShardWriter

    items = list_images(imagefolder)
    order = np.random.default_rng(spec.seed + 1).permutation(len(items))
    per_shard = -(-len(items) // spec.num_shards)
    classes = sorted(os.listdir(imagefolder))
    with ShardWriter(dest, max_samples=per_shard, max_bytes=None, class_names=classes) as writer:
        for i in order:
            path, label = items[int(i)]
            with open(path, "rb") as f:
                writer.write({"__key__": f"s{int(i):07d}", "jpg": f.read(), "cls": label})


def _write_ceiling(path: str, num_bytes: int, seed: int) -> None:
    rng = np.random.default_rng(seed + 2)
    block = rng.integers(0, 256, size=4 << 20, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        left = num_bytes
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
