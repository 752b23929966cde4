#!/usr/bin/env python3
"""`make demo`: generate a small image set, shard it, verify it, read it back.

Steps (each printed as it runs):
1. ``tools/gen_images.py`` writes a few hundred JPEGs in ImageFolder layout.
2. ``shardkit write`` packs them into shards with 2 processes.
3. ``shardkit verify`` re-reads every shard; ``shardkit info`` summarizes.
4. ``shardkit.ShardDataset`` streams the shards back through a DataLoader
   and the throughput is printed.
5. ``shardkit bench`` measures the storage's ceiling and the loader per
   worker count, raw and with images decoded, and says which binds.
6. ``shardkit write --map demo:thumbnail`` writes them again through a
   function of this file (a 64-pixel thumbnail and a caption per image), run
   in the writer's 2 processes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(argv: list[str]) -> None:
    print(f"\n$ {' '.join(argv)}", flush=True)
    subprocess.run(argv, check=True)


def thumbnail(sample: dict) -> dict:
    """The demo's ``--map`` function: each image as a 64-pixel JPEG thumbnail, with a caption."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    image.thumbnail((64, 64))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    label = int(sample["cls"])
    return {"__key__": sample["__key__"], "jpg": out.getvalue(), "cls": label, "txt": f"an image of class {label}"}


def read_back(shards: str) -> None:
    import shardkit

    print(f"\n# reading {shards} back through a DataLoader (2 persistent workers, raw bytes; epoch 0 includes worker start-up)", flush=True)
    dataset = shardkit.ShardDataset(shards, mode="exact", seed=0, buffer_size=256)
    loader = shardkit.make_loader(dataset, batch_size=32, num_workers=2)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        started = time.perf_counter()
        samples = 0
        keys = set()
        for batch in loader:
            samples += len(batch["__key__"])
            keys.update(batch["__key__"])
        seconds = time.perf_counter() - started
        print(f"epoch {epoch}: {samples} samples ({len(keys)} distinct) in {seconds:.2f}s = {samples / seconds:.0f} samples/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="demo")
    args = parser.parse_args(argv)
    images = os.path.join(args.workdir, "images")
    shards = os.path.join(args.workdir, "shards")
    python = sys.executable
    if not os.path.isdir(images):
        run([python, os.path.join(HERE, "gen_images.py"), images, "--classes", "10", "--per-class", "30", "--target-kb", "20"])
    else:
        print(f"# using the images already in {images}")
    if os.path.isdir(shards):
        shutil.rmtree(shards)
    run([python, "-m", "shardkit", "write", images, shards, "--max-samples", "64", "--workers", "2"])
    run([python, "-m", "shardkit", "verify", shards])
    run([python, "-m", "shardkit", "info", shards])
    read_back(shards)
    # Where the loader's time goes on this machine's storage: bench.json, bench.md and bench.png in demo/bench.
    run([python, "-m", "shardkit", "bench", shards, "--decode", "pil", "--out", os.path.join(args.workdir, "bench")])
    prepared = os.path.join(args.workdir, "prepared")
    if os.path.isdir(prepared):
        shutil.rmtree(prepared)
    # The writer runs your code: thumbnail() above, imported by name from this folder.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    run([python, "-m", "shardkit", "write", images, prepared, "--map", "demo:thumbnail", "--max-samples", "64",
         "--workers", "2"])  # fmt: skip
    run([python, "-m", "shardkit", "verify", prepared])
    print(f"\ndemo done: images in {images}, shards + manifest.json + .idx indexes in {shards}, "
          f"thumbnails and captions written by --map in {prepared}, the loader measured in "
          f"{os.path.join(args.workdir, 'bench')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
