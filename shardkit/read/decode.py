"""Decoding sample fields by extension (the reader's ``decode=`` option).

The reader yields raw bytes unless asked. :class:`Decoder` decodes each field
by the last part of its extension, ignoring case (``seg.png`` decodes as
``png``, ``input.txt`` as ``txt``), with webdataset's default table:

======================================  =======================================
extension                               value
======================================  =======================================
jpg jpeg png webp gif bmp tif tiff      PIL image in its stored mode, or a
ppm pgm pbm pnm ... (webdataset's       ``C x H x W`` uint8 tensor; see
image list)                             :mod:`.decoders.images`
txt text transcript                     str (UTF-8)
cls cls2 class count index inx id       int
label
json jsn                                parsed JSON
npy                                     numpy array (no pickled objects)
wav flac mp3 ogg opus                   ``{"array": channels x samples
                                        float32 tensor, "sampling_rate":
                                        int}`` with ``audio="tensor"``
                                        (:mod:`.decoders.audio`)
npz                                     dict of name -> numpy array
mp msg msgpack                          msgpack document (``msgpack``)
cbor                                    CBOR document (``cbor2``)
ten tb tenbin                           list of numpy arrays (webdataset's
                                        tenbin format)
pickle pkl pyd                          ``pickle.loads``, only with
                                        ``allow_pickle``
pth pt                                  ``torch.load``, only with
                                        ``allow_torch_load``
EXT.gz EXT.zst                          decompressed, then decoded as EXT
gz zst                                  decompressed bytes
anything else                           bytes, unchanged
======================================  =======================================

Video members (``mp4``, ``webm``, ...) stay bytes: a clip is chosen and
decoded in ``map`` (:class:`~shardkit.transforms.DecodeVideoClip`), which
decodes only what the clip needs. ``decode="tensor"`` decodes audio too;
``Decoder(audio="tensor")`` does with any image mode.

Limits: a compressed member (and an ``npz`` archive, whose arrays are
deflated) is inflated up to ``max_member_bytes`` (default
:data:`DEFAULT_MAX_MEMBER_BYTES`, 256 MiB) and
an image's header is checked against ``max_image_pixels`` (default Pillow's
``Image.MAX_IMAGE_PIXELS``, about 89.5 megapixels) before any pixel is
decoded, by PIL and torchvision alike; an audio member's header is checked
against ``max_audio_samples`` (:data:`~shardkit.read.decoders.audio.DEFAULT_MAX_AUDIO_SAMPLES`)
before any sample is decoded. Past any limit the field raises
:class:`~shardkit.errors.MemberTooLargeError` (or its subclass
:class:`~shardkit.errors.ImageTooLargeError`) naming the shard, the member
and the limit; the readers skip the sample under ``on_error="skip"``.

As in webdataset, a compression suffix is undone first (``txt.gz`` is text,
``npy.zst`` an array; webdataset knows only ``.gz`` and undoes one suffix,
shardkit undoes each in turn). The compressed forms need no extra package.

Unpickling runs code chosen by whoever wrote the data, so both pickle-based
decoders are off unless explicitly enabled; a field that would need them
raises :class:`~shardkit.errors.UsageError` instead. A field that fails to
decode raises the decoder's own error with a note naming the field and the
sample's key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from shardkit.errors import MemberTooLargeError, UsageError
from shardkit.format.compression import (
    DEFAULT_MAX_MEMBER_BYTES,
    MEMBER_SUFFIXES,
    Compression,
    decompress,
    member_compression,
)
from shardkit.io.urls import redact_url
from shardkit.read.decoders.audio import AUDIO_EXTENSIONS, DEFAULT_MAX_AUDIO_SAMPLES, decode_audio
from shardkit.read.decoders.arrays import decode_npy, decode_npz, decode_tenbin
from shardkit.read.decoders.images import DEFAULT_MAX_IMAGE_PIXELS, IMAGE_EXTENSIONS, decode_pil, decode_tensor
from shardkit.read.decoders.values import (
    decode_cbor,
    decode_int,
    decode_json,
    decode_msgpack,
    decode_pickle,
    decode_text,
    decode_torch,
)

ImageMode = Literal["pil", "tensor"]
AudioMode = Literal["tensor"]

FieldDecoder = Callable[[bytes], Any]

INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id", "label"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
MSGPACK_EXTENSIONS = frozenset({"mp", "msg", "msgpack"})
TENBIN_EXTENSIONS = frozenset({"ten", "tb", "tenbin"})
PICKLE_EXTENSIONS = frozenset({"pickle", "pkl", "pyd"})
TORCH_EXTENSIONS = frozenset({"pt", "pth"})

#: The safe decoders other than images, by (last, lower-case) extension.
SAFE_DECODERS: dict[str, FieldDecoder] = {
    **dict.fromkeys(INT_EXTENSIONS, decode_int),
    **dict.fromkeys(TEXT_EXTENSIONS, decode_text),
    **dict.fromkeys(JSON_EXTENSIONS, decode_json),
    **dict.fromkeys(MSGPACK_EXTENSIONS, decode_msgpack),
    **dict.fromkeys(TENBIN_EXTENSIONS, decode_tenbin),
    "npy": decode_npy,
    "npz": decode_npz,
    "cbor": decode_cbor,
}


@dataclass(frozen=True)
class Decompressed:
    """A field decoder for a compressed member: decompress, then decode.

    Attributes:
        compression: ``"gzip"`` or ``"zstd"``.
        then: The decoder of the inner extension, or None to return the
            decompressed bytes.
        max_bytes: Most bytes the member may inflate to (None: no limit).
    """

    compression: Compression
    then: FieldDecoder | None = None
    max_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES

    def __call__(self, data: bytes) -> Any:
        """Decompress ``data`` and decode the result.

        Raises:
            ValueError: The compressed data is corrupt or truncated.
            MemberTooLargeError: It inflates past ``max_bytes`` (nothing
                more is inflated).
        """
        raw = decompress(data, self.compression, max_bytes=self.max_bytes)
        return raw if self.then is None else self.then(raw)


@dataclass(frozen=True)
class Decoder:
    """Decode a sample's fields by extension (see the module's table).

    Attributes:
        image: ``"pil"`` for PIL images, ``"tensor"`` for uint8 ``C x H x W``
            tensors, or None to leave image bytes as they are.
        allow_pickle: Unpickle ``pickle`` / ``pkl`` / ``pyd`` fields (runs
            code from the data: only for data you trust).
        allow_torch_load: ``torch.load`` ``pt`` / ``pth`` fields (same risk).
        max_member_bytes: Most bytes a compressed member (``txt.gz``,
            ``npy.zst``, ...) or an ``npz`` archive may inflate to; default 256 MiB
            (:data:`DEFAULT_MAX_MEMBER_BYTES`); None for no limit.
        max_image_pixels: Most pixels an image may have, read from its
            header before decoding; default Pillow's ``MAX_IMAGE_PIXELS``
            (89,478,485); None for no limit of ours.
        audio: ``"tensor"`` to decode audio members (``wav``, ``flac``,
            ``mp3``, ``ogg``, ``opus``; needs the ``media`` extra), or None
            to leave their bytes (for :class:`~shardkit.transforms.DecodeAudioClip`).
        max_audio_samples: Most samples (all channels) an audio member may
            decode to, read from its header before decoding; default 2**26.
    """

    image: ImageMode | None = "pil"
    allow_pickle: bool = False
    allow_torch_load: bool = False
    max_member_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    audio: AudioMode | None = None
    max_audio_samples: int | None = DEFAULT_MAX_AUDIO_SAMPLES

    def __post_init__(self) -> None:
        if self.image not in ("pil", "tensor", None):
            raise UsageError(f"Decoder image must be 'pil', 'tensor' or None, not {self.image!r}")
        if self.audio not in ("tensor", None):
            raise UsageError(f"Decoder audio must be 'tensor' or None, not {self.audio!r}")
        for name in ("max_member_bytes", "max_image_pixels", "max_audio_samples"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(f"Decoder {name} must be a positive integer or None, not {value!r}")

    def function_for(self, extension: str) -> FieldDecoder | None:
        """The decode function for a field extension, or None to keep bytes.

        Args:
            extension: The field's name in the sample (``"jpg"``,
                ``"seg.png"``, ``"txt.gz"``).

        Raises:
            UsageError: The extension needs pickle or ``torch.load`` and that
                was not enabled.
        """
        return self._lookup(extension.lower(), extension)

    def _lookup(self, lower: str, extension: str) -> FieldDecoder | None:
        """:meth:`function_for` of the lower-case ``lower``; ``extension`` names the field in errors."""
        if lower in MEMBER_SUFFIXES:
            return Decompressed(MEMBER_SUFFIXES[lower], max_bytes=self.max_member_bytes)
        inner, compression = member_compression(lower)
        if compression is not None:
            return Decompressed(compression, self._lookup(inner, extension), max_bytes=self.max_member_bytes)
        ext = lower.rsplit(".", 1)[-1]
        if ext in IMAGE_EXTENSIONS:
            if self.image is None:
                return None
            return functools.partial(decode_pil if self.image == "pil" else decode_tensor, max_pixels=self.max_image_pixels)
        if ext in AUDIO_EXTENSIONS:
            if self.audio is None:
                return None
            return functools.partial(decode_audio, max_samples=self.max_audio_samples)
        if ext == "npz":  # a zip archive: it inflates, so it takes the member limit
            return functools.partial(decode_npz, max_bytes=self.max_member_bytes)
        found = SAFE_DECODERS.get(ext)
        if found is not None:
            return found
        if ext in PICKLE_EXTENSIONS:
            if not self.allow_pickle:
                raise UsageError(
                    f"field {extension!r} is a pickle; unpickling runs code from the data, so it is off. "
                    "Pass decode=Decoder(allow_pickle=True) if you trust this dataset."
                )
            return decode_pickle
        if ext in TORCH_EXTENSIONS:
            if not self.allow_torch_load:
                raise UsageError(
                    f"field {extension!r} needs torch.load, which runs code from the data, so it is off. "
                    "Pass decode=Decoder(allow_torch_load=True) if you trust this dataset."
                )
            return decode_torch
        return None

    def __call__(self, sample: dict[str, Any], *, path: str | None = None) -> dict[str, Any]:
        """Decode every field of ``sample`` in place and return it.

        Fields whose name starts with ``__`` (``__key__``) and fields that
        are not bytes (already decoded) are left alone.

        Args:
            sample: The sample dict.
            path: The shard it comes from, for error messages.

        Raises:
            MemberTooLargeError: A field is over ``max_member_bytes`` or
                ``max_image_pixels``; names ``path`` and the member.
            UsageError: A field needs pickle or ``torch.load`` and that was
                not enabled.
            Exception: A field's decoder failed (its own error, for example
                ``ValueError`` for a malformed number or JSON document), with
                a note naming the field and the sample's key.
        """
        cache = self._cache()
        for ext, value in sample.items():
            if ext.startswith("__") or not isinstance(value, (bytes, bytearray, memoryview)):
                continue
            if ext in cache:
                fn = cache[ext]
            else:
                fn = cache[ext] = self.function_for(ext)
            if fn is None:
                continue
            try:
                sample[ext] = fn(bytes(value) if not isinstance(value, bytes) else value)
            except MemberTooLargeError as exc:
                raise exc.located(path=path, member=f"{sample.get('__key__')}.{ext}") from None
            except Exception as exc:
                add_note = getattr(exc, "add_note", None)  # Python 3.11+
                if add_note is not None:
                    where = f" in {redact_url(path)}" if path else ""
                    add_note(f"while decoding field {ext!r} of sample {sample.get('__key__')!r}{where}")
                raise
        return sample

    def _cache(self) -> dict[str, FieldDecoder | None]:
        cache = self.__dict__.get("_functions")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_functions", cache)
        return cache

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the options only; the per-extension cache is rebuilt."""
        return {k: v for k, v in self.__dict__.items() if k != "_functions"}


