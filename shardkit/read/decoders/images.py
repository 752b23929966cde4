"""Image fields: bytes to a PIL image or a uint8 ``C x H x W`` tensor.

The extensions are webdataset's image list (the file extensions PIL can
open), less the ones PIL only recognises without being able to decode them
by itself: data formats with a stub plugin (``bufr``, ``grib``, ``h5``,
``hdf``), MPEG video (``mpg``, ``mpeg``), PostScript (``ps``, ``eps``: needs
Ghostscript) and Windows metafiles (``wmf``, ``emf``). Those fields stay
bytes instead of failing to decode.
"""

from __future__ import annotations

import io
from typing import Any

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


def decode_pil(data: bytes) -> Any:
    """Open an image with PIL and load its pixels, keeping the stored mode.

    Returns:
        A loaded ``PIL.Image.Image`` (``L``, ``RGB``, ``RGBA``, ``P``, ... as
        stored; call ``.convert("RGB")`` for three channels).
    """
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _torchvision_kind(data: bytes) -> bool:
    """Whether torchvision's own decoders handle these bytes (JPEG, PNG, WebP)."""
    return data[:3] == b"\xff\xd8\xff" or data[:8] == b"\x89PNG\r\n\x1a\n" or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def decode_tensor(data: bytes) -> Any:
    """Decode an image to a ``torch.uint8`` tensor of shape ``C x H x W``.

    JPEG, PNG and WebP go through ``torchvision.io.decode_image`` (channels
    as stored: 1 for grayscale, 3 for RGB, 4 with alpha). Every other format
    is opened with PIL: grayscale, RGB and their alpha forms keep their
    channels, palette and 1-bit images become RGB (RGBA when transparent),
    other colour spaces RGB; 16-bit, 32-bit integer and float images keep
    their dtype (``uint16``, ``int32``, ``float32``) with one channel.

    Returns:
        A ``torch.Tensor`` of shape ``C x H x W`` (a first frame only for
        animations).
    """
    import torch

    if _torchvision_kind(data):
        from torchvision.io import ImageReadMode, decode_image

        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.UNCHANGED)
    import numpy as np

    image = decode_pil(data)
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
