"""One field of one sample as a piece of HTML, from its raw member bytes.

Everything here treats a member as hostile: it may hold markup, claim more
pixels than exist, lie about its length, or not be what its extension says.
So every text that came from a sample goes through :func:`text` (HTML
escaping, quotes included, with control and bidi characters made visible),
nothing from a sample is ever put in a tag or an attribute name, and the
only attribute values made from content are ``data:`` URIs this module
builds itself: a MIME type from a fixed table and base64 (whose alphabet
holds no quote or bracket). Sizes are checked before anything is decoded:
an image's pixel count from its header (:func:`open_image`), a ``.npy``
member's shape against its length. What cannot be drawn becomes a
placeholder that says why.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
import warnings
from dataclasses import dataclass
from typing import Any

from shardkit.config import human_bytes
from shardkit.errors import ImageTooLargeError
from shardkit.format.npy import parse_npy_header
from shardkit.read.decoders.images import IMAGE_EXTENSIONS, check_pixels, header_size, open_image

#: Longest side of a thumbnail, in pixels.
THUMBNAIL_PIXELS = 256
#: Most bytes of one audio or video member embedded as a player; a larger one is named with its size.
MAX_MEDIA_BYTES = 4 << 20
#: Most characters of a text field shown (the rest is counted).
MAX_TEXT_CHARS = 2000
#: Most characters of pretty-printed JSON shown.
MAX_JSON_CHARS = 6000
#: Most bytes of a JSON member parsed (a larger one is shown as text).
MAX_JSON_BYTES = 1 << 20
#: Leading values of a ``.npy`` array shown.
NPY_VALUES = 8

TEXT_EXTENSIONS = frozenset({"txt", "text", "caption", "md", "csv", "tsv", "html", "htm", "xml", "yaml", "yml"})
JSON_EXTENSIONS = frozenset({"json", "jsonl"})
CLASS_EXTENSIONS = frozenset({"cls", "cls2"})
#: Audio and video the page embeds as players, with the MIME type of their data URI.
MEDIA_TYPES: dict[str, tuple[str, str]] = {
    "wav": ("audio", "audio/wav"), "flac": ("audio", "audio/flac"), "mp3": ("audio", "audio/mpeg"),
    "ogg": ("audio", "audio/ogg"), "opus": ("audio", "audio/ogg"),
    "mp4": ("video", "video/mp4"), "webm": ("video", "video/webm"), "mkv": ("video", "video/x-matroska"),
    "mov": ("video", "video/quicktime"),
}  # fmt: skip
#: Video no browser plays: named with its size, never embedded.
UNPLAYABLE_VIDEO = frozenset({"avi"})

#: Characters shown as escapes instead of themselves: C0 and C1 controls
#: (less tab and newline) and the invisible ones that reorder or hide text.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def text(value: object) -> str:
    """``value`` as HTML text: escaped (``&``, ``<``, ``>``, both quotes),
    with control and bidi characters written as ``\\xNN``/``\\uNNNN``."""
    shown = _HIDDEN.sub(lambda m: ascii(m.group())[1:-1], str(value))
    return html.escape(shown, quote=True)


def data_uri(mime: str, data: bytes) -> str:
    """A ``data:`` URI of ``data`` (``mime`` from this module's own tables only)."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class Budget:
    """Bytes the page may still embed (thumbnails and players), so that a
    page of large members stays a file one can open and send."""

    def __init__(self, max_bytes: int):
        self.left = max_bytes

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (nothing taken) when they do not fit."""
        if size > self.left:
            return False
        self.left -= size
        return True


@dataclass(frozen=True)
class FieldContext:
    """What rendering a field needs beyond its bytes.

    Attributes:
        class_names: The manifest's class names by label, or None.
        max_image_pixels: Most pixels an image's header may give (None: no limit).
        budget: Bytes the page may still embed.
    """

    class_names: tuple[str, ...] | None
    max_image_pixels: int | None
    budget: Budget


def kind_of(field: str) -> str:
    """How a field is shown, by its last extension: ``image``, ``text``,
    ``json``, ``class``, ``npy``, ``audio``, ``video`` or ``bytes``."""
    ext = field.rsplit(".", 1)[-1]
    if field != ext and ext in ("gz", "zst"):
        return "bytes"  # a compressed member: shown as its name and size
    if ext in IMAGE_EXTENSIONS:
        return "image"
    for kind, names in (("text", TEXT_EXTENSIONS), ("json", JSON_EXTENSIONS), ("class", CLASS_EXTENSIONS)):
        if ext in names:
            return kind
    if ext == "npy":
        return "npy"
    if ext in MEDIA_TYPES:
        return MEDIA_TYPES[ext][0]
    return "video" if ext in UNPLAYABLE_VIDEO else "bytes"


def render_field(field: str, data: bytes, context: FieldContext) -> str:
    """One field as a ``<div class="field">``: its name and size, then the
    thumbnail, text, player or placeholder its kind calls for."""
    kind = kind_of(field)
    body = _RENDERERS[kind](field, data, context)
    return (
        f'<div class="field {kind}"><div class="name">{text(field)} <span class="size">{human_bytes(len(data))}'
        f"</span></div>{body}</div>"
    )


def placeholder(why: str) -> str:
    """The box shown instead of what could not be drawn, saying why."""
    return f'<div class="placeholder">{text(why)}</div>'


@dataclass(frozen=True)
class Thumbnail:
    """An image made small: its encoded bytes and MIME type, its own size
    and the original's (``width`` x ``height``, from the header)."""

    data: bytes
    mime: str
    size: tuple[int, int]
    width: int
    height: int


def thumbnail(data: bytes, *, max_pixels: int | None, size: int = THUMBNAIL_PIXELS) -> Thumbnail:
    """A thumbnail of an encoded image, at most ``size`` pixels a side: a
    JPEG, or a PNG when the image has transparency.

    The header's pixel count is checked against ``max_pixels`` before any
    pixel is decoded; a JPEG is decoded at a reduced scale (``draft``).

    Raises:
        ImageTooLargeError: The header gives more than ``max_pixels`` pixels.
        OSError, ValueError, SyntaxError: PIL cannot read the image.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL's warnings on odd files: the placeholder says it instead
        dims = header_size(data)  # a PNG's or JPEG's own header first: the message can give both sides
        if dims is not None:
            check_pixels(*dims, max_pixels)
        image = open_image(data, max_pixels)
        width, height = image.size
        image.draft("RGB", (size, size))
        image.thumbnail((size, size))
        alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
        image = image.convert("RGBA" if alpha else "RGB")
    out = io.BytesIO()
    image.save(out, format="PNG" if alpha else "JPEG", **({"optimize": True} if alpha else {"quality": 82}))
    return Thumbnail(out.getvalue(), "image/png" if alpha else "image/jpeg", image.size, width, height)


def _image(field: str, data: bytes, context: FieldContext) -> str:
    try:
        thumb = thumbnail(data, max_pixels=context.max_image_pixels)
    except ImageTooLargeError as exc:
        return placeholder(f"not drawn: {exc.what or exc}, over the page's limit of {exc.limit:,} pixels")
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as exc:  # what PIL raises on bad bytes
        from PIL import UnidentifiedImageError

        if isinstance(exc, UnidentifiedImageError):
            return placeholder(f"not drawn: not an image Pillow recognises (first bytes {data[:8].hex(' ')})")
        return placeholder(f"not drawn: a damaged image ({type(exc).__name__}: {exc})")
    if not context.budget.take(len(thumb.data)):
        return placeholder(f"{thumb.width} x {thumb.height} image not embedded: the page is at its size limit")
    width, height = thumb.size
    return (
        f'<img src="{data_uri(thumb.mime, thumb.data)}" alt="" width="{width}" height="{height}">'
        f'<div class="dims">{thumb.width} x {thumb.height}</div>'
    )


def _clipped(value: str, limit: int) -> str:
    if len(value) <= limit:
        return text(value)
    return f'{text(value[:limit])}<span class="more"> ... ({len(value) - limit:,} more characters)</span>'


def _text(field: str, data: bytes, context: FieldContext) -> str:
    return f'<pre class="text">{_clipped(data.decode("utf-8", errors="replace"), MAX_TEXT_CHARS)}</pre>'


def _json(field: str, data: bytes, context: FieldContext) -> str:
    note = ""
    shown = data.decode("utf-8", errors="replace")
    if len(data) > MAX_JSON_BYTES:
        note = f" (over {human_bytes(MAX_JSON_BYTES)}: not parsed)"
    else:
        try:
            shown = json.dumps(json.loads(data), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError) as exc:
            note = f" (not valid JSON: {exc})"
    summary = f"JSON, {len(shown.splitlines())} lines{note}"
    return f"<details><summary>{text(summary)}</summary><pre>{_clipped(shown, MAX_JSON_CHARS)}</pre></details>"


def _class(field: str, data: bytes, context: FieldContext) -> str:
    raw = data.decode("utf-8", errors="replace").strip()
    names = context.class_names
    label = int(raw) if raw.isdigit() and len(raw) < 10 else None
    name = ""
    if label is not None and names is not None and label < len(names):
        name = f' <span class="classname">{text(names[label])}</span>'
    return f'<div class="label">{_clipped(raw, 80)}{name}</div>'


def _npy(field: str, data: bytes, context: FieldContext) -> str:
    try:
        header = parse_npy_header(data)
    except ValueError as exc:
        return placeholder(f"not a readable .npy array: {exc}")
    dtype = header.dtype()
    described = f"shape {header.shape}, dtype {header.descr.decode('ascii', errors='replace')}"
    if dtype is None or dtype.hasobject or dtype.itemsize == 0:
        return f'<div class="npy">{text(described)} (values not shown: not a plain dtype)</div>'
    needed = header.count * dtype.itemsize
    held = len(data) - header.offset
    if held < needed:
        return placeholder(f"{described}: the header asks for {needed:,} bytes of data, the member holds {held:,}")
    count = min(NPY_VALUES, header.count)
    values = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in _values(data, dtype, count, header.offset))
    more = ", ..." if header.count > count else ""
    order = " (Fortran order: in stored order)" if header.fortran_order else ""
    return f'<div class="npy">{text(described)}<br>first values{order}: [{text(values + more)}]</div>'


def _values(data: bytes, dtype: Any, count: int, offset: int) -> list[Any]:
    import numpy as np

    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).tolist()


def _media(field: str, data: bytes, context: FieldContext) -> str:
    ext = field.rsplit(".", 1)[-1]
    if ext in UNPLAYABLE_VIDEO:
        return placeholder(f"{ext} video, not embedded: browsers do not play it")
    tag, mime = MEDIA_TYPES[ext][0], MEDIA_TYPES[ext][1]
    if len(data) > MAX_MEDIA_BYTES:
        return placeholder(f"not embedded: over the {human_bytes(MAX_MEDIA_BYTES)} a player may hold")
    if not context.budget.take(len(data)):
        return placeholder("not embedded: the page is at its size limit")
    return f'<{tag} controls preload="metadata" src="{data_uri(mime, data)}"></{tag}>'


def _bytes(field: str, data: bytes, context: FieldContext) -> str:
    return f'<div class="hex">{data[:16].hex(" ")}{" ..." if len(data) > 16 else ""}</div>'


_RENDERERS = {
    "image": _image, "text": _text, "json": _json, "class": _class, "npy": _npy,
    "audio": _media, "video": _media, "bytes": _bytes,
}  # fmt: skip
