"""Functions the map-writer tests hand to ``write_dataset(map=...)`` and to
``shardkit write --map tests.write.map_functions:NAME``: module-level, so
they pickle by reference and spawned workers and Ray tasks import them."""

from __future__ import annotations

import io
import os
import time

import numpy as np


def square(i: int) -> dict:
    """One sample per item: text, a named int32 array, a number."""
    return {"__key__": f"{i:06d}", "txt": f"item {i}", "tokens.npy": np.arange(i % 7, dtype=np.int32), "cls": i * i}


def fan_out(i: int):
    """A generator: two samples for an even item, none (filtered) for a multiple of 5, else one."""
    if i % 5 == 0:
        return
    copies = 2 if i % 2 == 0 else 1
    for c in range(copies):
        yield {"__key__": f"{i:06d}_{c}", "txt": f"{i}/{c}"}


def drop_odd(i: int) -> dict | None:
    return None if i % 2 else {"__key__": f"{i:06d}", "txt": str(i)}


def fails_on_13(i: int) -> dict:
    if i == 13:
        raise ValueError(f"cannot handle {i}")
    return {"__key__": f"{i:06d}", "txt": str(i)}


def always_fails(i: int) -> dict:
    raise RuntimeError("broken")


def returns_text(i: int):
    return "not a sample" if i == 3 else {"__key__": f"{i:06d}", "txt": str(i)}


def forgets_key(i: int) -> dict:
    return {"txt": str(i)} if i == 4 else {"__key__": f"{i:06d}", "txt": str(i)}


def unencodable(i: int) -> dict:
    return {"__key__": f"{i:06d}", "txt": object() if i == 5 else str(i)}


def same_key_twice(i: int) -> dict:
    return {"__key__": "dup" if i in (2, 7) else f"{i:06d}", "txt": str(i)}


def logged(log: str, i: int) -> dict:
    """Append the item to ``log`` (one line per call, O_APPEND), slowly enough
    that a test can kill the write half-way."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    time.sleep(0.01)
    return square(i)


def upper_text(sample: dict) -> dict:
    """For a path source: the sample as read, its cls doubled and a txt member added."""
    out = dict(sample)
    out["txt"] = sample["__key__"].upper()
    if "cls" in sample:
        out["cls"] = int(sample["cls"]) * 2
    return out


def image_item(i: int) -> dict:
    """A 64x48 PNG built from the item (for --resize on a sequence)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (i % 256, 0, 0)).save(buffer, format="PNG")
    return {"__key__": f"{i:06d}", "png": buffer.getvalue()}


NOT_CALLABLE = 42


def shout(sample: dict) -> dict:
    """For a table: its caption upper-cased, the image as fetched."""
    return {"__key__": sample["__key__"], "jpg": sample["jpg"], "txt": sample["txt"].upper()}


def one_in_a_million(i: int) -> dict | None:
    """Keeps item 0 and every millionth: a map over 10**7 items that stages almost nothing."""
    return None if i % 1_000_000 else {"__key__": f"{i:09d}", "txt": str(i)}


def token_ids(i: int) -> dict:
    """Token ids as a language-model corpus stores them: ``tokens.npy``, uint16, of varying length."""
    return {"__key__": f"{i:06d}", "tokens.npy": np.arange(i % 11, dtype=np.uint16), "txt": f"doc {i}"}


def tokens_then_floats(i: int) -> dict:
    """``tokens.npy`` of integers but for item 5, whose is floats: not a token field."""
    dtype = np.float32 if i == 5 else np.int32
    return {"__key__": f"{i:06d}", "tokens.npy": np.arange(3, dtype=dtype)}


def add_tokens(sample: dict) -> dict:
    """For a folder of ``dNN.*`` files: the sample as read, with ``ids.npy`` of NN int64 token ids."""
    return {**sample, "ids.npy": np.arange(int(sample["__key__"][-2:]), dtype=np.int64)}
