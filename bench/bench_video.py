"""Video and audio clips (issue #43): clips per second and memory of one
worker, shardkit's clip decoders against decoding the whole member.

Data, generated with PyAV and soundfile (no downloads; cached under
``--workdir``): 720p H.264 videos at 30 frames per second in two lengths
(30 s and 60 s; libx264 ``veryfast`` with its own keyframe choice, at most
250 frames apart, and B-frames), each length in shards of its own; FLAC and
MP3 audio of 5 minutes at 44.1 kHz stereo.

Each cell is one process (a DataLoader worker's share of the work: one
thread of decoding everywhere), reading the shards in a loop and making
clips of **16 frames at 8 frames per second, 224 x 224** (resized on the
short side, centre-cropped) from a random start:

- ``shardkit``: ``ShardDataset(..., map=MapField("mp4", DecodeVideoClip(16, fps=8, size=224)))``.
- ``shardkit (decode every frame before the clip)``: the same with
  ``skip_nonref=False``: what skipping unreferenced frames earns.
- ``full decode (webdataset torch_video)``: a webdataset pipeline whose
  decoder does what ``webdataset.autodecode.torch_video`` does: write the
  member to a temporary file and ``torchvision.io.read_video`` it, which
  decodes and converts every frame. torchvision removed ``read_video``
  (0.24); the handler here runs its algorithm on the same PyAV (every frame
  decoded, converted to RGB, stacked), then takes the clip's frames by
  timestamp and resizes and crops them with torch.
- ``decord``: ``decord.VideoReader(..., num_threads=1).get_batch`` of the
  clip's frame numbers (decord seeks to the keyframe before them), resized and
  cropped with torch; where decord installs.

``torchvision.io.read_video`` itself no longer exists in the torchvision this
machine has (0.29); torchcodec needs FFmpeg's shared libraries from the
system, which this benchmark does not install.

Audio: 4-second clips at 16 kHz from random starts, ``DecodeAudioClip(4.0,
sampling_rate=16000)`` against ``soundfile.read`` of the whole member, the
clip cut out of it and resampled with the same soxr (torchaudio has no
release for this torch).

Per cell: clips per second (clips over the wall time, after one warm-up
clip) and the process's peak memory (VmHWM) less its resident memory before
the first clip: what decoding added.

Targets (issue #43): at least 3x the full-decode path's clips per worker;
memory per worker bounded by the clip, not the video (flat from 30 s to
60 s videos).

Writes ``bench/results/video.{json,md,png}``; ``--quick`` a small run's
record under ``--workdir``.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import answer_cell, bench_parser, git_commit, machine, peak_rss_mb, publish_run, run_cell  # noqa: E402

CELL_ANSWER = "@@bench-video "
FULL = {"lengths": [30, 60], "videos": 2, "clips": {"shardkit": 24, "decord": 12, "full": 3}, "audio_clips": 60}
QUICK = {"lengths": [8, 16], "videos": 1, "clips": {"shardkit": 6, "decord": 4, "full": 2}, "audio_clips": 10}
WIDTH, HEIGHT, FPS = 1280, 720, 30
CLIP_FRAMES, CLIP_FPS, SIZE = 16, 8, 224
AUDIO_SECONDS, AUDIO_RATE = 300, 44100
VIDEO_TOOLS = ("shardkit", "shardkit-no-skip", "full", "decord")
LABELS = {
    "shardkit": "shardkit DecodeVideoClip",
    "shardkit-no-skip": "shardkit, decoding every frame before the clip",
    "full": "full decode (webdataset torch_video)",
    "decord": "decord get_batch",
    "shardkit-audio": "shardkit DecodeAudioClip",
    "soundfile": "soundfile.read whole + cut + soxr",
}


# ------------------------------------------------------------------ data


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def ensure_data(workdir: str, preset: dict[str, Any]) -> dict[str, str]:
    """Shards of videos per length and of audio per format, made once."""
    import shardkit
    from bench.harness.media import make_video, tone

    paths = {}
    for length in preset["lengths"]:
        dest = os.path.join(workdir, f"video-{length}s-x{preset['videos']}")
        if not os.path.exists(os.path.join(dest, "manifest.json")):
            shutil.rmtree(dest, ignore_errors=True)
            print(f"bench-video: making {preset['videos']} videos of {length} s at 720p", flush=True)
            with shardkit.ShardWriter(dest, max_samples=1) as writer:
                for i in range(preset["videos"]):
                    data = make_video(seconds=length, fps=FPS, width=WIDTH, height=HEIGHT, gop=None, seed=i)
                    writer.write({"__key__": f"v{i}", "mp4": data})
        paths[f"video-{length}"] = dest
    for ext, fmt in (("flac", "FLAC"), ("mp3", "MP3")):
        dest = os.path.join(workdir, f"audio-{ext}")
        if not os.path.exists(os.path.join(dest, "manifest.json")):
            import soundfile

            shutil.rmtree(dest, ignore_errors=True)
            frames = tone(AUDIO_SECONDS * AUDIO_RATE, AUDIO_RATE, channels=2)
            frames += np.random.default_rng(0).normal(0, 0.01, frames.shape).astype(np.float32)
            out = io.BytesIO()
            soundfile.write(out, frames, AUDIO_RATE, format=fmt)
            with shardkit.ShardWriter(dest) as writer:
                for i in range(2):
                    writer.write({"__key__": f"a{i}", ext: out.getvalue()})
        paths[f"audio-{ext}"] = dest
    return paths


# ------------------------------------------------------------------ cells


def _resize_crop(frames: Any) -> Any:
    """``T x H x W x 3`` uint8 -> ``T x 3 x SIZE x SIZE``: short side to SIZE (antialiased), centre crop."""
    import torch

    x = torch.as_tensor(frames).permute(0, 3, 1, 2).float()
    h, w = x.shape[-2:]
    scale = SIZE / min(h, w)
    x = torch.nn.functional.interpolate(x, size=(round(h * scale), round(w * scale)), mode="bilinear", antialias=True)
    top, left = (x.shape[-2] - SIZE) // 2, (x.shape[-1] - SIZE) // 2
    return x[..., top : top + SIZE, left : left + SIZE].round().clamp(0, 255).to(torch.uint8)


def _clip_times(duration: float, rng: np.random.Generator) -> np.ndarray:
    span = (CLIP_FRAMES - 1) / CLIP_FPS
    return rng.uniform(0, max(duration - span, 0)) + np.arange(CLIP_FRAMES) / CLIP_FPS


def read_video_like(key: str, data: bytes) -> Any:
    """webdataset's ``torch_video`` handler with torchvision's ``read_video``
    algorithm: the member to a temporary file, every frame decoded and
    converted to RGB, stacked with its timestamps."""
    import av
    import torch

    if not key.endswith("mp4"):
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "file.mp4")
        with open(path, "wb") as f:
            f.write(data)
        with av.open(path) as box:
            stream = box.streams.video[0]
            stream.thread_count = 1
            frames, times = [], []
            for frame in box.decode(stream):
                frames.append(frame.to_ndarray(format="rgb24"))
                times.append(frame.time)
    return torch.as_tensor(np.stack(frames)), np.asarray(times)


def _video_items(spec: dict[str, Any]) -> Any:
    """An endless iterator of clips for the cell's tool."""
    tool, shards = spec["tool"], spec["shards"]
    rng = np.random.default_rng(0)
    if tool.startswith("shardkit"):
        import shardkit
        from shardkit.transforms import DecodeVideoClip, MapField

        transform = DecodeVideoClip(CLIP_FRAMES, fps=CLIP_FPS, size=SIZE, skip_nonref=tool == "shardkit")
        ds = shardkit.ShardDataset(shards, decode=None, seed=0, map=MapField("mp4", transform))
        for epoch in range(10**6):
            ds.set_epoch(epoch)
            for sample in ds:
                yield sample["mp4"]
    urls = sorted(os.path.join(shards, n) for n in os.listdir(shards) if n.endswith(".tar"))
    import webdataset as wds

    if tool == "full":
        pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode(read_video_like)
        while True:
            for sample in pipeline:
                frames, times = sample["mp4"]
                wanted = _clip_times(float(times[-1]), rng)
                index = np.clip(np.searchsorted(times, wanted + 1e-6, side="right") - 1, 0, len(times) - 1)
                yield _resize_crop(frames[index])
    if tool == "decord":
        import decord

        pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        while True:
            for sample in pipeline:
                reader = decord.VideoReader(io.BytesIO(sample["mp4"]), ctx=decord.cpu(0), num_threads=1)
                fps = reader.get_avg_fps()
                index = np.minimum((_clip_times(len(reader) / fps, rng) * fps).astype(int), len(reader) - 1)
                yield _resize_crop(reader.get_batch(list(index)).asnumpy())
    raise ValueError(tool)


