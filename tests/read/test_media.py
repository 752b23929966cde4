"""Video clips and audio, decoded from members made in the tests
(bench/harness/media.py: every video frame shows its own number, audio is
a known sum of sines)."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import soundfile
import torch

import shardkit
from bench.harness.media import frame_numbers, make_audio, make_video, tone
from shardkit import ShardWriter
from shardkit.errors import MediaTooLargeError, UsageError
from shardkit.transforms import DecodeAudioClip, DecodeVideoClip, DecodeVideoClips, MapField

SOURCE_FPS = 30


@pytest.fixture(scope="module")
def video() -> bytes:
    """10 s at 30 frames per second, a keyframe every second, with B-frames."""
    return make_video(seconds=10, fps=SOURCE_FPS, width=192, height=144, gop=30)


def _expected(start: float, num_frames: int, fps: float, last: int) -> list[int]:
    """Source frames on screen at each time of a clip (the last one held)."""
    return [min(int((start + i / fps) * SOURCE_FPS + 1e-6), last) for i in range(num_frames)]


@pytest.mark.parametrize(("num_frames", "fps", "start"), [(8, 10, 0.0), (16, 8, 3.0), (6, 7, 5.43), (5, 60, 2.0)])
def test_clip_frames_are_one_over_fps_apart_from_the_start(video, num_frames, fps, start):
    clip = DecodeVideoClip(num_frames, fps=fps, size=64, start=start)(video)
    assert clip.shape == (num_frames, 3, 64, 64) and clip.dtype == torch.uint8
    assert frame_numbers(clip) == _expected(start, num_frames, fps, 299)


def test_center_start_and_rectangular_size(video):
    clip = DecodeVideoClip(4, fps=2, size=(48, 64), start="center")(video)
    assert clip.shape == (4, 3, 48, 64)
    room = 10 - 3 / 2
    # 192 x 144 scaled by 1/3 to 64 x 48, nothing cropped: the stripes are
    # in the centre square, columns 8 to 56.
    numbers = frame_numbers(clip[..., 8:56].contiguous())
    assert numbers == _expected(room / 2, 4, 2, 299)


def test_a_video_shorter_than_the_clip_holds_its_last_frame():
    short = make_video(seconds=1, fps=SOURCE_FPS, width=96, height=96, gop=30)
    clip = DecodeVideoClip(6, fps=4, size=32, start="random")(short)
    assert frame_numbers(clip) == [0, 7, 15, 22, 29, 29]


def test_only_the_keyframe_interval_before_the_clip_is_decoded(video):
    # Keyframes every 30 frames: a clip at 8.5 s needs at most the 30 frames
    # from the keyframe at 8 s, plus its own span of 0.7 s (21 frames) and
    # one more, whatever the video's length; the whole file is 300 frames.
    tight = DecodeVideoClip(8, fps=10, size=32, start=8.5, max_decoded_frames=60, skip_nonref=False)
    assert frame_numbers(tight(video)) == _expected(8.5, 8, 10, 299)
    # With one keyframe at the start, the same clip needs every frame before it.
    one_keyframe = make_video(seconds=10, fps=SOURCE_FPS, width=96, height=96, gop=300)
    with pytest.raises(MediaTooLargeError, match=r"max_decoded_frames=60") as caught:
        tight(one_keyframe)
    assert caught.value.limit == 60 and caught.value.unit == "frames"


def test_skipping_unreferenced_frames_gives_the_same_clip(video):
    for start in (0.0, 1.234, 4.5, 9.2):
        fast = DecodeVideoClip(8, fps=12, size=48, start=start)(video)
        full = DecodeVideoClip(8, fps=12, size=48, start=start, skip_nonref=False)(video)
        assert torch.equal(fast, full), start


def test_webm_without_a_stream_duration_is_measured_from_its_packets():
    webm = make_video(seconds=3, fps=25, width=96, height=96, gop=25, container="webm", codec="libvpx-vp9")
    clip = DecodeVideoClip(5, fps=5, size=32, start="center")(webm)
    # 3 s, a span of 0.8 s: starts at 1.1 s, frame 27 of 25 per second.
    assert frame_numbers(clip) == [int((1.1 + i / 5) * 25 + 1e-6) for i in range(5)]


def test_evaluation_clips_are_spread_from_the_start_to_the_end(video):
    clips = DecodeVideoClips(4, fps=5, size=32, clips=3)(video)
    assert clips.shape == (3, 4, 3, 32, 32)
    room = 10 - 3 / 5
    assert [frame_numbers(c) for c in clips] == [_expected(s, 4, 5, 299) for s in (0, room / 2, room)]
    one = DecodeVideoClips(4, fps=5, size=32, clips=1)(video)
    assert frame_numbers(one[0]) == frame_numbers(DecodeVideoClip(4, fps=5, size=32, start="center")(video))


def _video_shards(tmp_path, count: int = 6) -> str:
    dest = str(tmp_path / "videos")
    with ShardWriter(dest, max_samples=3) as writer:
        for i in range(count):
            data = make_video(seconds=4, fps=SOURCE_FPS, width=96, height=96, gop=15, seed=i)
            writer.write({"__key__": f"v{i}", "mp4": data, "cls": i})
    return dest


def _clips(dest: str, epoch: int, *, num_workers: int = 0, seed: int = 7) -> dict[str, list[int]]:
    ds = shardkit.ShardDataset(
        dest,
        seed=seed,
        decode=None,
        map=MapField("mp4", DecodeVideoClip(4, fps=4, size=48)),
    )
    ds.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers)
    return {s["__key__"]: frame_numbers(s["mp4"]) for s in loader}


def test_random_starts_depend_on_seed_epoch_and_sample_only(tmp_path):
    dest = _video_shards(tmp_path)
    first = _clips(dest, 0)
    assert len(first) == 6
    # The same seed and epoch give the same clips, whatever the workers.
    assert _clips(dest, 0, num_workers=2) == first
    torch.manual_seed(123)  # the global generator is not what draws them
    assert _clips(dest, 0) == first
    # Another epoch, or another seed, moves them.
    later = _clips(dest, 1)
    assert sum(later[k] != first[k] for k in first) >= 5
    assert sum(_clips(dest, 0, seed=8)[k] != first[k] for k in first) >= 5
    # Samples differ from one another, and every clip is 4 frames 1/4 s apart.
    assert len({tuple(c) for c in first.values()}) == 6
    for clip in [*first.values(), *later.values()]:
        assert [b - a for a, b in zip(clip, clip[1:])] in ([7, 8, 7], [8, 7, 8], [7, 7, 8], [8, 7, 7], [7, 8, 8])


def test_outside_a_reader_random_starts_come_from_torch(video):
    transform = DecodeVideoClip(2, fps=10, size=32)
    torch.manual_seed(5)
    once = frame_numbers(transform(video))
    torch.manual_seed(5)
    assert frame_numbers(transform(video)) == once


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        ((0, 8, 224), {}, "num_frames must be a positive int"),
        ((8, 0, 224), {}, "fps must be a positive float"),
        ((8, float("inf"), 224), {}, "fps must be a positive float"),
        ((8, 8, (224,)), {}, r"size must be an int or \(height, width\)"),
        ((8, 8, 224), {"start": "middle"}, "start must be 'random', 'center' or seconds"),
        ((8, 8, 224), {"start": -1.0}, "start must be"),
        ((8, 8, 224), {"max_decoded_frames": 4}, "max_decoded_frames=4 is fewer than num_frames=8"),
        ((8, 8, 224), {"threads": 0}, "threads must be a positive int"),
    ],
)
def test_bad_clip_options_are_refused(args, options, message):
    with pytest.raises(UsageError, match=message):
        DecodeVideoClip(*args, **options)


def test_evaluation_clips_take_no_start():
    with pytest.raises(UsageError, match="takes no start"):
        DecodeVideoClips(8, 8, 224, start=1.0)


# ------------------------------------------------------------------- audio


def _wav(frames: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, frames, rate, format="WAV", subtype="FLOAT")
    return out.getvalue()


def test_decode_tensor_gives_audio_as_huggingface_names_it(tmp_path):
    stereo = tone(8000, 8000, channels=2)
    encoded = {
        "wav": _wav(stereo, 8000),
        "flac": make_audio(seconds=1, rate=8000, channels=2, format="FLAC"),
        "ogg": make_audio(seconds=1, rate=8000, channels=2, format="OGG", subtype="VORBIS"),
        "opus": make_audio(seconds=1, rate=48000, channels=2, format="OGG", subtype="OPUS"),
        "mp3": make_audio(seconds=1, rate=16000, channels=2, format="MP3"),
    }
    dest = str(tmp_path / "audio")
    with ShardWriter(dest) as writer:
        writer.write({"__key__": "a", **encoded})
    (sample,) = list(shardkit.ShardDataset(dest, decode="tensor"))
    wav = sample["wav"]
    assert set(wav) == {"array", "sampling_rate"} and wav["sampling_rate"] == 8000
    assert wav["array"].dtype == torch.float32 and wav["array"].shape == (2, 8000)
    assert torch.equal(wav["array"], torch.from_numpy(stereo.T.copy()))  # float WAV: the very samples
    flac = sample["flac"]["array"]
    assert flac.shape == (2, 8000) and float((flac - torch.from_numpy(stereo.T.copy())).abs().max()) < 1 / 16000
    for ext, rate in (("ogg", 8000), ("opus", 48000), ("mp3", 16000)):  # lossy: the same tone, near enough
        got = sample[ext]
        assert got["sampling_rate"] == rate and got["array"].shape[0] == 2, ext
        reference = tone(got["array"].shape[1], rate, channels=2).T
        middle = slice(got["array"].shape[1] // 4, got["array"].shape[1] * 3 // 4)
        correlation = max(
            np.corrcoef(got["array"][0, middle].numpy()[lag:], reference[0, middle][: reference[0, middle].size - lag])[0, 1]
            for lag in range(0, 2000, 1)
        )
        assert correlation > 0.9, (ext, correlation)
    # decode="pil" (and Decoder's default) leaves audio as bytes.
    (raw,) = list(shardkit.ShardDataset(dest, decode="pil"))
    assert raw["wav"] == encoded["wav"]


def test_audio_clip_is_the_exact_span_and_pads_a_short_input():
    frames = tone(16000, 8000, channels=2)
    wav = _wav(frames, 8000)
    clip = DecodeAudioClip(0.5, start=0.25)(wav)
    assert clip["sampling_rate"] == 8000 and clip["array"].shape == (2, 4000)
    assert torch.equal(clip["array"], torch.from_numpy(frames[2000:6000].T.copy()))
    mono = DecodeAudioClip(0.5, start=0.25, mono=True)(wav)["array"]
    assert mono.shape == (1, 4000) and torch.allclose(mono[0], torch.from_numpy(frames[2000:6000].mean(axis=1)))
    padded = DecodeAudioClip(3.0, start="random")(wav)["array"]  # 2 s of audio in a 3 s clip
    assert padded.shape == (2, 24000) and torch.equal(padded[:, :16000], torch.from_numpy(frames.T.copy()))
    assert not padded[:, 16000:].any()


def test_an_mp3_clip_is_its_span_of_the_whole_decode():
    # libsndfile's mp3 seek lands up to a second off: the clip is reached by
    # decoding up to it, so it holds the samples a whole decode has there.
    rate = 22050
    frames = tone(rate * 12, rate, channels=2) + np.random.default_rng(1).normal(0, 0.05, (rate * 12, 2)).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, frames, rate, format="MP3")
    whole = shardkit.Decoder(audio="tensor").function_for("mp3")(out.getvalue())["array"]
    for start in (0.0, 3.3, 7.31):
        clip = DecodeAudioClip(1.0, start=start)(out.getvalue())["array"]
        first = round(start * rate)
        assert torch.allclose(clip, whole[:, first : first + rate], rtol=0, atol=1e-6), start  # float rounding


def test_audio_clip_resamples_to_the_asked_rate():
    rate, to = 44100, 16000
    t = np.arange(rate * 2) / rate
    frames = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[:, None]
    clip = DecodeAudioClip(1.0, sampling_rate=to, start=0.5)(_wav(frames, rate))
    assert clip["sampling_rate"] == to and clip["array"].shape == (1, to)
    spectrum = np.abs(np.fft.rfft(clip["array"][0].numpy()))
    assert abs(np.argmax(spectrum) * to / to - 440) <= 1  # 1 s: bins are 1 Hz
    expected = 0.5 * np.sin(2 * np.pi * 440 * (np.arange(to) / to + 0.5))
    assert np.abs(clip["array"][0].numpy()[100:-100] - expected[100:-100]).max() < 0.01


def test_audio_clip_starts_follow_the_sample_generator(tmp_path):
    dest = str(tmp_path / "speech")
    frames = tone(8000 * 6, 8000)
    with ShardWriter(dest) as writer:
        for i in range(4):
            writer.write({"__key__": f"u{i}", "wav": _wav(frames, 8000)})

    def starts(epoch: int, num_workers: int = 0) -> dict[str, int]:
        ds = shardkit.ShardDataset(dest, seed=3, map=MapField("wav", DecodeAudioClip(0.5)))
        ds.set_epoch(epoch)
        out = {}
        for s in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers):
            got = s["wav"]["array"][0].numpy()
            out[s["__key__"]] = next(i for i in range(len(frames)) if np.array_equal(frames[i : i + 4000, 0], got))
        return out

    first = starts(0)
    assert starts(0, num_workers=2) == first and len(set(first.values())) == 4
    assert sum(a != b for a, b in zip(first.values(), starts(1).values())) >= 3


def test_audio_options_are_checked():
    with pytest.raises(UsageError, match="seconds must be a positive float"):
        DecodeAudioClip(0)
    with pytest.raises(UsageError, match="sampling_rate must be a positive int"):
        DecodeAudioClip(1.0, sampling_rate=16000.5)
    with pytest.raises(UsageError, match="Decoder audio must be 'tensor' or None"):
        shardkit.Decoder(audio="numpy")


def test_without_the_media_extra_the_error_names_it(tmp_path):
    script = (
        "import sys; sys.modules['av'] = None; sys.modules['soundfile'] = None\n"
        "from shardkit.transforms import DecodeVideoClip, DecodeAudioClip\n"
        "from shardkit.read.decode import Decoder\n"
        "for fn in (DecodeVideoClip(2, 2, 8), DecodeAudioClip(1.0), Decoder(audio='tensor').function_for('wav')):\n"
        "    try:\n"
        "        fn(b'x')\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.strip().splitlines()
    assert lines == [
        "decoding video needs PyAV, which is not installed: pip install 'shardkit[media]'",
        "decoding audio needs soundfile, which is not installed: pip install 'shardkit[media]'",
        "decoding audio needs soundfile, which is not installed: pip install 'shardkit[media]'",
    ]
