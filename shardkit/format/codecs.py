"""Turning Python values into member bytes (writing side).

Sample values given to the writer as Python objects become bytes by type:
``bytes`` as they are, ``str`` as UTF-8, ``int``/``float``/``bool`` as their
decimal text (so ``cls: 3`` is the member ``KEY.cls`` holding ``b"3"``), and
``dict``/``list``/``None`` as compact JSON. Nothing is ever pickled.
"""

from __future__ import annotations

import json
from typing import Any

# One encoder for every call: json.dumps with options builds a new one each time.
_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encode_value(value: Any) -> bytes:
    """Encode one field value as member bytes.

    Raises:
        TypeError: The value has a type with no safe byte encoding.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, (int, float)):
        return str(value).encode("ascii")
    if value is None or isinstance(value, (dict, list)):
        return _JSON.encode(value).encode("utf-8")
    raise TypeError(
        f"cannot store a {type(value).__name__} as a member: pass bytes, str, int, float, dict or list"
    )
