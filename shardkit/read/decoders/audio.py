"""Audio members as tensors, whole or as clips (soundfile, which bundles
libsndfile; soxr for resampling).

Both give Hugging Face ``datasets``' names: ``{"array": float32 tensor
channels x samples, "sampling_rate": int}``.

- ``decode="tensor"`` decodes a whole ``wav``, ``flac``, ``mp3``, ``ogg``
  (Vorbis or Opus) or ``opus`` member (:func:`decode_audio`).
- :class:`DecodeAudioClip` decodes ``seconds`` of it: libsndfile seeks to the
  clip's first sample and decodes that span alone (wav, flac, Ogg Vorbis
  and Opus, where its seeking is exact), then resamples it if asked. In an
  mp3, whose seeking in libsndfile lands up to a second off, the samples
  before the clip are decoded and dropped a block at a time instead. An
  input shorter than the clip is padded with silence at the end.

Limits: the samples decoded at once (``max_audio_samples``, all channels
together) are checked against the header's count before anything is read,
so a header that claims hours allocates nothing. A header that claims more
than its data holds is found when a clip chosen inside the claim reads
nothing there: a :class:`~shardkit.errors.MediaError`.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from shardkit.errors import MediaError, MediaTooLargeError
from shardkit.read.decoders.media import Start, check_limit, check_positive, check_start, clip_start, require

__all__ = ["AUDIO_EXTENSIONS", "DEFAULT_MAX_AUDIO_SAMPLES", "DecodeAudioClip", "decode_audio"]

#: Field extensions ``decode="tensor"`` decodes as audio.
AUDIO_EXTENSIONS = frozenset({"wav", "flac", "mp3", "ogg", "opus"})

#: Most samples (all channels) decoded at once by default: 2**26 float32
#: values, 256 MiB, 23 minutes of 48 kHz stereo.
DEFAULT_MAX_AUDIO_SAMPLES = 2**26


def _open(data: bytes) -> Any:
    soundfile = require("soundfile")
    try:
        return soundfile.SoundFile(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise MediaError.of(f"not audio libsndfile reads ({exc})") from None


def _check_samples(frames: int, channels: int, limit: int | None, what: str) -> None:
    samples = frames * channels
    if limit is not None and samples > limit:
        raise MediaTooLargeError.over_limit(
            f"{what} {frames:,} frames x {channels} channels = {samples:,} samples",
            limit=limit,
            option="max_audio_samples",
            amount=samples,
            unit="samples",
        )


def _read(f: Any, frames: int) -> np.ndarray:
    """Up to ``frames`` frames from ``f``'s position, ``frames x channels`` float32."""
    try:
        return f.read(frames, dtype="float32", always_2d=True)
    except (RuntimeError, ValueError) as exc:
        raise MediaError.of(f"libsndfile could not decode it ({exc})") from None


#: Formats whose seeking libsndfile does not make sample-exact (mp3 lands
#: up to a second off): a clip there is reached by decoding up to it.
_INEXACT_SEEK = frozenset({"MP3"})

#: Frames decoded and dropped at a time on the way to a clip.
_SKIP_BLOCK = 1 << 16


def _go_to(f: Any, frame: int) -> None:
    """Move ``f`` to ``frame``: a seek, or, where seeking is not exact,
    decoding up to it a block at a time."""
    try:
        if f.format not in _INEXACT_SEEK:
            f.seek(frame)
            return
        while frame > 0:
            got = len(f.read(min(frame, _SKIP_BLOCK), dtype="float32", always_2d=True))
            if got == 0:
                return  # ends before: the caller finds no audio there
            frame -= got
    except (RuntimeError, ValueError) as exc:
        raise MediaError.of(f"libsndfile could not seek to sample {frame:,} ({exc})") from None


def _as_audio(array: np.ndarray, rate: int) -> dict[str, Any]:
    return {"array": torch.from_numpy(np.ascontiguousarray(array.T)), "sampling_rate": int(rate)}


