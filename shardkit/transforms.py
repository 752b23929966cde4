"""Decode only what the crop needs: fused decode + crop + resize for images.

The standard training transform, torchvision's ``RandomResizedCrop`` plus a
horizontal flip, decodes the whole image and then keeps a box of it, resized
to 224 pixels. From a 1,600-pixel photo most of that decode is thrown away.
The transforms here draw the box first, from the size in the JPEG header
(no pixels decoded), and then ask libjpeg-turbo (through ``simplejpeg``) for
the image at the smallest DCT scale, 1/8, 1/4, 1/2 or 1, that still keeps the
box at or above the output size. The inverse DCT, colour conversion and
resampling then run on up to 64 times fewer pixels; only the entropy
decoding still reads the whole file. The box is finally resampled to the
output size with torch's antialiased bilinear filter (what torchvision's
``resize(antialias=True)`` runs on tensors) and flipped.

- :class:`DecodeRandomResizedCrop`: the training transform. Boxes come from
  exactly torchvision's ``RandomResizedCrop.get_params`` algorithm with the
  same calls on torch's global random generator, so for the same torch seed
  the boxes (and flips) are torchvision's own.
- :class:`DecodeResizeCenterCrop`: the evaluation transform,
  ``Resize(resize)`` + ``CenterCrop(size)`` done as one resample of the
  source box that the centre crop covers.
- :class:`MapField`: applies a transform to one field of a sample dict, for
  ``map=`` on :class:`~shardkit.ShardDataset` or
  :class:`~shardkit.IndexedDataset` (read the field as bytes:
  ``decode=shardkit.Decoder(image=None)`` still decodes labels and text).
- :class:`DecodeVideoClip` / :class:`DecodeVideoClips` and
  :class:`DecodeAudioClip`: the same idea for video and audio members (a
  clip decoded from the keyframe before it; see
  :mod:`shardkit.read.decoders.video` and :mod:`shardkit.read.decoders.audio`),
  drawing their random starts from :func:`sample_generator`.
- :class:`ToTuple`, :class:`Rename` and :class:`Compose`: webdataset's
  ``.to_tuple``, ``.rename`` and a chain of ``.map`` steps as one ``map=``
  function, e.g. ``map=ToTuple("jpg;png", "cls")`` (``;`` separates names of
  which the first present is taken). Plain classes, so they pickle into
  ``spawn`` workers where a lambda would not.

Each transform takes encoded bytes and returns a uint8 ``3 x H x W`` tensor
(or an RGB PIL image with ``output="pil"``). The tensor's memory is in
channels-last order, as torchvision's ``ToImage`` gives for a PIL image;
the DataLoader's collation stacks such tensors as usual, and
``.contiguous()`` makes plain ``C x H x W`` order where a step needs it. Baseline and progressive RGB or
greyscale JPEGs, any chroma subsampling, take the fast path. CMYK and YCCK
JPEGs, and every other format Pillow reads (PNG, WebP, ...), are decoded by
Pillow (JPEGs still at a reduced DCT scale) and converted to RGB as
torchvision's ``ImageReadMode.RGB`` does: greyscale is repeated over three
channels, alpha dropped. Without ``simplejpeg`` installed, every JPEG takes
Pillow's path (``Image.draft``), which is slower but gives the same result
within rounding.

Why simplejpeg (``bench/bench_jpeg_decoders.py`` measures it): its wheels
bundle libjpeg-turbo, so the ``torch`` extra installs it with no system
package; it decodes at any k/8 scale; and its full decode is as fast as
torchvision.io's and faster than Pillow's. Pillow's ``draft`` scales too
but only by powers of two and with a slower decode; torchvision.io cannot
scale (and its decoders are deprecated since torchvision 0.29); PyTurboJPEG
needs the system's ``libturbojpeg``. None of them skips the entropy
decoding of the rows and columns outside the box: libjpeg-turbo's own
cropping and row skipping still entropy-decode every block, so what stays
of a large file's cost is mostly reading its Huffman codes.

Randomness and DataLoader workers: like torchvision, the training transform
draws from torch's global generator. PyTorch's DataLoader seeds that
generator in each worker with ``base_seed + worker_id``, where ``base_seed``
comes from the main process's generator (or the DataLoader's
``generator=``), so workers draw different boxes and ``torch.manual_seed``
before creating the iterator makes a run repeat. This holds for ``fork`` and
``spawn`` workers alike; the transforms hold no generator of their own and
pickle as plain options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from shardkit.errors import TRANSFORM_FAULTS, UsageError
from shardkit.read.decoders.audio import DecodeAudioClip
from shardkit.read.decoders.images import DEFAULT_MAX_IMAGE_PIXELS, check_pixels, open_image
from shardkit.read.decoders.video import DecodeVideoClip, DecodeVideoClips
from shardkit.read.sample_rng import sample_generator

try:  # the fast JPEG path; the `torch` extra installs it
    import simplejpeg
except ImportError:  # pragma: no cover - exercised only without the extra
    simplejpeg = None

__all__ = [
    "DecodeAudioClip",
    "DecodeRandomResizedCrop",
    "DecodeResizeCenterCrop",
    "DecodeVideoClip",
    "DecodeVideoClips",
    "Compose",
    "MapField",
    "Rename",
    "ToTuple",
    "image_size",
    "random_resized_crop_box",
    "sample_generator",
]

Output = Literal["tensor", "pil"]
Box = tuple[int, int, int, int]

#: DCT scales (in eighths) the decoder may use. libjpeg-turbo offers every
#: k/8, but the odd ones run through slower IDCT code: measured on photo-like
#: JPEGs, 7/8 .. 5/8 decode slower than 8/8 and 3/8 no faster than 4/8.
_SCALES_EIGHTHS = (1, 2, 4, 8)

#: Colour spaces the fast path decodes correctly to RGB.
_FAST_COLORSPACES = frozenset({"YCbCr", "RGB", "Gray"})


def _size_pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    """``size`` as ``(height, width)``, validated."""
    if isinstance(size, int):
        pair = (size, size)
    else:
        pair = tuple(int(s) for s in size)
        if len(pair) != 2:
            raise UsageError(f"{name} must be an int or (height, width), not {size!r}")
    if min(pair) < 1:
        raise UsageError(f"{name} must be positive, not {size!r}")
    return pair  # type: ignore[return-value]


def _pixel_limit(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"max_image_pixels must be a positive integer or None, not {value!r}")
    return value


def _is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


class _Source:
    """One encoded image: its size from the header, and region decoding.

    Args:
        data: Encoded image bytes (any format Pillow reads).
        max_pixels: Most pixels accepted, checked on the header before
            anything is decoded (None: no limit of ours).

    Raises:
        ImageTooLargeError: The header gives more than ``max_pixels``.
    """

    __slots__ = ("data", "height", "width", "_fast", "_pil")

    def __init__(self, data: bytes | bytearray | memoryview, max_pixels: int | None = None) -> None:
        if not isinstance(data, bytes):
            if not isinstance(data, (bytearray, memoryview)):
                raise UsageError(
                    f"image transforms take encoded bytes, not {type(data).__name__}; read the field as "
                    "bytes (decode=None, or decode=shardkit.Decoder(image=None) to decode the other fields)"
                )
            data = bytes(data)
        self.data = data
        self._pil: Image.Image | None = None
        self._fast = False
        if simplejpeg is not None and _is_jpeg(data):
            try:
                height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            except ValueError:
                colorspace = None
            if colorspace in _FAST_COLORSPACES:
                check_pixels(int(width), int(height), max_pixels)
                self._fast = True
                self.height, self.width = int(height), int(width)
                return
        self._pil = open_image(data, max_pixels)
        self.width, self.height = self._pil.size

    def decode(self, box: tuple[float, float, float, float], out_hw: tuple[int, int]) -> tuple[np.ndarray, tuple]:
        """Decode at the smallest allowed DCT scale that keeps ``box`` at least ``out_hw``.

        Args:
            box: ``(top, left, height, width)`` in source pixels (may be fractional).
            out_hw: The output ``(height, width)`` the box will be resampled to.

        Returns:
            The decoded ``H x W x 3`` uint8 RGB array and the box as
            ``(top, left, height, width)`` in that array's pixels, fractional.
        """
        top, left, height, width = box
        out_h, out_w = out_hw
        eighths = 8
        for k in _SCALES_EIGHTHS:
            if height * k / 8 >= out_h and width * k / 8 >= out_w:
                eighths = k
                break
        want_h = -(-self.height * eighths // 8)
        want_w = -(-self.width * eighths // 8)
        if self._fast:
            array = simplejpeg.decode_jpeg(self.data, colorspace="RGB", min_height=want_h, min_width=want_w)
        else:
            image = self._pil
            assert image is not None
            if image.format == "JPEG" and eighths < 8:
                image.draft(image.mode if image.mode == "CMYK" else "RGB", (want_w, want_h))
            array = np.array(image.convert("RGB"))  # loads; greyscale repeated, alpha dropped
        sy = array.shape[0] / self.height
        sx = array.shape[1] / self.width
        return array, (top * sy, left * sx, height * sy, width * sx)


def _resample(source: _Source, box: tuple[float, float, float, float], out_hw: tuple[int, int], flip: bool) -> torch.Tensor:
    """Decode ``box`` of ``source`` and resample it to ``out_hw``: a uint8 ``3 x H x W`` tensor.

    The box, scaled to the decoded image, is rounded to whole pixels there
    (exact at full scale for integer boxes; at most half a decoded pixel
    off otherwise) and resized with torch's antialiased bilinear filter,
    whose uint8 channels-last kernel is several times faster than Pillow's.
    """
    array, (top, left, height, width) = source.decode(box, out_hw)
    rows, cols = array.shape[:2]
    t0 = min(max(int(round(top)), 0), rows - 1)
    l0 = min(max(int(round(left)), 0), cols - 1)
    t1 = min(max(int(round(top + height)), t0 + 1), rows)
    l1 = min(max(int(round(left + width)), l0 + 1), cols)
    region = torch.from_numpy(array)[t0:t1, l0:l1].permute(2, 0, 1).unsqueeze(0)
    if region.shape[-2:] == out_hw:
        out = region
    else:
        out = torch.nn.functional.interpolate(
            region.contiguous(memory_format=torch.channels_last), size=out_hw, mode="bilinear", antialias=True
        )
    if flip:
        out = out.flip(-1)
    # Channels-last strides, as torchvision's ToImage gives for a PIL image:
    # a copy to plain CHW order would cost as much as the resize. (The
    # resize's output has them already; a region kept at its size is copied.)
    return out.contiguous(memory_format=torch.channels_last)[0]


def _finish(tensor: torch.Tensor, output: Output) -> Any:
    if output == "pil":
        return Image.fromarray(np.ascontiguousarray(tensor.permute(1, 2, 0).numpy()), "RGB")
    return tensor


def image_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, from its header (JPEG via libjpeg-turbo, else Pillow).

    Args:
        data: Encoded image bytes.
    """
    source = _Source(data)  # no pixel limit: nothing is decoded
    return source.height, source.width


