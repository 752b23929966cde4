"""The user functions of the map-writer benchmark (issue #39), and their inputs.

Every writer in ``bench/bench_map_writer.py`` runs these same top-level
functions, so each pickles by reference (module + name) into whatever worker
process a writer starts:

- :func:`resize_photo`: CPU-bound image work: decode a ~500 KB JPEG (with
  ``Image.draft``, so libjpeg decodes at the largest 1/2, 1/4 or 1/8 scale that
  still covers the target), resize so the shorter side is 256 px, encode JPEG
  quality 90;
- :func:`tokenize_caption`: a word-level tokenizer in plain Python whose token
  ids are CRC-32 hashes modulo :data:`VOCAB_SIZE`, as an ``int32`` array.

Each takes an item ``(index, value)`` and returns one sample dict keyed by
``f"{index:09d}"``. Writers that want another shape get a thin adapter here
(:func:`ray_row`), which calls the same function.
"""

from __future__ import annotations

import io
import os
import random
import re
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

#: Shorter side of the resized photo, pixels.
SIDE = 256
JPEG_QUALITY = 90
#: Token ids are ``crc32(word) % VOCAB_SIZE``.
VOCAB_SIZE = 50_000
#: Words of the synthetic captions: made once from a fixed seed.
CAPTION_WORDS = 5_000
MIN_WORDS, MAX_WORDS = 10, 40

_WORD = re.compile(r"\w+|[^\w\s]")


def sample_key(index: int) -> str:
    """The ``__key__`` of item ``index``: zero-padded so keys sort as the items do."""
    return f"{index:09d}"


def resize_photo(item: tuple[int, str]) -> dict[str, Any]:
    """Decode the JPEG at ``item[1]``, shrink it to a shorter side of :data:`SIDE`, re-encode it.

    Args:
        item: ``(index, path)``.

    Returns:
        ``{"__key__", "jpg": JPEG bytes, "cls": index % 1000}``.
    """
    from PIL import Image

    index, path = item
    with Image.open(path) as image:
        # Both sides of the draft stay >= SIDE, so the shorter side does too.
        image.draft("RGB", (SIDE, SIDE))
        image = image.convert("RGB")
    width, height = image.size
    scale = SIDE / min(width, height)
    size = (max(SIDE, round(width * scale)), max(SIDE, round(height * scale)))
    small = image.resize(size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    small.save(out, format="JPEG", quality=JPEG_QUALITY)
    return {"__key__": sample_key(index), "jpg": out.getvalue(), "cls": index % 1000}


def token_ids(text: str) -> np.ndarray:
    """Split ``text`` into lower-case words and punctuation; each token's id is its CRC-32 modulo :data:`VOCAB_SIZE`."""
    return np.array([zlib.crc32(word.encode()) % VOCAB_SIZE for word in _WORD.findall(text.lower())], dtype=np.int32)


def tokenize_caption(item: tuple[int, str]) -> dict[str, Any]:
    """Tokenize one caption.

    Args:
        item: ``(index, caption)``.

    Returns:
        ``{"__key__", "tokens.npy": int32 array, "txt": the caption}``.
    """
    index, caption = item
    return {"__key__": sample_key(index), "tokens.npy": token_ids(caption), "txt": caption}


#: The benchmark's functions by the name its record uses.
FUNCTIONS: dict[str, Callable[[tuple[int, Any]], dict[str, Any]]] = {
    "image": resize_photo,
    "text": tokenize_caption,
}


# --------------------------------------------------------------------------- inputs


def photo_pool(folder: str) -> list[str]:
    """The JPEG files under ``folder`` (recursively), sorted."""
    found = []
    for root, _, names in os.walk(folder):
        found += [os.path.join(root, name) for name in names if name.endswith(".jpg")]
    return sorted(found)


def image_items(pool: list[str], count: int) -> list[tuple[int, str]]:
    """``count`` items cycling over the photo pool, so each item really decodes a photo."""
    if not pool:
        raise ValueError("the photo pool is empty")
    return [(i, pool[i % len(pool)]) for i in range(count)]


def caption_vocabulary(seed: int = 0) -> list[str]:
    """:data:`CAPTION_WORDS` distinct made-up lower-case words, the same for a seed."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < CAPTION_WORDS:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 10))))
    return sorted(words)


def text_items(count: int, seed: int = 0) -> list[tuple[int, str]]:
    """``count`` captions of :data:`MIN_WORDS` to :data:`MAX_WORDS` words, some capitalised or with
    punctuation; the same for a seed."""
    vocabulary = caption_vocabulary(seed)
    rng = random.Random(seed + 1)
    items = []
    for i in range(count):
        words = rng.choices(vocabulary, k=rng.randint(MIN_WORDS, MAX_WORDS))
        words[0] = words[0].capitalize()
        if len(words) > 12:
            words[len(words) // 2] += ","
        items.append((i, " ".join(words) + "."))
    return items


# --------------------------------------------------------------------------- adapters


def encode_fields(sample: dict[str, Any]) -> dict[str, Any]:
    """Each field as the bytes a tar member holds (the encoding webdataset's TarWriter applies
    to these fields): bytes as they are, text as UTF-8, ints as decimal text, arrays as ``.npy``."""
    out: dict[str, Any] = {}
    for name, value in sample.items():
        if name.startswith("__") or isinstance(value, bytes):
            out[name] = value
        elif isinstance(value, np.ndarray):
            buffer = io.BytesIO()
            np.save(buffer, value)
            out[name] = buffer.getvalue()
        elif isinstance(value, (str, int)):
            out[name] = str(value).encode()
        else:
            raise TypeError(f"field {name!r}: no encoding for {type(value).__name__}")
    return out


def ray_row(row: dict[str, Any], fn: Callable[[tuple[int, Any]], dict[str, Any]]) -> dict[str, Any]:
    """Ray Data's ``map`` over rows ``{"index", "value"}``: ``fn`` on ``(index, value)``, its fields
    already bytes (so ``write_webdataset(encoder=None)`` writes them as they are)."""
    return encode_fields(fn((int(row["index"]), row["value"])))