def decode_audio(data: bytes, *, max_samples: int | None = DEFAULT_MAX_AUDIO_SAMPLES) -> dict[str, Any]:
    """A whole audio member: ``{"array": channels x samples float32,
    "sampling_rate": int}``.

    Raises:
        ImportError: soundfile is not installed (the message names the extra).
        MediaTooLargeError: The header claims more than ``max_samples``.
        MediaError: Not audio libsndfile reads, or it does not decode.
    """
    with _open(data) as f:
        _check_samples(f.frames, f.channels, max_samples, "audio header gives")
        return _as_audio(_read(f, f.frames), f.samplerate)


class DecodeAudioClip:
    """Encoded audio bytes -> ``seconds`` of it at ``sampling_rate``:
    ``{"array": channels x round(seconds * rate) float32, "sampling_rate": rate}``.

    Used as a ``map`` on an audio field read as bytes:
    ``map=MapField("flac", DecodeAudioClip(4.0, sampling_rate=16000))`` with
    ``decode=Decoder(audio=None)`` (the default ``Decoder``'s, or None).

    Args:
        seconds: The clip's length.
        sampling_rate: Resample to this rate (soxr, high quality); None
            keeps the member's.
        start: ``"random"`` (from the sample's seeded generator, see
            :mod:`shardkit.read.sample_rng`), ``"center"``, or seconds.
        mono: Average the channels into one.
        max_audio_samples: Most samples (all channels) decoded for a clip.
    """

    def __init__(
        self,
        seconds: float,
        *,
        sampling_rate: int | None = None,
        start: Start = "random",
        mono: bool = False,
        max_audio_samples: int | None = DEFAULT_MAX_AUDIO_SAMPLES,
    ) -> None:
        self.seconds = float(check_positive(seconds, "seconds", float))
        self.sampling_rate = check_limit(sampling_rate, "sampling_rate")
        self.start = check_start(start)
        self.mono = bool(mono)
        self.max_audio_samples = check_limit(max_audio_samples, "max_audio_samples")

    def __call__(self, data: bytes | bytearray | memoryview) -> dict[str, Any]:
        """Decode one clip of ``data``.

        Raises:
            ImportError: soundfile or soxr is not installed.
            MediaTooLargeError: The clip is over ``max_audio_samples``.
            MediaError: Not audio, or its data ends before the clip it claims to hold.
        """
        with _open(bytes(data)) as f:
            rate, total = f.samplerate, f.frames
            length = max(round(self.seconds * rate), 1)
            _check_samples(length, f.channels, self.max_audio_samples, "a clip of")
            first = min(round(clip_start(self.start, (total - length) / rate) * rate), max(total - 1, 0))
            if first > 0:
                _go_to(f, first)
            clip = _read(f, length)
        if len(clip) == 0 and first > 0:
            raise MediaError.of(f"its header claims {total:,} frames, but it holds no audio at frame {first:,}")
        if len(clip) < length:  # shorter than the clip: silence after it
            clip = np.concatenate([clip, np.zeros((length - len(clip), clip.shape[1]), np.float32)])
        if self.mono:
            clip = clip.mean(axis=1, keepdims=True, dtype=np.float32)
        if self.sampling_rate is not None and self.sampling_rate != rate:
            clip = _resample(clip, rate, self.sampling_rate, round(self.seconds * self.sampling_rate))
            rate = self.sampling_rate
        return _as_audio(clip, rate)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.seconds:g}, sampling_rate={self.sampling_rate}, start={self.start!r}, "
            f"mono={self.mono})"
        )


def _resample(clip: np.ndarray, rate: int, to: int, length: int) -> np.ndarray:
    """``clip`` (frames x channels) at ``to`` Hz, exactly ``max(length, 1)`` frames."""
    soxr = require("soxr")
    out = soxr.resample(clip, rate, to, quality="HQ").astype(np.float32, copy=False)
    length = max(length, 1)
    if len(out) >= length:
        return out[:length]
    return np.concatenate([out, np.zeros((length - len(out), out.shape[1]), np.float32)])