def _audio_items(spec: dict[str, Any]) -> Any:
    import shardkit

    ext = spec["ext"]
    if spec["tool"] == "shardkit-audio":
        from shardkit.transforms import DecodeAudioClip, MapField

        ds = shardkit.ShardDataset(spec["shards"], decode=None, seed=0,
                                   map=MapField(ext, DecodeAudioClip(4.0, sampling_rate=16000)))  # fmt: skip
        for epoch in range(10**6):
            ds.set_epoch(epoch)
            for sample in ds:
                yield sample[ext]["array"]
    import soundfile
    import soxr
    import torch

    rng = np.random.default_rng(0)
    ds = shardkit.ShardDataset(spec["shards"], decode=None, seed=0)
    while True:
        for sample in ds:
            whole, rate = soundfile.read(io.BytesIO(sample[ext]), dtype="float32", always_2d=True)
            first = int(rng.uniform(0, len(whole) - 4 * rate))
            clip = soxr.resample(whole[first : first + 4 * rate], rate, 16000, quality="HQ")
            yield torch.from_numpy(np.ascontiguousarray(clip.T))


def cell(spec: dict[str, Any]) -> dict[str, Any]:
    # Every cell imports what any cell uses first, so that the memory
    # decoding adds is measured from the same floor.
    import av  # noqa: F401
    import soundfile  # noqa: F401
    import soxr  # noqa: F401
    import torch  # noqa: F401
    import webdataset  # noqa: F401

    import shardkit.transforms  # noqa: F401

    try:
        import decord  # noqa: F401
    except ImportError as exc:
        if spec["tool"] == "decord":
            return {"unavailable": f"decord does not import here: {exc}"}
    items = _audio_items(spec) if spec["tool"] in ("shardkit-audio", "soundfile") else _video_items(spec)
    before = _rss_mb()
    first = next(items)  # warm-up: imports, first open
    started = time.perf_counter()
    shapes = {tuple(first.shape)}
    for _ in range(spec["clips"]):
        shapes.add(tuple(next(items).shape))
    seconds = time.perf_counter() - started
    return {"clips_per_s": spec["clips"] / seconds, "seconds": seconds, "clips": spec["clips"],
            "peak_mb": peak_rss_mb(), "added_mb": peak_rss_mb() - before, "shapes": sorted(shapes)}  # fmt: skip


