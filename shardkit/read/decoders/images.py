"""Image fields: bytes to a PIL image or a uint8 ``C x H x W`` tensor.

The extensions are webdataset's image list (the file extensions PIL can
open), less the ones PIL only recognises without being able to decode them
by itself: data formats with a stub plugin (``bufr``, ``grib``, ``h5``,
``hdf``), MPEG video (``mpg``, ``mpeg``), PostScript (``ps``, ``eps``: needs
Ghostscript) and Windows metafiles (``wmf``, ``emf``). Those fields stay
bytes instead of failing to decode.
"""

from __future__ import annotations

import functools
import io
import re
import warnings
from typing import Any

from shardkit.errors import ImageTooLargeError

#: Default of the image pixel limit (``max_image_pixels``): Pillow's own
#: default ``Image.MAX_IMAGE_PIXELS``, about 89.5 megapixels (a 9459 x 9459
#: image, 268 MB as RGB), whatever decodes the image.
DEFAULT_MAX_IMAGE_PIXELS = 1024 * 1024 * 1024 // 4 // 3

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {
        "apng", "blp", "bmp", "bw", "cur", "dcx", "dds", "dib", "fit", "fits", "flc", "fli", "ftc", "ftu",
        "gbr", "gif", "icb", "icns", "ico", "iim", "im", "j2c", "j2k", "jfif", "jp2", "jpc", "jpe", "jpeg",
        "jpf", "jpg", "jpx", "msp", "pbm", "pcd", "pcx", "pgm", "png", "pnm", "ppm", "psd", "pxr", "ras",
        "rgb", "rgba", "sgi", "tga", "tif", "tiff", "vda", "vst", "webp", "xbm", "xpm",
    }
)  # fmt: skip

#: PIL modes a tensor keeps as they are (channels, and the dtype numpy gives).
_TENSOR_MODES = frozenset({"L", "LA", "RGB", "RGBA", "I;16", "I", "F"})


def check_pixels(width: int, height: int, max_pixels: int | None) -> None:
    """Refuse an image of ``width`` x ``height`` over ``max_pixels``.

    Raises:
        ImageTooLargeError: Naming the pixel count and the limit.
    """
    pixels = int(width) * int(height)
    if max_pixels is not None and pixels > max_pixels:
        raise ImageTooLargeError.over_limit(
            f"image header gives {width} x {height} = {pixels:,} pixels",
            limit=max_pixels,
            option="max_image_pixels",
            amount=pixels,
        )


