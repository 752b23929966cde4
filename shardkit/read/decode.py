"""Decoding sample fields by extension (the reader's ``decode=`` option).

The reader yields raw bytes unless asked. :class:`Decoder` decodes each field
by the last part of its extension (``seg.png`` decodes as ``png``):

=================================  ==========================================
extension                          value
=================================  ==========================================
jpg jpeg png webp ppm pgm bmp      PIL image, or a uint8 CHW tensor via
                                   ``torchvision.io.decode_image``
cls cls2 index label               int
txt text                           str (UTF-8)
json                               parsed JSON
npy                                numpy array (no pickled objects)
pickle pkl                         ``pickle.loads``, only with ``allow_pickle``
pt pth                             ``torch.load``, only with ``allow_torch_load``
anything else                      bytes, unchanged
=================================  ==========================================

Unpickling runs code chosen by whoever wrote the data, so both pickle-based
decoders are off unless explicitly enabled; a field that would need them
raises :class:`~shardkit.errors.UsageError` instead.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from shardkit.errors import UsageError

ImageMode = Literal["pil", "tensor"]
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp"})
INT_EXTENSIONS = frozenset({"cls", "cls2", "index", "label"})
TEXT_EXTENSIONS = frozenset({"txt", "text"})
PICKLE_EXTENSIONS = frozenset({"pickle", "pkl"})
TORCH_EXTENSIONS = frozenset({"pt", "pth"})


def _pil(data: bytes) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _tensor(data: bytes) -> Any:
    import torch
    from torchvision.io import ImageReadMode, decode_image

    return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.UNCHANGED)


def _int(data: bytes) -> int:
    return int(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _torch_load(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _pickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


@dataclass(frozen=True)
class Decoder:
    """Decode a sample's fields by extension.

    Attributes:
        image: ``"pil"`` for PIL images, ``"tensor"`` for uint8 CHW tensors
            (``torchvision.io``), or None to leave image bytes as they are.
        allow_pickle: Unpickle ``pickle`` / ``pkl`` fields (runs code from the
            data: only for data you trust).
        allow_torch_load: ``torch.load`` ``pt`` / ``pth`` fields (same risk).
    """

    image: ImageMode | None = "pil"
    allow_pickle: bool = False
    allow_torch_load: bool = False

    def __post_init__(self) -> None:
        if self.image not in ("pil", "tensor", None):
            raise UsageError(f"Decoder image must be 'pil', 'tensor' or None, not {self.image!r}")

    def function_for(self, extension: str) -> Callable[[bytes], Any] | None:
        """The decode function for a field extension, or None to keep bytes.

        Raises:
            UsageError: The extension needs pickle or ``torch.load`` and that
                was not enabled.
        """
        ext = extension.rsplit(".", 1)[-1].lower()
        if ext in IMAGE_EXTENSIONS:
            return None if self.image is None else (_pil if self.image == "pil" else _tensor)
        if ext in INT_EXTENSIONS:
            return _int
        if ext in TEXT_EXTENSIONS:
            return _text
        if ext == "json":
            return json.loads
        if ext == "npy":
            return _npy
        if ext in PICKLE_EXTENSIONS:
            if not self.allow_pickle:
                raise UsageError(
                    f"field {extension!r} is a pickle; unpickling runs code from the data, so it is off. "
                    "Pass decode=Decoder(allow_pickle=True) if you trust this dataset."
                )
            return _pickle
        if ext in TORCH_EXTENSIONS:
            if not self.allow_torch_load:
                raise UsageError(
                    f"field {extension!r} needs torch.load, which runs code from the data, so it is off. "
                    "Pass decode=Decoder(allow_torch_load=True) if you trust this dataset."
                )
            return _torch_load
        return None

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode every field of ``sample`` in place and return it."""
        cache = self._cache()
        for ext, value in sample.items():
            if ext.startswith("__"):
                continue
            fn = cache.get(ext)
            if fn is None:
                if ext in cache:
                    continue
                fn = cache[ext] = self.function_for(ext)
                if fn is None:
                    continue
            sample[ext] = fn(value)
        return sample

    def _cache(self) -> dict[str, Callable[[bytes], Any] | None]:
        cache = self.__dict__.get("_functions")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_functions", cache)
        return cache


def make_decoder(decode: ImageMode | Decoder | None) -> Decoder | None:
    """Normalize the reader's ``decode=`` option.

    ``"pil"`` / ``"tensor"`` are shorthands for ``Decoder(image=...)``.
    """
    if decode is None or isinstance(decode, Decoder):
        return decode
    if decode in ("pil", "tensor"):
        return Decoder(image=decode)
    raise UsageError(f"decode must be 'pil', 'tensor', a shardkit Decoder or None, not {decode!r}")
