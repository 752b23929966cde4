"""Samples given as Python objects, encoded as tar members: the writer's one encoder.

:func:`sample_fields` turns ``{"__key__": "a1", "jpg": ..., "tokens.npy": ...}``
into the key and its sorted ``(extension, bytes)`` members. It is what
:class:`~shardkit.write.writer.ShardWriter` writes, what the map stage stores
of a user's ``map`` (:mod:`shardkit.write.mapping`), and what
``shardkit.ray.write_shards`` stores of a Ray Data row, so the three take the
same values: bytes, str, numbers, dict/list (JSON), numpy arrays and torch
tensors (``.npy``, or an image under an image extension) and Pillow images.

The kind of a field is its last dotted part: ``tokens.npy`` is an array
field, ``left.jpg`` an image field (webdataset names multi-part fields so).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from typing import Any

from shardkit.errors import UsageError
from shardkit.format.codecs import encode_value
from shardkit.format.tar import field_name, member_name_problem, repeated_field, split_key
from shardkit.write.extensions import IMAGE_EXTENSIONS
from shardkit.write.resize import encode_image

KEY = "__key__"


def field_kind(ext: str) -> str:
    """The part of a field's name that says what it holds: ``tokens.npy`` -> ``npy``."""
    return ext.rpartition(".")[2].lower()


def sample_fields(
    sample: Mapping[str, Any], *, key_field: str = KEY, skip_none: bool = False
) -> tuple[str, list[tuple[str, bytes]]]:
    """Split a sample dict into its key and sorted ``(extension, bytes)`` fields.

    Keys starting with ``__`` other than ``key_field`` are metadata and
    dropped; with ``skip_none`` so are fields whose value is None (a table
    row's missing value), which are otherwise stored as JSON ``null``.

    Raises:
        UsageError: No key, a key that is not a valid member stem, or a value
            that cannot be encoded (the field named).
    """
    key = sample.get(key_field)
    if not isinstance(key, str) or not key:
        raise UsageError(f"sample needs a non-empty str {key_field!r}, got {short_repr(key)}")
    fields = []
    for ext in sorted(sample):
        if not isinstance(ext, str):
            raise UsageError(f"sample {key!r}: field names are str, got {ext!r}")
        if ext.startswith("__"):
            continue
        value = sample[ext]
        if value is None and skip_none:
            continue
        if split_key(f"{key}.{ext}") != (key, ext):
            raise UsageError(
                f"sample {key!r}: member {key}.{ext!s} would not split back into key {key!r} "
                f"and extension {ext!r} (a key has no '.' in its last path part)"
            )
        problem = member_name_problem(f"{key}.{ext}")
        if problem is not None:
            raise UsageError(f"sample {key!r}: member name {key}.{ext!s} is refused: {problem}")
        try:
            fields.append((ext, encode_value(stored_value(ext, value))))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"sample {key!r}, field {ext!r}: {exc}") from exc
    if not fields:
        raise UsageError(f"sample {key!r} has no fields besides its key")
    clash = repeated_field(ext for ext, _ in fields)
    if clash is not None:
        raise UsageError(
            f"sample {key!r}: fields {clash[0]!r} and {clash[1]!r} would both be read as field "
            f"{field_name(clash[0])!r} (readers lower-case extensions); give them distinct names"
        )
    return key, fields


def stored_value(ext: str, value: Any) -> Any:
    """``value`` as :func:`~shardkit.format.codecs.encode_value` takes it, for
    the objects a training script holds, as webdataset's writer takes them: a
    Pillow image under an image extension is encoded (:func:`encode_image`);
    a numpy array or a torch tensor is saved as ``.npy`` (no pickled objects)
    under ``npy`` (or ``NAME.npy``), or as an image under an image extension
    (uint8, H x W or H x W x C); a 0-d one is its number. Anything else is
    given back as it is."""
    module = type(value).__module__.partition(".")[0]
    if module not in ("PIL", "numpy", "torch"):
        return value
    kind = field_kind(ext)
    image_ext = kind in IMAGE_EXTENSIONS
    if module == "PIL" and hasattr(value, "save"):
        return encode_image(value, kind) if image_ext else value
    if module == "torch" and hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    import numpy as np

    if not isinstance(value, (np.ndarray, np.generic)):
        return value
    if value.ndim == 0:
        return value.item()
    if kind == "npy":
        return npy_bytes(value)
    if image_ext and value.dtype == np.uint8 and (value.ndim == 2 or (value.ndim == 3 and value.shape[2] in (1, 3, 4))):
        from PIL import Image

        return encode_image(Image.fromarray(value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value), kind)
    raise TypeError(
        f"cannot store a {value.dtype} array of shape {value.shape} as .{ext}: store it as .npy, "
        "or as an image a uint8 H x W or H x W x C array"
    )


def npy_bytes(array: Any) -> bytes:
    """``array`` as the bytes ``np.save(f, array, allow_pickle=False)`` writes.

    A C-ordered array of a plain type (the common case: token ids, features)
    is written here, its header made once per type and shape (numpy's own
    header writer takes ~10 us, as long as a small array's whole sample);
    anything else goes through ``np.save``.

    Raises:
        ValueError: An object array (it would need pickle).
    """
    import numpy as np

    dtype = array.dtype
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or not array.flags.c_contiguous:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)  # an object array is refused (ValueError)
        return buffer.getvalue()
    return _npy_header(dtype.str, array.shape) + array.tobytes()


@functools.lru_cache(maxsize=4096)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header (format 1.0) of a C-ordered array of ``dtype`` and ``shape``."""
    import numpy as np

    buffer = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
