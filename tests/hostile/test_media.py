"""Video and audio members that lie: frames larger than the header says, a
header that claims a duration its data does not hold, an audio header that
claims 2**35 samples, bytes that are no media at all, and random mutations.
Each is read by the entry points in a child process under a memory cap and
a timeout (see :mod:`tests.hostile.entry`); every one must end in a
shardkit error that names the shard and member (or a skip), never a foreign
exception, a crash or a hang, and within bounded memory."""

from __future__ import annotations

import io
import os
import struct

import av
import numpy as np
import pytest

from bench.harness.media import make_audio, make_video
from shardkit import ShardWriter
from shardkit.errors import MediaError, MediaTooLargeError
from shardkit.read.decoders.audio import decode_audio
from shardkit.transforms import DecodeAudioClip
from tests.hostile.conftest import run_entry

CAP_MB = 1024


def _good() -> dict[str, bytes]:
    return {"mp4": make_video(seconds=2, width=64, height=64, gop=15), "flac": make_audio(seconds=2, format="FLAC")}


def _dataset(root, bad: dict[str, bytes]) -> str:
    """Three samples with an ``mp4`` and a ``flac``; the middle one's are ``bad``."""
    good = _good()
    with ShardWriter(str(root)) as writer:
        writer.write({"__key__": "k0", **good})
        writer.write({"__key__": "k1", **good, **bad})
        writer.write({"__key__": "k2", **good})
    return str(root)


def _frames_larger_than_the_header() -> bytes:
    """Motion JPEG in AVI whose container says 64 x 64 while every frame's
    JPEG header says 30000 x 30000 (900 Mpx, 1.35 GB a frame in YUV)."""
    out = io.BytesIO()
    with av.open(out, "w", format="avi") as box:
        stream = box.add_stream("mjpeg", rate=10)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuvj420p"
        for i in range(10):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), i * 20, np.uint8), format="rgb24")
            frame.pts = i
            box.mux(stream.encode(frame))
        box.mux(stream.encode())
    data = bytearray(out.getvalue())
    at = data.find(b"\xff\xc0")  # every JPEG's start of frame: length, precision, height, width
    while at >= 0:
        data[at + 5 : at + 9] = struct.pack(">HH", 30000, 30000)
        at = data.find(b"\xff\xc0", at + 2)
    return bytes(data)


def _claims_more_than_it_holds(tmp_path) -> bytes:
    """An MP4 with its index first (``faststart``) claiming 10 s, cut 100
    bytes into its media data."""
    src = av.open(io.BytesIO(make_video(seconds=10, width=64, height=64, gop=30)))
    path = os.path.join(tmp_path, "faststart.mp4")
    with av.open(path, "w", format="mp4", options={"movflags": "faststart"}) as dst:
        stream = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                dst.mux(packet)
    data = open(path, "rb").read()
    assert data.find(b"moov") < data.find(b"mdat")
    return data[: data.find(b"mdat") + 100]


def _flac_claiming(samples: int) -> bytes:
    """A one-second FLAC whose STREAMINFO claims ``samples`` samples."""
    data = bytearray(make_audio(seconds=1, rate=8000, format="FLAC"))
    assert data[:4] == b"fLaC"
    (word,) = struct.unpack(">Q", data[18:26])  # rate, channels, bits, then 36 bits of total samples
    data[18:26] = struct.pack(">Q", (word & ~((1 << 36) - 1)) | samples)
    return bytes(data)


