"""Checking and resizing images on their way into shards (``--resize N``).

:func:`prepare_image` decodes an image only as far as its target needs: a
JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) that still covers
the output size (Pillow's ``Image.draft``, the path
:mod:`shardkit.transforms` takes too), so a 4000x3000 photo resized to 256
costs about what a 500x375 one does. Without resizing it still decodes the
image (a JPEG at 1/8 scale: every coded byte is read, little is computed), so
a truncated file or an HTML page served as ``image/jpeg`` is caught before it
is stored.

Modes (``--resize-mode``), none of which ever upscales:

``keep_ratio`` (default)
    The shorter side becomes ``size``, the other keeps the aspect ratio.
    An image whose shorter side is at most ``size`` is kept as it is.
``center_crop``
    As ``keep_ratio``, then the centre square of ``size`` (or of the shorter
    side, for a smaller image) is cut out.
``border``
    The longer side becomes ``size`` (smaller images keep their size), then
    the image is padded to ``size`` x ``size`` with ``border_rgb``, centred.

An image that needs no change is stored with its original bytes unless
another output format is asked for; otherwise it is encoded as
``output_format`` (``jpg``, ``png`` or ``webp``; None keeps the input's
format) at ``quality``. The field's extension stays the one the field map
gives; :attr:`PreparedImage.ext` says what the bytes are. Problems come back as :class:`ImageProblem` with a
reason category: ``not_image``, ``too_small``, ``image_too_large``.

Needs Pillow (``pip install 'shardkit[images]'``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Literal

from shardkit.errors import UsageError

ResizeMode = Literal["keep_ratio", "center_crop", "border"]
RESIZE_MODES: tuple[str, ...] = ("keep_ratio", "center_crop", "border")

#: Pillow's ``Image.MAX_IMAGE_PIXELS`` default: the image-bomb limit.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485

#: Output formats: extension -> Pillow format name.
_FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
#: Pillow format name -> the extension its bytes are stored under.
_EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tif", "PPM": "ppm"}


@dataclass(frozen=True, kw_only=True)
class ImageOptions:
    """What happens to an image field's bytes before they are stored.

    Attributes:
        resize: Target size in pixels (see the modes above), or None to
            only check that the bytes decode.
        mode: ``keep_ratio``, ``center_crop`` or ``border``.
        output_format: ``jpg``, ``png`` or ``webp``: images are stored in
            this format (re-encoded when theirs differs), or None (default)
            to keep each image's own format when it is re-encoded (formats
            other than JPEG, PNG and WebP become PNG).
        quality: Encoding quality for ``jpg``/``webp`` (1-100; 95).
        min_side: Images whose shorter side is below this many pixels are
            rejected as ``too_small`` (0: none).
        max_pixels: Images claiming more pixels than this in their header are
            rejected as ``image_too_large`` before decoding (Pillow's default
            limit); None for no limit.
        border_rgb: The colour ``border`` pads with.
    """

    resize: int | None = None
    mode: ResizeMode = "keep_ratio"
    output_format: str | None = None
    quality: int = 95
    min_side: int = 0
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    border_rgb: tuple[int, int, int] = (0, 0, 0)

    def __post_init__(self) -> None:
        if self.resize is not None and (not isinstance(self.resize, int) or self.resize < 1):
            raise UsageError(f"--resize must be a positive number of pixels, got {self.resize!r}")
        if self.mode not in RESIZE_MODES:
            raise UsageError(f"--resize-mode must be one of {', '.join(RESIZE_MODES)}, got {self.mode!r}")
        if self.output_format is not None and self.output_format not in _FORMATS:
            raise UsageError(f"output format must be one of {', '.join(_FORMATS)} or None, got {self.output_format!r}")
        if not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise UsageError(f"quality must be an integer from 1 to 100, got {self.quality!r}")
        if not isinstance(self.min_side, int) or self.min_side < 0:
            raise UsageError(f"min_side must be 0 or more pixels, got {self.min_side!r}")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise UsageError(f"max_pixels must be positive or None, got {self.max_pixels!r}")


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """An image ready to store.

    Attributes:
        data: The bytes to store.
        ext: The extension they are stored under (``jpg``, ``png``...).
        width, height: Their size in pixels.
        original_width, original_height: The input's size in pixels.
    """

    data: bytes
    ext: str
    width: int
    height: int
    original_width: int
    original_height: int


class ImageProblem(Exception):
    """Bytes that are not an image to store: ``reason`` is a short category
    (``not_image``, ``too_small``, ``image_too_large``), ``detail`` one line."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(
            "checking and resizing images needs Pillow: pip install 'shardkit[images]'"
        ) from exc
    return Image