def random_resized_crop_box(
    height: int, width: int, *, scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)
) -> Box:
    """Draw a crop box as torchvision's ``RandomResizedCrop.get_params`` does.

    The same algorithm with the same calls on torch's global generator: ten
    attempts of an area fraction uniform in ``scale`` and an aspect ratio
    log-uniform in ``ratio``, the first that fits placed uniformly; else the
    whole image, or its centre cut to the nearest allowed ratio. For the same
    generator state the result equals torchvision's.

    Args:
        height: Image height in pixels.
        width: Image width in pixels.
        scale: Range of the box's area as a fraction of the image's.
        ratio: Range of the box's width / height.

    Returns:
        ``(top, left, box_height, box_width)`` in pixels.
    """
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return int(i), int(j), h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


class DecodeRandomResizedCrop:
    """Training transform: encoded bytes to a random resized crop, maybe flipped.

    Equivalent to torchvision's ``RandomResizedCrop(size, scale, ratio,
    antialias=True)`` followed by ``RandomHorizontalFlip()`` when ``flip``,
    applied to the decoded RGB image, but decoding only at the DCT scale the
    box needs (see the module docstring). Boxes and flips are drawn from
    torch's global generator with torchvision's calls in torchvision's order.

    Args:
        size: Output size, an int for a square or ``(height, width)``.
        scale: Range of the box's area as a fraction of the image's.
        ratio: Range of the box's aspect ratio (width / height).
        flip: Flip horizontally with probability 0.5 (one ``torch.rand(1)``
            draw after the box, as ``RandomHorizontalFlip`` does).
        output: ``"tensor"`` for a uint8 ``3 x H x W`` tensor, ``"pil"`` for
            an RGB PIL image.
        max_image_pixels: Most pixels an image may have, read from its
            header before decoding; default Pillow's ``MAX_IMAGE_PIXELS``
            (89,478,485), None for no limit. Over it a call raises
            :class:`~shardkit.errors.ImageTooLargeError` (a data fault the
            readers skip under ``on_error="skip"``).

    Raises:
        UsageError: An option is out of range.

    Example::

        crop = DecodeRandomResizedCrop(224)
        tensor = crop(jpeg_bytes)                      # 3 x 224 x 224 uint8
        same_box = crop(jpeg_bytes, box=(10, 20, 300, 400))
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        *,
        output: Output = "tensor",
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        self.size = _size_pair(size, "size")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        if not 0 < self.scale[0] <= self.scale[1]:
            raise UsageError(f"scale must be (min, max) with 0 < min <= max, not {scale!r}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise UsageError(f"ratio must be (min, max) with 0 < min <= max, not {ratio!r}")
        if output not in ("tensor", "pil"):
            raise UsageError(f"output must be 'tensor' or 'pil', not {output!r}")
        self.flip = bool(flip)
        self.output: Output = output
        self.max_image_pixels = _pixel_limit(max_image_pixels)

    def __call__(self, data: bytes, *, box: Box | None = None) -> Any:
        """Decode, crop, resize and maybe flip one image.

        Args:
            data: Encoded image bytes.
            box: ``(top, left, height, width)`` in source pixels to use
                instead of a random one; then nothing is drawn and nothing
                flipped (for comparing with torchvision on the same box).

        Returns:
            A uint8 ``3 x H x W`` tensor, or an RGB PIL image.
        """
        source = _Source(data, self.max_image_pixels)
        flip = False
        if box is None:
            box = random_resized_crop_box(source.height, source.width, scale=self.scale, ratio=self.ratio)
            flip = self.flip and bool(torch.rand(1) < 0.5)
        box_f = tuple(float(v) for v in box)
        return _finish(_resample(source, box_f, self.size, flip), self.output)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
            f"flip={self.flip}, output={self.output!r})"
        )


class DecodeResizeCenterCrop:
    """Evaluation transform: encoded bytes to ``Resize(resize)`` + ``CenterCrop(size)``.

    The short side is scaled to ``resize`` (the long side to
    ``int(resize * long / short)``, as torchvision's ``Resize`` does) and the
    centre ``size`` kept (offsets rounded as ``CenterCrop`` rounds them). The
    two steps are done as one antialiased resample of the source box that
    the crop covers, decoded at the DCT scale that box needs.

    Args:
        size: Output size, an int for a square or ``(height, width)``.
        resize: Short side after resizing, at least ``max(size)``. None
            follows the usual ImageNet convention of a crop covering 87.5%
            of the short side: ``round(max(size) / 0.875)``, 256 for 224.
        output, max_image_pixels: As for :class:`DecodeRandomResizedCrop`.

    Raises:
        UsageError: An option is out of range.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        resize: int | None = None,
        *,
        output: Output = "tensor",
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        self.size = _size_pair(size, "size")
        self.resize = int(round(max(self.size) / 0.875)) if resize is None else int(resize)
        if self.resize < max(self.size):
            raise UsageError(f"resize ({self.resize}) must be at least the crop size {self.size}")
        if output not in ("tensor", "pil"):
            raise UsageError(f"output must be 'tensor' or 'pil', not {output!r}")
        self.output: Output = output
        self.max_image_pixels = _pixel_limit(max_image_pixels)

    def box_for(self, height: int, width: int) -> tuple[float, float, float, float]:
        """The source box ``(top, left, height, width)``, fractional, that the resized centre crop covers."""
        short, long = (height, width) if height <= width else (width, height)
        new_long = int(self.resize * long / short)
        new_h, new_w = (self.resize, new_long) if height <= width else (new_long, self.resize)
        crop_h, crop_w = self.size
        top = int(round((new_h - crop_h) / 2.0))
        left = int(round((new_w - crop_w) / 2.0))
        sy, sx = height / new_h, width / new_w
        return top * sy, left * sx, crop_h * sy, crop_w * sx

    def __call__(self, data: bytes) -> Any:
        """Decode, resize and centre-crop one image.

        Args:
            data: Encoded image bytes.

        Returns:
            A uint8 ``3 x H x W`` tensor, or an RGB PIL image.
        """
        source = _Source(data, self.max_image_pixels)
        box = self.box_for(source.height, source.width)
        return _finish(_resample(source, box, self.size, False), self.output)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, resize={self.resize}, output={self.output!r})"


