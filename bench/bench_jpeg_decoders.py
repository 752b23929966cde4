#!/usr/bin/env python3
"""Which JPEG decoder for the fused transforms: per-core decodes per second.

Two photo-like sets from ``tools/gen_photos.py`` (ImageNet-like ~500x375
~110 KB, high-resolution ~1600x1200 ~500 KB), decoded in one process with
one torch thread, each candidate timed in interleaved rounds (the best
round counts, which damps noise from other processes on a shared machine):

- full decode to an RGB array: Pillow (``Image.open`` + ``convert("RGB")``),
  simplejpeg (default and ``fastdct``/``fastupsample``), torchvision.io
  ``decode_jpeg``, and PyTurboJPEG when its shared library loads;
- the fused path at 224 for a torchvision ``RandomResizedCrop`` box drawn per
  image (the same boxes for every candidate): Pillow with ``Image.draft``,
  simplejpeg with ``min_height``/``min_width`` (both at the DCT scale the box
  needs), torchvision.io at full size, then the same torch antialiased
  resize for all; and :class:`shardkit.transforms.DecodeRandomResizedCrop`
  itself.

It also reports the fused transforms' quality: PSNR against torchvision's
decode (``torchvision.io.decode_jpeg``) then ``resized_crop(antialias=True)``
for the same box (train), and against ``Resize(256)`` + ``CenterCrop(224)``
(eval), over ``--psnr-count`` further images of each set.

Writes ``bench/results/jpeg_decoders.json`` and ``.md``:

    .venv/bin/python bench/bench_jpeg_decoders.py            # ~1 minute
    .venv/bin/python bench/bench_jpeg_decoders.py --count 8 --round-s 0.3
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from bench.common import machine, save_record  # noqa: E402
from gen_photos import photo_jpegs  # noqa: E402
from shardkit.transforms import DecodeRandomResizedCrop, image_size, random_resized_crop_box  # noqa: E402

OUT_SIZE = 224


def _eighths(box: tuple[int, int, int, int]) -> int:
    _, _, h, w = box
    for k in (1, 2, 4, 8):
        if h * k / 8 >= OUT_SIZE and w * k / 8 >= OUT_SIZE:
            return k
    return 8


def _resize(array: np.ndarray, box: tuple[int, int, int, int], full: tuple[int, int]) -> torch.Tensor:
    """Crop ``box`` (source pixels) from ``array`` (the image at some scale) and resize to 224."""
    sy, sx = array.shape[0] / full[0], array.shape[1] / full[1]
    top, left, h, w = box
    t0, l0 = int(round(top * sy)), int(round(left * sx))
    t1, l1 = max(int(round((top + h) * sy)), t0 + 1), max(int(round((left + w) * sx)), l0 + 1)
    region = torch.from_numpy(array)[t0:t1, l0:l1].permute(2, 0, 1).unsqueeze(0)
    region = region.contiguous(memory_format=torch.channels_last)
    return torch.nn.functional.interpolate(region, size=(OUT_SIZE, OUT_SIZE), mode="bilinear", antialias=True)


def candidates() -> tuple[dict[str, Callable[..., Any]], dict[str, Callable[..., Any]], dict[str, str]]:
    """Full-decode and fused candidates that can run here, and why the others cannot."""
    from torchvision.io import ImageReadMode, decode_jpeg

    full: dict[str, Callable[..., Any]] = {}
    fused: dict[str, Callable[..., Any]] = {}
    missing: dict[str, str] = {}

    def pil_full(data: bytes) -> Any:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    def pil_fused(data: bytes, box: tuple[int, int, int, int], hw: tuple[int, int]) -> Any:
        image = Image.open(io.BytesIO(data))
        k = _eighths(box)
        if k < 8:
            image.draft("RGB", (-(-hw[1] * k // 8), -(-hw[0] * k // 8)))
        return _resize(np.array(image.convert("RGB")), box, hw)

    full["pillow"] = pil_full
    fused["pillow draft"] = pil_fused

    def tv_full(data: bytes) -> Any:
        return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)

    def tv_fused(data: bytes, box: tuple[int, int, int, int], hw: tuple[int, int]) -> Any:
        return _resize(tv_full(data).permute(1, 2, 0).numpy(), box, hw)

    full["torchvision.io"] = tv_full
    fused["torchvision.io (full size)"] = tv_fused

    try:
        import simplejpeg
    except ImportError as exc:
        missing["simplejpeg"] = str(exc)
    else:
        full["simplejpeg"] = lambda data: simplejpeg.decode_jpeg(data)
        full["simplejpeg fastdct+fastupsample"] = lambda data: simplejpeg.decode_jpeg(
            data, fastdct=True, fastupsample=True
        )

        def sj_fused(data: bytes, box: tuple[int, int, int, int], hw: tuple[int, int]) -> Any:
            k = _eighths(box)
            array = simplejpeg.decode_jpeg(data, min_height=-(-hw[0] * k // 8), min_width=-(-hw[1] * k // 8))
            return _resize(array, box, hw)

        fused["simplejpeg scaled"] = sj_fused
    try:
        from turbojpeg import TurboJPEG

        turbo = TurboJPEG()
    except ImportError:
        missing["PyTurboJPEG"] = "not installed (its pip package also needs the system's libturbojpeg)"
    except Exception as exc:  # the package is there, its shared library is not
        missing["PyTurboJPEG"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    else:
        full["PyTurboJPEG"] = lambda data: turbo.decode(data)
    transform = DecodeRandomResizedCrop(OUT_SIZE)
    fused["shardkit DecodeRandomResizedCrop"] = lambda data, box, hw: transform(data, box=box)
    return full, fused, missing


def measure(
    images: list[bytes], full: dict[str, Callable[..., Any]], fused: dict[str, Callable[..., Any]], *, rounds: int, round_s: float
) -> dict[str, float]:
    """Best-round decodes per second of every candidate over ``images``."""
    torch.manual_seed(0)
    sizes = [image_size(data) for data in images]
    boxes = [random_resized_crop_box(h, w) for h, w in sizes]
    jobs: dict[str, Callable[[int], Any]] = {}
    for name, fn in full.items():
        jobs[f"full: {name}"] = lambda i, fn=fn: fn(images[i])
    for name, fn in fused.items():
        jobs[f"fused 224: {name}"] = lambda i, fn=fn: fn(images[i], boxes[i], sizes[i])
    best = dict.fromkeys(jobs, 0.0)
    for _ in range(rounds):
        for name, job in jobs.items():
            done = 0
            start = time.perf_counter()
            while time.perf_counter() - start < round_s:
                job(done % len(images))
                done += 1
            best[name] = max(best[name], done / (time.perf_counter() - start))
    return best


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return float("inf") if mse == 0 else 10 * float(np.log10(255**2 / mse))


def quality(images: list[bytes]) -> dict[str, dict[str, float]]:
    """Mean and minimum PSNR (dB) of the fused transforms against torchvision on ``images``."""
    import warnings

    import torchvision.transforms.v2 as T
    import torchvision.transforms.v2.functional as TF
    from torchvision.io import ImageReadMode, decode_jpeg

    from shardkit.transforms import DecodeResizeCenterCrop

    train, evaluate = DecodeRandomResizedCrop(OUT_SIZE), DecodeResizeCenterCrop(OUT_SIZE)
    reference_eval = T.Compose([T.Resize(256, antialias=True), T.CenterCrop(OUT_SIZE)])
    torch.manual_seed(0)
    values: dict[str, list[float]] = {"train": [], "eval": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchvision.io's decoders are deprecated
        for data in images:
            decoded = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
            box = random_resized_crop_box(*image_size(data))
            expected = TF.resized_crop(decoded, *box, [OUT_SIZE, OUT_SIZE], antialias=True)
            values["train"].append(psnr(train(data, box=box), expected))
            values["eval"].append(psnr(evaluate(data), reference_eval(decoded)))
    return {
        kind: {"mean_db": float(np.mean(np.minimum(v, 99.0))), "min_db": float(min(np.min(v), 99.0)), "count": len(v)}
        for kind, v in values.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=24, help="images per set")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-s", type=float, default=1.0, help="seconds per candidate per round")
    parser.add_argument("--psnr-count", type=int, default=150, help="images per set for the PSNR figures")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "jpeg_decoders.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    full, fused, missing = candidates()
    results: dict[str, dict[str, float]] = {}
    for preset in ("imagenet", "highres"):
        images = photo_jpegs(preset, args.count, seed=1)
        results[preset] = measure(images, full, fused, rounds=args.rounds, round_s=args.round_s)
    psnr_figures = {
        preset: quality(photo_jpegs(preset, args.psnr_count, seed=2)) for preset in ("imagenet", "highres")
    }
    lines = [
        "| decoder (per core) | ImageNet-like /s | high-res /s |",
        "| --- | ---: | ---: |",
    ]
    for name in results["imagenet"]:
        lines.append(f"| {name} | {results['imagenet'][name]:.0f} | {results['highres'][name]:.0f} |")
    for name, why in missing.items():
        lines.append(f"| {name} | not run: {why} | |")
    lines += [
        "",
        "PSNR of the fused transforms against torchvision (same box; 99 dB stands for identical images):",
        "",
        "| set | train mean / min dB | eval mean / min dB | images |",
        "| --- | ---: | ---: | ---: |",
    ]
    for preset, figures in psnr_figures.items():
        train, evaluate = figures["train"], figures["eval"]
        lines.append(
            f"| {preset} | {train['mean_db']:.1f} / {train['min_db']:.1f} | "
            f"{evaluate['mean_db']:.1f} / {evaluate['min_db']:.1f} | {train['count']} |"
        )
    table = "\n".join(lines) + "\n"
    record = {"machine": machine(), "count": args.count, "rounds": args.rounds, "round_s": args.round_s,
              "results": results, "missing": missing, "psnr": psnr_figures}  # fmt: skip
    save_record(args.out, record, table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
