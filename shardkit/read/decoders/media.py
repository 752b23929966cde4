"""What the video and audio decoders share (:mod:`.video`, :mod:`.audio`):
their optional packages, their options, and where a clip starts.

The decoders come with the ``media`` extra (``pip install 'shardkit[media]'``):
PyAV, whose wheels bundle FFmpeg, for video; soundfile, whose wheels bundle
libsndfile, for audio; soxr for resampling. None needs a system library.
Without them a video or audio field raises an :class:`ImportError` that
names the extra, when it is first decoded.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Literal

import torch

from shardkit.errors import UsageError
from shardkit.read.sample_rng import sample_generator

__all__ = ["Start", "check_limit", "check_positive", "check_size", "check_start", "clip_start", "require"]

#: Where a clip starts: drawn at random, in the middle, or at given seconds.
Start = Literal["random", "center"] | float

#: What each optional module is for, for the error that says it is missing.
_PURPOSE = {
    "av": "decoding video needs PyAV",
    "soundfile": "decoding audio needs soundfile",
    "soxr": "resampling audio needs soxr",
}


def require(module: str) -> ModuleType:
    """Import one of the ``media`` extra's modules.

    Raises:
        ImportError: It is not installed; the message names the extra.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{_PURPOSE[module]}, which is not installed: pip install 'shardkit[media]'") from exc


def check_positive(value: Any, name: str, kind: type = int) -> Any:
    """``value`` if it is a positive ``kind`` (int, or a finite float or int)."""
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not ok or value <= 0 or (kind is float and not math.isfinite(value)):
        raise UsageError(f"{name} must be a positive {kind.__name__}, not {value!r}")
    return value


def check_limit(value: int | None, name: str) -> int | None:
    """A limit option: a positive int, or None for none."""
    return None if value is None else check_positive(value, name)


def check_size(size: int | Sequence[int]) -> tuple[int, int]:
    """An output size, ``S`` or ``(H, W)``, as ``(H, W)``."""
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else tuple(size)
    if len(pair) != 2:
        raise UsageError(f"size must be an int or (height, width), not {size!r}")
    return (check_positive(pair[0], "size"), check_positive(pair[1], "size"))


def check_start(start: Any) -> Start:
    """``start`` validated: ``"random"``, ``"center"`` or seconds >= 0."""
    if start in ("random", "center"):
        return start
    if isinstance(start, (int, float)) and not isinstance(start, bool) and math.isfinite(start) and start >= 0:
        return float(start)
    raise UsageError(f"start must be 'random', 'center' or seconds >= 0, not {start!r}")


def clip_start(start: Start, room: float) -> float:
    """Where a clip starts, in seconds from the first frame, given ``room``
    (the duration less the clip's span; at most 0 when the clip does not
    fit). ``"random"`` draws from the sample's generator, else from torch's
    global one (:mod:`shardkit.read.sample_rng`)."""
    room = max(room, 0.0)
    if start == "center":
        return room / 2
    if start == "random":
        rng = sample_generator()
        u = float(rng.random()) if rng is not None else float(torch.rand(()))
        return u * room
    return float(start)
