"""Small real datasets for the page's tests, written with ShardWriter."""

from __future__ import annotations

import io
import struct
import wave
import zlib

import numpy as np

import shardkit

#: Solid colours of the image dataset's samples, one a sample (the browser test finds them on screen).
COLOURS = ((220, 30, 30), (30, 180, 60), (40, 60, 220), (240, 200, 20))
#: A caption holding markup, and a JSON value holding more.
HOSTILE_CAPTION = '<script>document.title="owned"</script><img src=x onerror=alert(1)> "quoted" & done'
HOSTILE_JSON = {"html": "</pre></details><b onclick=alert(1)>bold</b>", "url": "javascript:alert(1)"}


def jpeg(colour: tuple[int, int, int], size: tuple[int, int] = (320, 240)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="JPEG", quality=95)
    return out.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims ``width`` x ``height`` (an image bomb's header)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def wav(seconds: float = 0.2, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        tone = (np.sin(np.arange(int(seconds * rate)) * 0.3) * 8000).astype("<i2")
        w.writeframes(tone.tobytes())
    return out.getvalue()


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def image_dataset(dest: str, *, num_samples: int = 4, max_samples: int = 2) -> str:
    """Images of :data:`COLOURS` (in turn) with a class and a caption; ImageFolder-like class names."""
    with shardkit.ShardWriter(dest, max_samples=max_samples, class_names=["cat", "dog"]) as writer:
        for i in range(num_samples):
            writer.write({"__key__": f"img{i:03d}", "jpg": jpeg(COLOURS[i % len(COLOURS)]), "cls": i % 2,
                          "txt": f"a photo, number {i}"})  # fmt: skip
    return dest


def text_dataset(dest: str, *, num_samples: int = 30) -> str:
    """Captions and JSON, some of them hostile (markup)."""
    with shardkit.ShardWriter(dest, max_samples=10) as writer:
        for i in range(num_samples):
            caption = HOSTILE_CAPTION if i % 3 == 0 else f"caption {i}\nsecond line"
            writer.write({"__key__": f"t{i:03d}", "txt": caption, "json": {"i": i, **HOSTILE_JSON}})
    return dest


def mixed_dataset(dest: str) -> str:
    """Every kind of field, and the faults the page must survive: a PNG
    whose header claims 20000 x 20000 pixels, bytes that are not an image, a
    ``.npy`` whose header asks for more data than it holds."""
    lying = npy(np.zeros(4, dtype=np.float64))
    lying = lying.replace(b"(4,), }      ", b"(9999999,), }")  # the header's length kept: NumPy pads with spaces
    assert b"9999999" in lying
    samples = [
        {"__key__": "all", "jpg": jpeg(COLOURS[0]), "txt": "hello", "json": {"a": [1, 2]}, "cls": 1,
         "npy": npy(np.arange(12, dtype=np.int32).reshape(3, 4)), "wav": wav(), "mp4": b"\0\0\0\x18ftypmp42",
         "avi": b"RIFF....AVI ", "bin": bytes(range(40))},
        {"__key__": "bomb", "png": png_claiming(20000, 20000), "txt": "a 400-megapixel header"},
        {"__key__": "junk", "jpg": b"this is not a jpeg at all", "txt": "not an image"},
        {"__key__": "liar", "npy": lying, "txt": "a lying array"},
    ]  # fmt: skip
    with shardkit.ShardWriter(dest, max_samples=2, class_names=["zero", "one"]) as writer:
        for sample in samples:
            writer.write(sample)
    return dest