def make_decoder(decode: ImageMode | Decoder | None) -> Decoder | None:
    """Normalize the reader's ``decode=`` option.

    ``"pil"`` is a shorthand for ``Decoder(image="pil")``, ``"tensor"`` for
    ``Decoder(image="tensor", audio="tensor")``.

    Raises:
        UsageError: ``decode`` is none of these.
    """
    if decode is None or isinstance(decode, Decoder):
        return decode
    if decode == "pil":
        return Decoder(image="pil")
    if decode == "tensor":
        return Decoder(image="tensor", audio="tensor")
    raise UsageError(f"decode must be 'pil', 'tensor', a shardkit Decoder or None, not {decode!r}")


def undecodable(exc: BaseException) -> bool:
    """Whether ``exc``, raised by :meth:`Decoder.__call__`, is the data's
    fault (a field that does not decode: a broken image, malformed JSON, a
    member over a limit), which ``on_error="skip"`` skips like a corrupt
    sample; not a setting's (:class:`~shardkit.errors.UsageError`, e.g.
    pickle not allowed) or the process's (``MemoryError``)."""
    return isinstance(exc, Exception) and not isinstance(exc, (UsageError, MemoryError))


def describe_fault(exc: BaseException) -> str:
    """One line for a skipped decoding fault: shardkit's own message, or the
    decoder's error with the note naming field, sample and shard."""
    if isinstance(exc, MemberTooLargeError):
        return str(exc)
    notes = "; ".join(getattr(exc, "__notes__", ()))
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} ({notes})" if notes else text
