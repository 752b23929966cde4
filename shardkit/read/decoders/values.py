"""Scalar and structured fields: text, integers, JSON, msgpack, CBOR, pickles.

msgpack and CBOR need the ``msgpack`` / ``cbor2`` packages of the ``torch``
extra; they are imported on the first field that needs them, and a missing
one raises an ``ImportError`` saying how to install it.
"""

from __future__ import annotations

import io
import json
from typing import Any


def _require(module: str, fields: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"decoding {fields} fields needs the {module} package, part of the reader's extra: "
            f"pip install 'shardkit[torch]' (or pip install {module})"
        ) from exc


def decode_text(data: bytes) -> str:
    """UTF-8 text."""
    return data.decode("utf-8")


def decode_int(data: bytes) -> int:
    """A decimal integer written as text (surrounding whitespace allowed)."""
    return int(data)


def decode_json(data: bytes) -> Any:
    """A JSON document (UTF-8, UTF-16 or UTF-32, as ``json.loads`` accepts)."""
    return json.loads(data)


def decode_msgpack(data: bytes) -> Any:
    """A msgpack document, with msgpack's defaults (strings as ``str``).

    Raises:
        ImportError: The ``msgpack`` package is not installed.
    """
    return _require("msgpack", "msgpack (mp, msg, msgpack)").unpackb(data)


def decode_cbor(data: bytes) -> Any:
    """A CBOR document (read with ``cbor2``).

    Raises:
        ImportError: The ``cbor2`` package is not installed.
    """
    return _require("cbor2", "CBOR (cbor)").loads(data)


def decode_pickle(data: bytes) -> Any:
    """``pickle.loads``: runs code chosen by whoever wrote the data."""
    import pickle

    return pickle.loads(data)


def decode_torch(data: bytes) -> Any:
    """``torch.load`` onto the CPU, full unpickling: runs code from the data."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