_PIL_BOMB = re.compile(r"\((\d+) pixels\)")

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: JPEG frame headers (SOF0..SOF15, less DHT, JPG and DAC, which share the range).
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def header_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` read from the bytes of a PNG (its ``IHDR``, which
    must come first) or a JPEG (its frame header), without PIL; None when
    there is none to read. For images PIL will not open but another decoder
    might (a PNG whose ancillary chunk has a bad CRC: libpng warns and goes on)."""
    if data[:8] == _PNG_SIGNATURE:
        if data[12:16] != b"IHDR" or len(data) < 24:
            return None
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 4 <= len(data):  # every step moves on by at least one byte
        if data[at] != 0xFF or data[at + 1] == 0xFF:
            at += 1  # junk between markers, or a fill byte: skipped, as libjpeg does
            continue
        marker = data[at + 1]
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            at += 2
            continue
        if marker in _JPEG_FRAMES:  # length, precision, then height and width
            if at + 9 > len(data):
                return None
            return int.from_bytes(data[at + 7 : at + 9], "big"), int.from_bytes(data[at + 5 : at + 7], "big")
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker == 0xDA or length < 2:  # scan data before any frame header, or a broken length
            return None
        at += 2 + length
    return None


def open_image(data: bytes, max_pixels: int | None) -> Any:
    """Open an image with PIL (lazily: only the header is read) and check
    its size against ``max_pixels`` before any pixel is decoded.

    Raises:
        ImageTooLargeError: The header gives more than ``max_pixels`` pixels
            (or more than PIL's own global limit, twice
            ``PIL.Image.MAX_IMAGE_PIXELS``, which it enforces on opening).
        PIL.UnidentifiedImageError: PIL does not recognise the bytes.
    """
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # PIL's own check, at twice its global limit
        found = _PIL_BOMB.search(str(exc))
        pixels = int(found.group(1)) if found else None
        said = f"{pixels:,} pixels" if pixels is not None else "more pixels than PIL allows"
        if max_pixels is None or (pixels is not None and pixels <= max_pixels):
            # Our limit allows it; PIL's global one (set by the user) does not.
            raise ImageTooLargeError.over_limit(
                f"image header gives {said}, over PIL's global limit (twice PIL.Image.MAX_IMAGE_PIXELS, "
                "which must be raised too)",
                limit=2 * (Image.MAX_IMAGE_PIXELS or 0),
                option="max_image_pixels",
                amount=pixels,
            ) from None
        raise ImageTooLargeError.over_limit(
            f"image header gives {said}", limit=max_pixels, option="max_image_pixels", amount=pixels
        ) from None
    check_pixels(*image.size, max_pixels)
    return image


def decode_pil(data: bytes, *, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> Any:
    """Open an image with PIL and load its pixels, keeping the stored mode.

    Args:
        data: The encoded image.
        max_pixels: Most pixels accepted, checked on the header before
            decoding (None: no limit of ours).

    Returns:
        A loaded ``PIL.Image.Image`` (``L``, ``RGB``, ``RGBA``, ``P``, ... as
        stored; call ``.convert("RGB")`` for three channels).

    Raises:
        ImageTooLargeError: The image has more than ``max_pixels`` pixels.
    """
    image = open_image(data, max_pixels)
    image.load()
    return image


def _torchvision_kind(data: bytes) -> bool:
    """Whether torchvision's own decoders handle these bytes (JPEG, PNG, WebP)."""
    return data[:3] == b"\xff\xd8\xff" or data[:8] == b"\x89PNG\r\n\x1a\n" or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


@functools.cache
def torchvision_decoder() -> tuple[Any, Any] | None:
    """``torchvision.io``'s ``(decode_image, ImageReadMode)``, or None where
    the installed torchvision has no image decoders. They are deprecated
    since torchvision 0.29 (in favour of TorchCodec) and will go; without
    them every format goes through PIL. Their deprecation warning is about
    shardkit's choice of decoder, which a user cannot act on: not shown."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from torchvision.io import ImageReadMode, decode_image
    except ImportError:
        return None
    return decode_image, ImageReadMode


def decode_tensor(data: bytes, *, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> Any:
    """Decode an image to a ``torch.uint8`` tensor of shape ``C x H x W``.

    JPEG, PNG and WebP go through ``torchvision.io.decode_image`` (channels
    as stored: 1 for grayscale, 3 for RGB, 4 with alpha), where the
    installed torchvision still has it (:func:`torchvision_decoder`). Every
    other format is opened with PIL: grayscale, RGB and their alpha forms
    keep their channels, palette and 1-bit images become RGB (RGBA when
    transparent), other colour spaces RGB; 16-bit, 32-bit integer and float
    images keep their dtype (``uint16``, ``int32``, ``float32``) with one
    channel.

    The image's size is read from its header first (PIL opens lazily) and
    checked against ``max_pixels`` before anything is decoded, as for
    :func:`decode_pil`; where PIL cannot read the header, from the bytes
    (:func:`header_size`), and where neither can, the image is refused.

    Returns:
        A ``torch.Tensor`` of shape ``C x H x W`` (a first frame only for
        animations).

    Raises:
        ImageTooLargeError: The image has more than ``max_pixels`` pixels.
    """
    import torch

    torchvision = torchvision_decoder() if _torchvision_kind(data) else None
    if torchvision is not None:
        from PIL import UnidentifiedImageError

        decode_image, ImageReadMode = torchvision

        try:
            open_image(data, max_pixels)  # the header only: refuses a bomb before torchvision allocates
        except ImageTooLargeError:
            raise
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
            # A header PIL cannot read: torchvision's decoder has the last
            # word, once the size is known from the bytes themselves.
            if max_pixels is not None:
                size = header_size(data)
                if size is None:
                    raise ValueError(
                        "cannot read the image's size from its header, so max_image_pixels cannot be "
                        "checked; the image is damaged (decode it with max_image_pixels=None to try anyway)"
                    ) from None
                check_pixels(*size, max_pixels)
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.UNCHANGED)
    import numpy as np

    image = decode_pil(data, max_pixels=max_pixels)
    if image.mode not in _TENSOR_MODES:
        if image.mode in ("1",):
            image = image.convert("L")
        elif image.mode in ("P", "PA") and (image.mode == "PA" or "transparency" in image.info):
            image = image.convert("RGBA")
        else:
            image = image.convert("RGB")
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(np.array(array.transpose(2, 0, 1), order="C"))  # a writable copy
