"""Writing video datasets: a folder of videos with caption sidecars, and
clips extracted while writing by a ``--map`` function."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardkit
from bench.harness.media import frame_numbers, make_audio, make_video
from shardkit.transforms import DecodeVideoClip, MapField

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory) -> str:
    """Five videos of 2-4 s with a ``.json`` and a ``.txt`` each, and a ``.flac`` for two."""
    folder = tmp_path_factory.mktemp("videos") / "raw"
    os.makedirs(folder / "part")
    for i in range(5):
        base = folder / ("part" if i % 2 else ".") / f"clip{i}"
        base.with_suffix(".mp4").write_bytes(make_video(seconds=2 + i % 3, width=96, height=96, gop=15, seed=i))
        base.with_suffix(".json").write_text(json.dumps({"caption": f"video <b>{i}</b>", "fps": 30}))
        base.with_suffix(".txt").write_text(f"video {i}")
        if i < 2:
            base.with_suffix(".flac").write_bytes(make_audio(seconds=1, format="FLAC"))
    return str(folder)


def _cli(*args: str, cwd: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (pythonpath, ROOT) if p))
    return subprocess.run(
        [sys.executable, "-m", "shardkit", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def _files(folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` by (key, extension): the directory
    source's key is the basename up to its first dot, wherever it sits."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            out[tuple(name.split(".", 1))] = open(os.path.join(root, name), "rb").read()
    return out


def test_a_folder_of_videos_with_sidecars_packs_as_a_directory(video_folder, tmp_path):
    done = _cli("write", video_folder, str(tmp_path / "shards"), "-q", "--max-samples", "2", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    manifest = shardkit.load_manifest(str(tmp_path / "shards"))
    assert manifest.num_samples == 5 and len(manifest.shards) == 3
    assert set(manifest.extensions) == {"flac", "json", "mp4", "txt"}
    stored = {}
    for sample in shardkit.ShardDataset(str(tmp_path / "shards"), shuffle=False, decode=None):
        for ext, value in sample.items():
            if not ext.startswith("__"):
                stored[(sample["__key__"], ext)] = value
    assert stored == _files(video_folder)  # every file, byte for byte, grouped by its name
    ds = shardkit.ShardDataset(
        str(tmp_path / "shards"), decode=shardkit.Decoder(image=None), map=MapField("mp4", DecodeVideoClip(4, fps=4, size=48))
    )
    clips = {s["__key__"]: (s["mp4"], s["json"]["caption"]) for s in ds}
    assert {k: c for k, (_, c) in clips.items()} == {
        f"clip{i}": f"video <b>{i}</b>" for i in range(5)
    }
    assert all(clip.shape == (4, 3, 48, 48) for clip, _ in clips.values())


MAP_MODULE = '''
from shardkit.transforms import DecodeVideoClip

CLIP = DecodeVideoClip(6, fps=5, size=48, start="center")


def extract(sample):
    """One clip per video, stored as uint8 npy, with its caption."""
    if "mp4" not in sample:
        return None
    return {"__key__": sample["__key__"], "clip.npy": CLIP(sample["mp4"]).contiguous().numpy(), "txt": sample["txt"]}
'''


def test_clips_are_extracted_while_writing_with_map_the_same_whatever_the_workers(video_folder, tmp_path):
    (tmp_path / "prep.py").write_text(textwrap.dedent(MAP_MODULE))
    digests = []
    for workers in ("1", "2"):
        dest = tmp_path / f"clips{workers}"
        done = _cli(
            "write", video_folder, str(dest), "-q", "--map", "prep:extract", "--workers", workers,
            cwd=str(tmp_path), pythonpath=str(tmp_path),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        digests.append({e.path: e.sha256 for e in shardkit.load_manifest(str(dest)).shards})
    assert digests[0] == digests[1]  # byte-reproducible: the same shards with 1 and 2 workers
    files = _files(video_folder)
    reference = DecodeVideoClip(6, fps=5, size=48, start="center")
    seen = set()
    for sample in shardkit.ShardDataset(str(tmp_path / "clips1"), shuffle=False, decode="tensor"):
        key = sample["__key__"]
        clip = sample["clip.npy"]
        assert clip.dtype == np.uint8 and clip.shape == (6, 3, 48, 48)
        assert np.array_equal(clip, reference(files[(key, "mp4")]).contiguous().numpy())
        assert frame_numbers(clip) == frame_numbers(reference(files[(key, "mp4")]))
        assert sample["txt"] == files[(key, "txt")].decode()
        seen.add(key)
    assert seen == {f"clip{i}" for i in range(5)}
