"""Video clips decoded from the keyframe before them, at a given frame rate
and size (PyAV, which bundles FFmpeg).

A training step on video wants a short clip: 16 frames at 8 frames per
second is two seconds of a video that may run for minutes. webdataset's
``torch_video`` (torchvision's ``read_video``, gone since torchvision 0.24)
decoded and converted every frame of the file and left the clip to a later
step. :class:`DecodeVideoClip` chooses the clip first, from the duration in
the container's header, then seeks to the keyframe at or before its start,
decodes up to its last frame and stops. Only the frames the clip keeps are
converted to RGB, resized on the short side and centre-cropped, so memory is
the clip's and the decoder's reference frames, not the video's.

Before the clip starts, frames that no other frame refers to (most B-frames)
are not decoded at all (FFmpeg's ``skip_frame``); ``skip_nonref=False``
decodes them too.

Which frame is a clip's frame at time ``t``: the one on screen at ``t``, the
last frame whose timestamp is at or before ``t`` (torchcodec's "frames
played at"). Frame ``i`` of a clip starting at ``s`` is the frame at
``s + i / fps``.

A video shorter than the clip repeats its last frame to fill it (the
clip's length in frames is what a batch needs; a model sees a held last
frame, as a player shows one). A video whose frames end before the start of
a clip chosen inside the duration its header claims lies about that duration:
that is a :class:`~shardkit.errors.MediaError`.

Limits, checked before the work they bound: each frame's pixels (the
header's and every decoded frame's; FFmpeg's own ``max_pixels`` is set too,
so the decoder refuses to allocate a larger frame), and the frames decoded
for one clip. Past either, :class:`~shardkit.errors.ImageTooLargeError` or
:class:`~shardkit.errors.MediaTooLargeError`, which ``on_error="skip"``
skips like any corrupt sample.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from shardkit.errors import ImageTooLargeError, MediaError, MediaTooLargeError, UsageError
from shardkit.read.decoders.images import DEFAULT_MAX_IMAGE_PIXELS
from shardkit.read.decoders.media import Start, check_limit, check_positive, check_size, check_start, clip_start, require

__all__ = ["DEFAULT_MAX_DECODED_FRAMES", "VIDEO_EXTENSIONS", "DecodeVideoClip", "DecodeVideoClips"]

#: Field extensions of the containers these transforms are meant for (any
#: container FFmpeg reads decodes; these are the ones tools look for).
VIDEO_EXTENSIONS = frozenset({"mp4", "webm", "mkv", "avi", "mov", "m4v"})

#: Most frames decoded for one clip by default: a keyframe interval of 10 s
#: at 60 frames per second with a 10-second clip after it, and some.
DEFAULT_MAX_DECODED_FRAMES = 2048

#: Timestamps closer than this (seconds) are the same time.
_EPS = 1e-6


class _Video:
    """One open video member: its main video stream, checked, and frames
    at given times."""

    def __init__(self, data: bytes, *, max_frame_pixels: int | None, threads: int) -> None:
        self._av = require("av")
        self._errors = self._av.FFmpegError
        self._data = data
        self.max_frame_pixels = max_frame_pixels
        self.threads = threads
        self._open()
        stream = self.stream
        self.time_base = stream.time_base or Fraction(1, 1_000_000)
        self.first = float(stream.start_time * self.time_base) if stream.start_time is not None else 0.0
        rate = stream.average_rate or stream.guessed_rate
        self.frame_interval = 1 / float(rate) if rate else None
        self.claimed: float | None = None

    def _open(self) -> None:
        """Open the member (again), its main video stream checked and set up."""
        try:
            self.container = self._av.open(io.BytesIO(self._data), mode="r", metadata_errors="ignore")
        except (self._errors, UnicodeDecodeError) as exc:
            raise MediaError.of(f"not a video FFmpeg reads ({exc})") from None
        try:
            # FFmpeg's pick of the video streams: the main one, not cover art.
            stream = self.container.streams.best("video")
            if stream is None:
                raise MediaError.of("no video stream")
            self.stream = stream
            codec = stream.codec_context
            if codec is None:
                raise MediaError.of("its video stream is in no codec FFmpeg decodes")
            if codec.width and codec.height:
                self.check_pixels(codec.width, codec.height, "video header gives")
            if self.max_frame_pixels is not None:
                codec.options = {"max_pixels": str(self.max_frame_pixels)}
            stream.thread_count = self.threads
        except BaseException:
            self.container.close()
            raise

    def _rewind(self, seconds: float) -> None:
        """Go to the keyframe at or before ``seconds`` (absolute); a member
        that cannot seek (a raw stream) is opened again, to decode from its
        start."""
        try:
            self.container.seek(int(seconds / self.time_base), stream=self.stream, backward=True)
        except self._errors:
            self.container.close()
            self._open()

    def close(self) -> None:
        self.container.close()

    def __enter__(self) -> _Video:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_pixels(self, width: int, height: int, what: str) -> None:
        pixels = int(width) * int(height)
        if self.max_frame_pixels is not None and pixels > self.max_frame_pixels:
            raise ImageTooLargeError.over_limit(
                f"{what} {width} x {height} = {pixels:,} pixels a frame",
                limit=self.max_frame_pixels,
                option="max_frame_pixels",
                amount=pixels,
            )

    def duration(self) -> float:
        """Seconds from the first frame to the end of the last: the stream
        header's, or, where it has none (Matroska, WebM), the end of its last
        packet, found by reading packets without decoding them."""
        if self.claimed is None:
            self.claimed = self._duration()
        return self.claimed

    def _duration(self) -> float:
        stream = self.stream
        if stream.duration:
            return float(stream.duration * self.time_base)
        end = None
        try:
            for packet in self.container.demux(stream):
                if packet.pts is not None:
                    last = packet.pts + (packet.duration or 0)
                    end = last if end is None else max(end, last)
        except self._errors as exc:
            raise MediaError.of(f"FFmpeg could not read its packets ({exc})") from None
        self._rewind(self.first)
        if end is None:
            raise MediaError.of("no video packet has a timestamp")
        return max(float(end * self.time_base) - self.first, 0.0)

    def frames_at(
        self, times: Sequence[float], out_hw: tuple[int, int], *, max_decoded: int | None, skip_nonref: bool
    ) -> list[np.ndarray]:
        """The frames on screen at each of ``times`` (ascending seconds from
        the first frame), each resized to cover ``out_hw`` and centre-cropped
        to it, as ``H x W x 3`` uint8 arrays.

        Raises:
            MediaTooLargeError: More than ``max_decoded`` frames decoded.
            MediaError: No frame decodes, the frames end before the first
                time, or FFmpeg fails.
        """
        first = times[0] + self.first
        if times[0] > _EPS:
            self._rewind(first)
        stream, codec = self.stream, self.stream.codec_context  # a rewind may have opened it again
        # Frames before the clip that nothing refers to need no decoding;
        # two frame intervals of margin keep the frame on screen at its start.
        skip_until = first - 2 * self.frame_interval if skip_nonref and self.frame_interval else None
        skipping = False
        out: list[np.ndarray] = []
        decoded = 0
        held: Any = None  # the last frame decoded, and its conversion once made
        held_rgb: np.ndarray | None = None
        try:
            for packet in self.container.demux(stream):
                if skip_until is not None:
                    early = packet.pts is not None and float(packet.pts * self.time_base) < skip_until
                    if early != skipping:
                        codec.skip_frame = "NONREF" if early else "DEFAULT"
                        skipping = early
                for frame in packet.decode():
                    decoded += 1
                    if max_decoded is not None and decoded > max_decoded:
                        raise MediaTooLargeError.over_limit(
                            f"a clip at {times[0]:.3f} s needs more than {max_decoded:,} frames decoded",
                            limit=max_decoded,
                            option="max_decoded_frames",
                            amount=decoded,
                        )
                    self.check_pixels(frame.width, frame.height, "a decoded frame has")
                    at = self._time(frame, held)
                    while len(out) < len(times) and at > times[len(out)] + self.first + _EPS:
                        if held is None:  # the seek landed after the time: the first frame is the nearest
                            held, held_rgb = frame, None
                        if held_rgb is None:
                            held_rgb = _cover_crop(held, out_hw)
                        out.append(held_rgb)
                    if len(out) == len(times):
                        return out
                    held, held_rgb = frame, None
        except self._errors as exc:
            refused = (
                f"; FFmpeg refuses a frame over max_frame_pixels={self.max_frame_pixels} this way too"
                if self.max_frame_pixels is not None
                else ""
            )
            raise MediaError.of(f"FFmpeg could not decode it ({exc}{refused})") from None
        if held is None:
            raise MediaError.of(f"no frame decodes from the keyframe before {times[0]:.3f} s{self._claim()}")
        ended = float(held.time) - self.first if held.time is not None else None
        if ended is not None and self.frame_interval and ended + self.frame_interval < times[0] - _EPS:
            raise MediaError.of(
                f"its frames end at {ended:.3f} s, before the clip's start at {times[0]:.3f} s{self._claim()}"
            )
        last = held_rgb if held_rgb is not None else _cover_crop(held, out_hw)
        return out + [last] * (len(times) - len(out))  # shorter than the clip: hold the last frame

    def _claim(self) -> str:
        return f" (its header claims {self.claimed:.3f} s)" if self.claimed is not None else ""

    def _time(self, frame: Any, before: Any) -> float:
        """A frame's timestamp in seconds; one frame interval after the one
        before where the frame has none."""
        if frame.time is not None:
            return float(frame.time)
        if before is not None and before.time is not None and self.frame_interval:
            frame.pts = before.pts + round(self.frame_interval / self.time_base)
            return float(frame.time)
        raise MediaError.of("a frame has no timestamp and the stream no frame rate")


def _cover_crop(frame: Any, out_hw: tuple[int, int]) -> np.ndarray:
    """``frame`` resized to cover ``out_hw`` (the short side matching) and
    centre-cropped to it: an ``H x W x 3`` uint8 RGB array."""
    out_h, out_w = out_hw
    scale = max(out_w / frame.width, out_h / frame.height)
    width, height = max(out_w, round(frame.width * scale)), max(out_h, round(frame.height * scale))
    rgb = frame.reformat(width=width, height=height, format="rgb24", interpolation="BILINEAR").to_ndarray()
    top, left = (height - out_h) // 2, (width - out_w) // 2
    return rgb[top : top + out_h, left : left + out_w]


class DecodeVideoClip:
    """Encoded video bytes -> a clip: a uint8 tensor ``num_frames x 3 x H x W``.

    Frames are ``1 / fps`` seconds apart, resized on the short side to cover
    ``size`` and centre-cropped. Used as a ``map`` on a video field:
    ``map=MapField("mp4", DecodeVideoClip(16, fps=8, size=224))``, with the
    field read as bytes (video fields are never decoded by ``decode=``).

    Args:
        num_frames: Frames in a clip.
        fps: Frames per second of the clip (the source's own rate does not
            matter: frames are taken at the clip's times).
        size: Output ``size x size``, or ``(height, width)``.
        start: ``"random"``: a start drawn uniformly where the whole clip
            fits, from the sample's seeded generator under
            :class:`~shardkit.ShardDataset` (the same for the same seed,
            epoch and sample; see :mod:`shardkit.read.sample_rng`);
            ``"center"``: the middle of the video (evaluation); or seconds
            from the first frame.
        max_frame_pixels: Most pixels a frame may have; default the image
            limit (89,478,485); None for no limit of ours.
        max_decoded_frames: Most frames decoded for one clip (the keyframe
            interval before it included); None for no limit.
        threads: FFmpeg decoding threads per call; 1 suits DataLoader
            workers, which are the parallelism.
        skip_nonref: Skip decoding frames before the clip that no other
            frame refers to.

    The tensor's memory is channels-last per frame, as the image transforms
    give; ``.contiguous()`` makes plain ``T x C x H x W`` order.
    """

    def __init__(
        self,
        num_frames: int,
        fps: float,
        size: int | Sequence[int],
        *,
        start: Start = "random",
        max_frame_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
        max_decoded_frames: int | None = DEFAULT_MAX_DECODED_FRAMES,
        threads: int = 1,
        skip_nonref: bool = True,
    ) -> None:
        self.num_frames = check_positive(num_frames, "num_frames")
        self.fps = float(check_positive(fps, "fps", float))
        self.size = check_size(size)
        self.start = check_start(start)
        self.max_frame_pixels = check_limit(max_frame_pixels, "max_frame_pixels")
        self.max_decoded_frames = check_limit(max_decoded_frames, "max_decoded_frames")
        if self.max_decoded_frames is not None and self.max_decoded_frames < self.num_frames:
            raise UsageError(f"max_decoded_frames={self.max_decoded_frames} is fewer than num_frames={num_frames}")
        self.threads = check_positive(threads, "threads")
        self.skip_nonref = bool(skip_nonref)

    @property
    def span(self) -> float:
        """Seconds from a clip's first frame to its last."""
        return (self.num_frames - 1) / self.fps

    def __call__(self, data: bytes | bytearray | memoryview) -> torch.Tensor:
        """Decode one clip of ``data``.

        Raises:
            ImportError: PyAV is not installed (the message names the extra).
            ImageTooLargeError: A frame over ``max_frame_pixels``.
            MediaTooLargeError: The clip needs more than ``max_decoded_frames``.
            MediaError: Not a video, or it does not decode as its header says.
        """
        with self._open(data) as video:
            return self._clips(video, [clip_start(self.start, video.duration() - self.span)])[0]

    def _open(self, data: bytes | bytearray | memoryview) -> _Video:
        return _Video(bytes(data), max_frame_pixels=self.max_frame_pixels, threads=self.threads)

    def _clips(self, video: _Video, starts: Sequence[float]) -> list[torch.Tensor]:
        out = []
        for start in starts:
            times = [start + i / self.fps for i in range(self.num_frames)]
            frames = video.frames_at(
                times, self.size, max_decoded=self.max_decoded_frames, skip_nonref=self.skip_nonref
            )
            out.append(torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2))
        return out

    def _options(self) -> str:
        return f"{self.num_frames}, fps={self.fps:g}, size={self.size}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._options()}, start={self.start!r})"


