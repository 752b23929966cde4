"""Videos and audio made on the spot (PyAV, soundfile), for tests and
``bench/bench_video.py``: no downloads.

Every video frame carries its own number, written as :data:`BITS` black or
white stripes across the middle of its central square, so a decoded clip
(resized on the short side and centre-cropped, whatever its size) tells
which source frames it holds (:func:`frame_numbers`). Around the stripes,
a pattern slides, a square moves and a patch of noise changes from frame to
frame, so the encoder makes P- and B-frames of a realistic size.

Audio is a sum of sines with a known formula (:func:`tone`), so a decoded
clip can be compared sample for sample with what was written.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

#: Bits of the frame number in each frame (up to 4,095 frames).
BITS = 12


class _Frames:
    """Frames of one size: a smooth pattern twice as wide as the frame, slid
    along by the frame number, a moving square, a patch of noise that changes
    every frame, and the number's stripes. Made once, so a frame costs a copy."""

    def __init__(self, width: int, height: int, seed: int) -> None:
        self.width, self.height = width, height
        x = np.arange(2 * width, dtype=np.float32)[None, :]
        y = np.arange(height, dtype=np.float32)[:, None]
        base = np.empty((height, 2 * width, 3), np.uint8)
        base[..., 0] = (127 + 100 * np.sin(x / 37) + 0 * y).astype(np.uint8)
        base[..., 1] = (127 + 100 * np.cos(y / 23) + 0 * x).astype(np.uint8)
        base[..., 2] = ((x + y) % 256).astype(np.uint8)
        self.base = base
        rng = np.random.default_rng(seed)
        self.noise = rng.integers(0, 48, size=(height // 4 + 64, width // 4 + 64, 3), dtype=np.uint8)

    def __call__(self, number: int) -> np.ndarray:
        width, height = self.width, self.height
        shift = (number * 4) % width
        img = self.base[:, shift : shift + width].copy()
        phase = number * 0.05
        cx, cy = int(width / 2 + width / 3 * np.sin(phase)), int(height / 2 + height / 3 * np.cos(phase * 1.3))
        img[max(cy - 40, 0) : cy + 40, max(cx - 40, 0) : cx + 40] = (240, 200, 30)
        dy, dx = (number * 7) % 64, (number * 13) % 64
        patch = img[: height // 4, : width // 4]
        patch ^= self.noise[dy : dy + patch.shape[0], dx : dx + patch.shape[1]]
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        stripe = side // BITS
        band = img[top + side * 3 // 8 : top + side * 5 // 8]
        for bit in range(BITS):
            band[:, left + bit * stripe : left + (bit + 1) * stripe] = 255 if (number >> bit) & 1 else 0
        return img


def make_video(
    *,
    seconds: float = 4.0,
    fps: int = 30,
    width: int = 320,
    height: int = 240,
    gop: int | None = 30,
    container: str = "mp4",
    codec: str = "libx264",
    preset: str = "veryfast",
    seed: int = 0,
) -> bytes:
    """An encoded video whose frame ``i`` shows the number ``i`` (see the module).

    ``gop`` is the keyframe interval in frames (None: libx264's own
    choice, at most 250 frames with a keyframe at scene cuts); libx264 makes
    B-frames (as most H.264 on the web has) at every preset but
    ``ultrafast``.
    """
    import av

    frames = _Frames(width, height, seed)
    out = io.BytesIO()
    with av.open(out, "w", format=container) as box:
        stream = box.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, fps)
        if gop is not None:
            stream.codec_context.gop_size = gop
        if codec == "libx264":
            fixed = {"keyint": str(gop), "min-keyint": str(gop), "scenecut": "0"} if gop is not None else {}
            stream.options = {"preset": preset, **fixed}
        for number in range(round(seconds * fps)):
            frame = av.VideoFrame.from_ndarray(frames(number), format="rgb24")
            frame.pts = number
            box.mux(stream.encode(frame))
        box.mux(stream.encode())
    return out.getvalue()


def frame_numbers(clip: np.ndarray) -> list[int]:
    """The source frame number each frame of ``clip`` shows: ``clip`` is
    ``T x 3 x S x S`` (or a torch tensor of that shape), the centre square of
    videos from :func:`make_video`."""
    clip = np.asarray(clip)
    side = clip.shape[-1]
    stripe = side / BITS
    middle = clip.shape[-2] // 2
    numbers = []
    for frame in clip:
        luma = frame[:, middle - 2 : middle + 3].astype(np.float32).mean(axis=(0, 1))
        bits = [luma[int((bit + 0.5) * stripe)] > 127 for bit in range(BITS)]
        numbers.append(sum(1 << bit for bit, on in enumerate(bits) if on))
    return numbers


def tone(frames: int, rate: int, channels: int = 1) -> np.ndarray:
    """``frames x channels`` float32: a different pair of sines per channel."""
    t = np.arange(frames, dtype=np.float64) / rate
    columns = [0.4 * np.sin(2 * np.pi * (220 + 110 * c) * t) + 0.2 * np.sin(2 * np.pi * 1375 * t) for c in range(channels)]
    return np.stack(columns, axis=1).astype(np.float32)


def make_audio(
    *, seconds: float = 2.0, rate: int = 16000, channels: int = 1, format: str = "WAV", subtype: str | None = None
) -> bytes:
    """Encoded :func:`tone` audio (soundfile's ``format``: WAV, FLAC, OGG, MP3)."""
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, tone(round(seconds * rate), rate, channels), rate, format=format, subtype=subtype)
    return out.getvalue()