def output_size(width: int, height: int, size: int, mode: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((scaled_w, scaled_h), (out_w, out_h))``: the size the image is
    scaled to, and the size of the stored image (after a crop or a border).
    Never larger than the input, for the scaled size."""
    if mode == "border":
        scale = min(1.0, size / max(width, height))
    else:
        scale = min(1.0, size / min(width, height))
    scaled = (max(1, round(width * scale)), max(1, round(height * scale)))
    if mode == "keep_ratio":
        return scaled, scaled
    if mode == "center_crop":
        side = min(scaled)
        return scaled, (side, side)
    return scaled, (max(size, scaled[0]), max(size, scaled[1]))


def prepare_image(data: bytes, options: ImageOptions) -> PreparedImage:
    """Check, and resize if asked, one image's bytes.

    Raises:
        ImageProblem: The bytes do not decode as an image (``not_image``), it
            is smaller than ``min_side`` (``too_small``) or claims more than
            ``max_pixels`` (``image_too_large``).
        ImportError: Pillow is not installed (names the extra).
    """
    Image = _pil()
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        kind = image.format
    except Image.DecompressionBombError as exc:
        raise ImageProblem("image_too_large", str(exc).split(" could be")[0]) from None
    except Exception as exc:  # Pillow raises many types for bytes it cannot read
        raise ImageProblem("not_image", f"cannot identify an image ({type(exc).__name__})") from None
    if options.max_pixels is not None and width * height > options.max_pixels:
        raise ImageProblem("image_too_large", f"{width}x{height} is over max_pixels ({options.max_pixels})")
    if min(width, height) < max(options.min_side, 1):
        raise ImageProblem("too_small", f"{width}x{height} is below min_side ({options.min_side})")
    ext = _EXTENSIONS.get(kind or "", "")
    if options.resize is None:
        scaled = out = (width, height)
    else:
        scaled, out = output_size(width, height, options.resize, options.mode)
    wanted = options.output_format or (ext if ext in _FORMATS else "png")
    keep_original = scaled == (width, height) and out == (width, height) and options.output_format in (None, ext)
    try:
        if kind == "JPEG":
            # The smallest DCT scale covering the target; 1/8 when the bytes
            # are only checked (every coded byte is still read).
            image.draft(image.mode if image.mode in ("L", "CMYK") else "RGB", (1, 1) if keep_original else scaled)
        image.load()
    except Exception as exc:
        detail = f"{kind or 'image'} data does not decode ({type(exc).__name__}: {exc})"
        raise ImageProblem("not_image", detail[:200]) from None
    if keep_original:
        return PreparedImage(data, ext, width, height, width, height)
    try:
        pixels = _to_rgb(image, Image, wanted)
        if pixels.size != scaled:
            pixels = pixels.resize(scaled, Image.Resampling.BICUBIC, reducing_gap=2.0)
        if out != scaled:
            pixels = _fit(pixels, Image, out, options)
        buffer = io.BytesIO()
        pixels.save(buffer, format=_FORMATS[wanted], **_save_options(wanted, options.quality))
    except (OSError, ValueError) as exc:
        raise ImageProblem("not_image", f"cannot re-encode ({type(exc).__name__}: {exc})"[:200]) from None
    return PreparedImage(buffer.getvalue(), wanted, out[0], out[1], width, height)


def _to_rgb(image: Any, Image: Any, wanted: str) -> Any:
    # JPEG holds no alpha; the others keep it when the input had it.
    if image.mode in ("RGB", "L") or (image.mode in ("RGBA", "LA") and wanted != "jpg"):
        return image
    if image.mode in ("RGBA", "LA", "P") and wanted == "jpg":
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image.convert("RGBA" if "A" in image.getbands() and wanted != "jpg" else "RGB")


def image_format_name(ext: str) -> str:
    """The output format an image extension names (``JPEG`` -> ``jpg``, as :data:`_FORMATS` keys them)."""
    return {"jpeg": "jpg"}.get(ext.lower(), ext.lower())


def encode_image(image: Any, ext: str, quality: int = 95) -> bytes:
    """A Pillow image as the bytes of a ``jpg``/``jpeg``, ``png`` or ``webp``
    member (JPEG at ``quality``, its alpha flattened on white).

    Raises:
        TypeError: Another extension (the caller should store bytes it encoded).
    """
    wanted = image_format_name(ext)
    if wanted not in _FORMATS:
        raise TypeError(
            f"cannot encode an image as .{ext}: use jpg, png or webp, or store bytes you encoded yourself"
        )
    buffer = io.BytesIO()
    _to_rgb(image, _pil(), wanted).save(buffer, format=_FORMATS[wanted], **_save_options(wanted, quality))
    return buffer.getvalue()


def _fit(pixels: Any, Image: Any, out: tuple[int, int], options: ImageOptions) -> Any:
    width, height = pixels.size
    if options.mode == "center_crop":
        left, top = (width - out[0]) // 2, (height - out[1]) // 2
        return pixels.crop((left, top, left + out[0], top + out[1]))
    fill: Any = options.border_rgb if pixels.mode == "RGB" else (*options.border_rgb, 255)
    if pixels.mode == "L":
        fill = round(sum(options.border_rgb) / 3)
    elif pixels.mode == "LA":
        fill = (round(sum(options.border_rgb) / 3), 255)
    canvas = Image.new(pixels.mode, out, fill)
    canvas.paste(pixels, ((out[0] - width) // 2, (out[1] - height) // 2))
    return canvas


def _save_options(fmt: str, quality: int) -> dict[str, Any]:
    if fmt == "jpg":
        return {"quality": quality}
    if fmt == "webp":
        return {"quality": quality, "method": 4}
    return {"compress_level": 6}


__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "ImageOptions",
    "ImageProblem",
    "PreparedImage",
    "RESIZE_MODES",
    "encode_image",
    "output_size",
    "prepare_image",
]