@pytest.fixture(scope="module")
def lying(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    return {
        "frames": _dataset(root / "frames", {"mp4": _frames_larger_than_the_header()}),
        "duration": _dataset(root / "duration", {"mp4": _claims_more_than_it_holds(root)}),
        "samples": _dataset(root / "samples", {"flac": _flac_claiming(1 << 35)}),
        "garbage": _dataset(root / "garbage", {"mp4": b"\x00\x00\x00\x18ftypmp42" + bytes(4000), "flac": b"fLaC" + bytes(100)}),
    }


@pytest.fixture(scope="module")
def baseline_mb(tmp_path_factory) -> float:
    """Peak RSS of a child decoding good clips: the cap's floor."""
    root = _dataset(tmp_path_factory.mktemp("plain") / "ds", {})
    got = run_entry("stream", root, options={"fused": "video_clip"})
    assert got.outcome == "ok" and len(got.samples) == 3, got.message or got.child_output[-2000:]
    return got.peak_rss_mb


@pytest.mark.parametrize(
    ("case", "fused", "error", "says"),
    [
        ("frames", "video_clip", "MediaError", "max_frame_pixels=89478485"),
        ("duration", "video_clip", "MediaError", "its header claims 10.000 s"),
        ("samples", "audio_clip", "MediaError", "could not seek to sample"),
        ("garbage", "video_clip", "MediaError", "not a video FFmpeg reads"),
        ("garbage", "audio_clip", "MediaError", "not audio libsndfile reads"),
    ],
)
def test_lying_media_is_refused_naming_shard_and_member(lying, baseline_mb, case, fused, error, says):
    got = run_entry("stream", lying[case], mem_mb=CAP_MB, options={"fused": fused})
    assert got.outcome == "error" and got.error_type == error, got.message or got.child_output[-2000:]
    member = "k1.mp4" if fused == "video_clip" else "k1.flac"
    assert f"member {member!r}" in got.message and "shard-" in got.message and says in got.message
    assert "on_error='skip'" in got.message
    assert got.peak_rss_mb < baseline_mb + 100


def test_an_audio_header_claiming_hours_allocates_nothing(lying, baseline_mb):
    got = run_entry("stream", lying["samples"], mem_mb=CAP_MB, options={"decode": "tensor"})
    assert got.outcome == "error" and got.error_type == "MediaTooLargeError", got.message or got.child_output[-2000:]
    assert "34,359,738,368 samples" in got.message and "max_audio_samples=67108864" in got.message
    assert "member 'k1.flac'" in got.message
    assert got.peak_rss_mb < baseline_mb + 100


@pytest.mark.parametrize(("entry", "case", "fused"), [("loader", "frames", "video_clip"), ("indexed", "samples", "audio_clip")])
def test_lying_media_is_skipped_under_skip(lying, entry, case, fused):
    got = run_entry(entry, lying[case], mem_mb=CAP_MB, on_error="skip", options={"fused": fused})
    assert got.outcome == "ok", got.message or got.child_output[-2000:]
    assert got.keys == ["k0", "k2"] and got.skipped == 1


def _damaged(data: bytes, kind: int, rng: np.random.Generator) -> bytes:
    """``data`` with bytes flipped (``kind`` 0), a run zeroed (1) or cut short (2)."""
    data = bytearray(data)
    if kind == 0:
        for at in rng.integers(0, len(data), size=8):
            data[at] ^= int(rng.integers(1, 256))
    elif kind == 1:
        at = int(rng.integers(0, len(data) - 64))
        data[at : at + 64] = bytes(64)
    else:
        data = data[: int(rng.integers(8, len(data)))]
    return bytes(data)


def test_mutated_media_only_ever_decodes_or_raises_a_shardkit_error(tmp_path):
    # 120 mutations of a small MP4 and FLAC (bytes flipped, runs zeroed,
    # cut short), read in one child under skip: any foreign exception, crash
    # or hang fails the run; what decodes is counted.
    rng = np.random.default_rng(0)
    good = _good()
    with ShardWriter(str(tmp_path / "fuzz")) as writer:
        for i in range(120):
            fields = {ext: _damaged(data, i % 3, rng) for ext, data in good.items()}
            writer.write({"__key__": f"m{i:03d}", **fields})
    for fused in ("video_clip", "audio_clip"):
        got = run_entry("stream", str(tmp_path / "fuzz"), mem_mb=CAP_MB, on_error="skip", timeout_s=120, options={"fused": fused})
        assert got.outcome == "ok", (fused, got.message or got.child_output[-2000:])
        assert len(got.samples) + got.skipped == 120 and got.skipped > 0, fused


#: WAV header fields (offset, struct format) that say how to read the rest.
_WAV_FIELDS = ((4, "<I"), (20, "<H"), (22, "<H"), (24, "<I"), (28, "<I"), (32, "<H"), (34, "<H"), (40, "<I"))


def test_mutated_audio_decoded_whole_only_ever_decodes_or_raises_a_shardkit_error(tmp_path):
    # The clips above cover FLAC; decode="tensor" decodes whole members of
    # every audio kind. 160 of them, WAV, FLAC, Ogg and MP3 in turn, damaged
    # as above or (a quarter) with a header word set to 0 or its largest
    # value (in a WAV: its sizes, channels, rate, bits), read in one child
    # under skip.
    rng = np.random.default_rng(1)
    good = {f.lower(): make_audio(seconds=1, rate=8000, format=f) for f in ("WAV", "FLAC", "OGG", "MP3")}
    with ShardWriter(str(tmp_path / "fuzz")) as writer:
        for i in range(160):
            ext = ("wav", "flac", "ogg", "mp3")[i % 4]
            kind = i // 4 % 4
            if kind < 3:
                data = _damaged(good[ext], kind, rng)
            else:
                data = bytearray(good[ext])
                fields = _WAV_FIELDS if ext == "wav" else [(int(rng.integers(4, 60)), "<I")]
                at, form = fields[int(rng.integers(len(fields)))]
                size = struct.calcsize(form)
                data[at : at + size] = struct.pack(form, int(rng.choice([0, 2 ** (8 * size) - 1])))
                data = bytes(data)
            writer.write({"__key__": f"a{i:03d}", ext: data})
    options = {"decode": "tensor"}
    got = run_entry("stream", str(tmp_path / "fuzz"), mem_mb=CAP_MB, on_error="skip", timeout_s=120, options=options)
    assert got.outcome == "ok", got.message or got.child_output[-2000:]
    assert len(got.samples) + got.skipped == 160 and got.skipped > 0 and len(got.samples) > 0


def test_limits_in_process_name_their_option():
    with pytest.raises(MediaTooLargeError) as caught:
        decode_audio(make_audio(seconds=1, rate=8000, channels=2), max_samples=1000)
    assert caught.value.unit == "samples" and caught.value.amount == 16000
    assert "16,000 samples, over the limit of 1,000 samples (max_audio_samples=1000)" in str(caught.value)
    with pytest.raises(MediaTooLargeError, match="a clip of 16,000 frames x 1 channels"):
        DecodeAudioClip(2.0, max_audio_samples=1000)(make_audio(seconds=4, rate=8000))
    with pytest.raises(MediaError, match="its header claims 34,359,738,368 frames|could not seek"):
        DecodeAudioClip(0.5, start=100.0)(_flac_claiming(1 << 35))