# ------------------------------------------------------------------ run


def measure(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    paths = ensure_data(args.workdir, preset)
    cells: list[dict[str, Any]] = []
    for length in preset["lengths"]:
        for tool in VIDEO_TOOLS:
            clips = preset["clips"]["shardkit" if tool.startswith("shardkit") else tool]
            spec = {"tool": tool, "shards": paths[f"video-{length}"], "clips": clips}
            got = run_cell(__file__, spec, answer=CELL_ANSWER, python=sys.executable, timeout_s=args.timeout_s)
            cells.append({"kind": "video", "tool": tool, "length_s": length, **got})
            print(f"bench-video: {length} s {tool}: {got}", flush=True)
    for ext in ("flac", "mp3"):
        for tool in ("shardkit-audio", "soundfile"):
            spec = {"tool": tool, "shards": paths[f"audio-{ext}"], "clips": preset["audio_clips"], "ext": ext}
            got = run_cell(__file__, spec, answer=CELL_ANSWER, python=sys.executable, timeout_s=args.timeout_s)
            cells.append({"kind": "audio", "tool": tool, "format": ext, **got})
            print(f"bench-video: audio {ext} {tool}: {got}", flush=True)
    return {"benchmark": "video", "commit": git_commit(), "machine": machine(), "quick": args.quick,
            "clip": {"frames": CLIP_FRAMES, "fps": CLIP_FPS, "size": SIZE},
            "video": {"width": WIDTH, "height": HEIGHT, "fps": FPS, "videos_per_length": preset["videos"]},
            "audio": {"seconds": AUDIO_SECONDS, "rate": AUDIO_RATE, "clip_s": 4.0, "to_rate": 16000},
            "cells": cells}  # fmt: skip


def _find(record: dict[str, Any], **match: Any) -> dict[str, Any]:
    return next(c for c in record["cells"] if all(c.get(k) == v for k, v in match.items()))


def _row(data: str, tool: str, cell: dict[str, Any], baseline: float | None, digits: int) -> str:
    """A table row: the cell's clips/s, its ratio to ``baseline`` and its memory, or why it has none."""
    if "clips_per_s" not in cell:
        return f"| {data} | {LABELS[tool]} | {cell.get('unavailable') or cell.get('error')} | | |"
    ratio = f"{cell['clips_per_s'] / baseline:.1f}x" if baseline else ""
    return f"| {data} | {LABELS[tool]} | {cell['clips_per_s']:.{digits}f} | {ratio} | {cell['added_mb']:.0f} |"


def markdown(record: dict[str, Any]) -> str:
    lines = [
        f"# Video and audio clips, one worker (commit {record['commit']})",
        "",
        f"Clips of {CLIP_FRAMES} frames at {CLIP_FPS} fps, {SIZE} x {SIZE}, from 720p H.264 at 30 fps; "
        "memory is what decoding added to the process's peak.",
        "",
        "| video | tool | clips/s | vs full decode | memory added (MB) |",
        "|---|---|---:|---:|---:|",
    ]
    lengths = sorted({c["length_s"] for c in record["cells"] if c["kind"] == "video"})
    for length in lengths:
        full = _find(record, kind="video", tool="full", length_s=length).get("clips_per_s")
        for tool in VIDEO_TOOLS:
            lines.append(_row(f"{length} s", tool, _find(record, kind="video", tool=tool, length_s=length), full, 2))
    lines += ["", "| audio | tool | clips/s | vs whole read | memory added (MB) |", "|---|---|---:|---:|---:|"]
    for ext in ("flac", "mp3"):
        whole = _find(record, kind="audio", tool="soundfile", format=ext).get("clips_per_s")
        for tool in ("shardkit-audio", "soundfile"):
            lines.append(_row(ext, tool, _find(record, kind="audio", tool=tool, format=ext), whole, 1))
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({c["length_s"] for c in record["cells"] if c["kind"] == "video"})
    fig, (rate_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(VIDEO_TOOLS)
    for i, tool in enumerate(VIDEO_TOOLS):
        cells = [_find(record, kind="video", tool=tool, length_s=n) for n in lengths]
        xs = [j + i * width for j in range(len(lengths))]
        rate_ax.bar(xs, [c.get("clips_per_s", 0) for c in cells], width, label=LABELS[tool])
        mem_ax.bar(xs, [c.get("added_mb", 0) for c in cells], width, label=LABELS[tool])
    for ax, title in ((rate_ax, "clips per second, one worker"), (mem_ax, "memory added by decoding (MB)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(lengths))], [f"{n} s videos" for n in lengths])
        ax.set_title(title)
    mem_ax.set_yscale("log")
    rate_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "video", quick_help="short videos, few clips", timeout_s=600)
    args = parser.parse_args(argv)
    if answer_cell(args, CELL_ANSWER, cell):
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    return publish_run(args, "video", measure(args, dict(QUICK if args.quick else FULL)), markdown, plot)


if __name__ == "__main__":
    raise SystemExit(main())
