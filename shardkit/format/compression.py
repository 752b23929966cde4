"""Gzip and zstandard: recognising, decompressing and compressing bytes.

Used at two levels:

* whole shards (``shard.tar.gz``, ``shard.tgz``, ``shard.tar.zst``), which
  the reader streams through a :class:`StreamDecompressor` and recognises by
  their first bytes (:func:`detect_compression`), whatever their name;
* members (``KEY.txt.gz``, ``KEY.npy.zst``, webdataset's convention), which
  the writer compresses reproducibly (:func:`compress`) and the decoder
  decompresses by suffix (:func:`member_compression`, :func:`decompress`).

Output is reproducible: gzip members carry mtime 0, no file name and a fixed
level; zstandard frames a fixed level, the content size and no checksum.

This module does no I/O and imports nothing above ``format/``.
"""

from __future__ import annotations

import gzip
import zlib
from typing import Literal

from shardkit.errors import CorruptShardError
from shardkit.format.location import open_regular

Compression = Literal["gzip", "zstd"]
COMPRESSIONS: tuple[str, ...] = ("gzip", "zstd")

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Bytes :func:`detect_compression` needs to see.
MAGIC_BYTES = 4

#: Member suffix -> compression (``KEY.txt.gz`` is ``txt`` compressed with gzip).
MEMBER_SUFFIXES: dict[str, Compression] = {"gz": "gzip", "zst": "zstd"}
#: Compression -> the suffix the writer appends to a member's extension.
SUFFIX_OF: dict[str, str] = {"gzip": "gz", "zstd": "zst"}
#: Shard file name endings of whole-shard compressed tars.
SHARD_SUFFIXES: dict[str, Compression] = {".tar.gz": "gzip", ".tgz": "gzip", ".tar.zst": "zstd", ".tar.zstd": "zstd"}

#: Fixed levels, so the same input gives the same bytes.
GZIP_LEVEL = 6
ZSTD_LEVEL = 3

#: Member extensions (last part) worth compressing: text and raw arrays.
#: Already-compressed media (jpg, png, webp, mp4, flac, npz, ...) never are.
COMPRESSIBLE_EXTENSIONS: frozenset[str] = frozenset(
    {
        "txt", "text", "json", "jsonl", "csv", "tsv", "xml", "html", "htm", "yaml", "yml",
        "npy", "ten", "tenbin", "mp", "msgpack", "cbor", "pyd", "pickle", "pkl", "pth",
        "svg", "ppm", "pgm", "pbm", "bmp", "wav", "srt", "vtt", "md",
    }
)  # fmt: skip


def detect_compression(first_bytes: bytes) -> Compression | None:
    """The compression of a stream from its first bytes (see :data:`MAGIC_BYTES`).

    Args:
        first_bytes: The stream's first bytes; fewer than four only when the
            stream is that short.

    Returns:
        ``"gzip"`` (``1f 8b``), ``"zstd"`` (``28 b5 2f fd``) or None.
    """
    if first_bytes[:2] == GZIP_MAGIC:
        return "gzip"
    if first_bytes[:4] == ZSTD_MAGIC:
        return "zstd"
    return None


def file_compression(path: str) -> Compression | None:
    """The compression of the local file at ``path``, from its first bytes.

    Raises:
        OSError: The file cannot be opened or read.
        ManifestError: The path names a FIFO, device, socket or directory.
    """
    f, _ = open_regular(path, what="shard")
    with f:
        return detect_compression(f.read(MAGIC_BYTES))


def compression_from_name(name: str) -> Compression | None:
    """The compression a shard's file name suggests (``.tar.gz``, ``.tgz``,
    ``.tar.zst``), or None. Names only hint; :func:`detect_compression` decides."""
    lower = name.lower().split("?", 1)[0]
    for suffix, kind in SHARD_SUFFIXES.items():
        if lower.endswith(suffix):
            return kind
    return None


def member_compression(ext: str) -> tuple[str, Compression | None]:
    """Split a member extension into the inner extension and its compression.

    >>> member_compression("txt.gz")
    ('txt', 'gzip')
    >>> member_compression("jpg")
    ('jpg', None)
    """
    base, dot, last = ext.rpartition(".")
    kind = MEMBER_SUFFIXES.get(last) if dot else None
    return (base, kind) if kind is not None else (ext, None)


def should_compress(ext: str) -> bool:
    """Whether the writer compresses members of extension ``ext``.

    Decided by extension alone, never by size, so that every sample of a
    dataset has the same field names (``txt.gz`` in all or none).
    """
    if member_compression(ext)[1] is not None:
        return False
    return ext.rpartition(".")[2].lower() in COMPRESSIBLE_EXTENSIONS