class DecodeVideoClips(DecodeVideoClip):
    """The evaluation variant: ``clips`` clips spread evenly over the video,
    as a uint8 tensor ``clips x num_frames x 3 x H x W`` (the first clip at
    the start, the last ending at the end; one clip is the centre one).

    Each clip seeks to its own keyframe, so the cost is ``clips`` times one
    clip's, not the whole video's. Arguments as :class:`DecodeVideoClip`'s,
    without ``start``; ``max_decoded_frames`` bounds each clip.
    """

    def __init__(self, num_frames: int, fps: float, size: int | Sequence[int], *, clips: int = 3, **options: Any):
        if "start" in options:
            raise UsageError("DecodeVideoClips spreads its clips over the video; it takes no start")
        super().__init__(num_frames, fps, size, start="center", **options)
        self.clips = check_positive(clips, "clips")

    def __call__(self, data: bytes | bytearray | memoryview) -> torch.Tensor:
        """Decode the clips of ``data``; raises as :meth:`DecodeVideoClip.__call__`."""
        with self._open(data) as video:
            room = max(video.duration() - self.span, 0.0)
            starts = [room / 2] if self.clips == 1 else list(np.linspace(0.0, room, self.clips))
            return torch.stack(self._clips(video, starts))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._options()}, clips={self.clips})"