class MapField:
    """Apply a transform to one field of a sample dict (for ``map=``).

    Args:
        field: The field to transform, or several names of which the first
            present is used (``("jpg", "jpeg", "png")``); the result is
            stored under the same name.
        transform: Called with the field's value.

    Raises:
        UsageError: ``field`` is empty.

    Example::

        ds = shardkit.ShardDataset(
            "shards/train", decode=shardkit.Decoder(image=None),
            map=MapField("jpg", DecodeRandomResizedCrop(224)),
        )
    """

    def __init__(self, field: str | Sequence[str], transform: Callable[[Any], Any]) -> None:
        self.fields = (field,) if isinstance(field, str) else tuple(field)
        if not self.fields:
            raise UsageError("MapField needs at least one field name")
        self.transform = transform

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Transform the field in place and return the sample.

        Raises:
            KeyError: The sample has none of the fields (the message lists
                the fields it has).
        """
        for name in self.fields:
            if name in sample:
                try:
                    sample[name] = self.transform(sample[name])
                except TRANSFORM_FAULTS as exc:
                    raise exc.located(path=exc.path, member=f"{sample.get('__key__')}.{name}") from None
                return sample
        raise KeyError(
            f"sample {sample.get('__key__')!r} has no field {' or '.join(map(repr, self.fields))}; "
            f"its fields are {sorted(k for k in sample if not k.startswith('__'))}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fields!r}, {self.transform!r})"


def _alternatives(spec: str) -> tuple[str, ...]:
    names = tuple(name for name in spec.split(";") if name)
    if not names:
        raise UsageError(f"{spec!r} names no field")
    return names


def _first_of(sample: dict[str, Any], names: tuple[str, ...]) -> str:
    """The first of ``names`` the sample has."""
    for name in names:
        if name in sample:
            return name
    present = sorted(k for k in sample if not k.startswith("__"))
    raise KeyError(f"sample {sample.get('__key__')!r} has none of the fields {';'.join(names)!r} (it has {present})")


class ToTuple:
    """A sample dict as a tuple of its fields (webdataset's ``.to_tuple``), for ``map=``.

    Args:
        *fields: Field names in tuple order; ``"jpg;png"`` takes the first
            of the names the sample has. ``"__key__"`` works too.

    Raises:
        UsageError: No field, or an empty name.

    Example::

        ds = shardkit.ShardDataset("shards/train", decode="tensor", map=ToTuple("jpg;png", "cls"))
        for image, label in ds: ...
    """

    def __init__(self, *fields: str) -> None:
        if not fields:
            raise UsageError("ToTuple needs at least one field name")
        self.fields = tuple(_alternatives(spec) for spec in fields)

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, ...]:
        """Raises: KeyError: naming the sample, the field and the fields it has."""
        return tuple(sample[_first_of(sample, names)] for names in self.fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(';'.join(n)) for n in self.fields)})"


class Rename:
    """Rename fields of a sample dict (webdataset's ``.rename``), for ``map=``.

    Args:
        keep: Keep the fields not renamed (default, as webdataset does);
            False keeps only the renamed ones and ``__key__``-style entries.
        **names: ``new="old"``, or ``new="jpg;png"`` for the first present.

    Raises:
        UsageError: No name given, or an empty one.

    Example::

        map=Rename(image="jpg;png", label="cls")   # {"__key__", "image", "label", ...}
    """

    def __init__(self, *, keep: bool = True, **names: str) -> None:
        if not names:
            raise UsageError("Rename needs at least one new=old pair")
        self.keep = keep
        self.names = {new: _alternatives(old) for new, old in names.items()}

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Raises: KeyError: naming the sample, the field and the fields it has."""
        found = {new: _first_of(sample, old) for new, old in self.names.items()}
        if self.keep:
            out = {k: v for k, v in sample.items() if k not in found.values()}
        else:
            out = {k: v for k, v in sample.items() if k.startswith("__")}
        out.update((new, sample[old]) for new, old in found.items())
        return out

    def __repr__(self) -> str:
        pairs = ", ".join(f"{new}={';'.join(old)!r}" for new, old in self.names.items())
        return f"{type(self).__name__}({pairs}, keep={self.keep})"


class Compose:
    """Functions applied in turn, as one ``map=`` (webdataset's chained ``.map`` calls).

    Example::

        map=Compose(MapField("jpg", DecodeRandomResizedCrop(224)), ToTuple("jpg", "cls"))
    """

    def __init__(self, *functions: Callable[[Any], Any]) -> None:
        self.functions = functions

    def __call__(self, sample: Any) -> Any:
        for function in self.functions:
            sample = function(sample)
        return sample

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.functions))})"