def compressed_extension(ext: str, kind: Compression | None) -> str:
    """The extension a member of extension ``ext`` is stored under when the
    writer compresses members with ``kind`` (``txt`` -> ``txt.gz``)."""
    if kind is None or not should_compress(ext):
        return ext
    return f"{ext}.{SUFFIX_OF[kind]}"


def _zstd():  # type: ignore[no-untyped-def]
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ImportError("zstandard data needs the zstandard package: pip install zstandard") from exc
    return zstandard


def compress(data: bytes, kind: Compression) -> bytes:
    """Compress ``data`` reproducibly (fixed level; gzip: mtime 0, no name).

    Args:
        data: The bytes.
        kind: ``"gzip"`` or ``"zstd"``.
    """
    if kind == "gzip":
        return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    if kind == "zstd":
        zstd = _zstd()
        return zstd.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=False, write_content_size=True).compress(data)
    raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")


def decompress(data: bytes, kind: Compression) -> bytes:
    """Decompress a whole gzip or zstandard payload (all frames/members).

    Raises:
        ValueError: ``data`` is corrupt or truncated (the caller names where).
    """
    if kind == "gzip":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"corrupt gzip data: {exc}") from None
    if kind == "zstd":
        stream = StreamDecompressor("zstd", path="<bytes>")
        out = stream.feed(data)
        try:
            stream.finish()
        except CorruptShardError as exc:
            raise ValueError(f"corrupt zstd data: {exc}") from None
        return out
    raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")


class StreamDecompressor:
    """Push decompressor for a whole-shard gzip or zstandard stream.

    Feed compressed chunks in order with :meth:`feed`; each call returns the
    bytes they decompress to. Concatenated gzip members and zstandard frames
    (what ``pigz`` and ``zstd -T`` write) are followed. :meth:`finish` checks
    that the stream ended on a frame boundary. Errors name the *compressed*
    offset: the bytes fed before the chunk that failed, or where the stream
    stopped.

    Args:
        kind: ``"gzip"`` or ``"zstd"``.
        path: The shard, for error messages.
    """

    def __init__(self, kind: Compression, *, path: str):
        if kind not in COMPRESSIONS:
            raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")
        self.kind = kind
        self.path = path
        self.consumed = 0  # compressed bytes fed so far
        self._obj = self._new()
        self._in_frame = False  # a frame has started and not yet ended

    def _new(self):  # type: ignore[no-untyped-def]
        if self.kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        return _zstd().ZstdDecompressor().decompressobj()

    def _error(self, message: str, offset: int, where: str = "") -> CorruptShardError:
        where = where or f"at compressed byte {offset}"
        return CorruptShardError(
            f"{self.path}: {self.kind}-compressed shard {message} {where}. "
            "Re-download or rewrite this shard (`shardkit write` reshards it uncompressed).",
            path=self.path,
            offset=offset,
        )

    def feed(self, chunk: bytes) -> bytes:
        """Decompress ``chunk``; return what it yields (possibly nothing).

        Raises:
            CorruptShardError: The data is not valid for the compression.
        """
        start = self.consumed
        self.consumed += len(chunk)
        out: list[bytes] = []
        data = chunk
        while data:
            try:
                out.append(self._obj.decompress(data))
            except Exception as exc:  # zlib.error, zstd.ZstdError
                raise self._error(f"is corrupt ({exc})", start, f"in compressed bytes {start}..{self.consumed}") from None
            self._in_frame = True
            if not self._obj.eof:
                break
            # One frame ended; anything after it starts the next one.
            data = self._obj.unused_data
            self._obj = self._new()
            self._in_frame = False
            if data and self.kind == "gzip" and data.strip(b"\x00") == b"":
                data = b""  # zero padding after the last member (tar -z pads blocks)
        return b"".join(out)

    def finish(self) -> None:
        """Check the stream ended on a frame boundary.

        Raises:
            CorruptShardError: The stream stopped inside a frame (truncated),
                naming the compressed offset where it stopped.
        """
        if self._in_frame or self.consumed == 0:
            raise self._error("is truncated: the data stops inside a compressed frame", self.consumed)


def stream_compressor(kind: Compression):  # type: ignore[no-untyped-def]
    """A reproducible streaming compressor with ``compress(bytes)`` and
    ``flush()`` methods, for writing a compressed stream piece by piece."""
    if kind == "gzip":
        # zlib with a gzip wrapper: header mtime 0, no name, fixed level.
        return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    if kind == "zstd":
        return _zstd().ZstdCompressor(level=ZSTD_LEVEL, write_checksum=False).compressobj()
    raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")
