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


def _parsed_json_encoder() -> Any:
    """``_JSON``'s C encoder, made once, without the circular-reference marks
    (which a failed call could leave set); None where there is no C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    j = _JSON
    assert not j.ensure_ascii and j.indent is None  # what encode_basestring and no indent stand for
    return make(None, j.default, json.encoder.encode_basestring, None, j.key_separator, j.item_separator,
                j.sort_keys, j.skipkeys, j.allow_nan)


_PARSED_JSON = _parsed_json_encoder()


def encode_parsed_json(value: Any) -> bytes:
    """:func:`encode_value` of a value a JSON parser just made (no cycles,
    every type encodable), without building an encoder per call."""
    if _PARSED_JSON is None or type(value) not in (dict, list):
        return encode_value(value)
    return "".join(_PARSED_JSON(value, 0)).encode("utf-8")


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
