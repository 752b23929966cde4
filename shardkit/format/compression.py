"""Gzip and zstandard: recognising, decompressing and compressing bytes.

Used at two levels:

* whole shards (``shard.tar.gz``, ``shard.tgz``, ``shard.tar.zst``), which
  the reader streams through a :class:`ChunkDecompressor` and recognises by
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
from collections.abc import Iterator
from typing import Literal

from shardkit.errors import CorruptShardError, MemberTooLargeError
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

#: Default of ``max_member_bytes``: most bytes one compressed member may
#: inflate to. Text, JSON and array members of a sample are kilobytes to a
#: few tens of megabytes; 256 MiB leaves room for large arrays while a
#: DataLoader of 8 workers, each holding one such member and its decoded
#: value, stays within a few GB. Larger members are better stored
#: uncompressed (or in a shard compressed whole), or read with a raised limit.
DEFAULT_MAX_MEMBER_BYTES = 256 << 20

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


def decompress(data: bytes, kind: Compression, *, max_bytes: int | None = None) -> bytes:
    """Decompress a whole gzip or zstandard payload (all frames/members).

    Inflates piece by piece with an output limit per call, so a payload that
    inflates past ``max_bytes`` (a decompression bomb) is refused having
    allocated about ``max_bytes``, never what it would inflate to.

    Args:
        data: The compressed bytes.
        kind: ``"gzip"`` or ``"zstd"``.
        max_bytes: Most decompressed bytes accepted; None for no limit.

    Raises:
        ValueError: ``data`` is corrupt or truncated (the caller names where).
        MemberTooLargeError: It inflates past ``max_bytes`` (the caller
            names where, with :meth:`~shardkit.errors.MemberTooLargeError.located`).
    """
    out: list[bytes] = []
    for piece in iter_decompressed(data, kind, max_bytes=max_bytes):
        out.append(piece)
    return b"".join(out)


def iter_decompressed(data: bytes, kind: Compression, *, max_bytes: int | None = None) -> Iterator[bytes]:
    """The decompressed bytes of a whole payload, in pieces of at most
    :data:`PIECE_BYTES` (see :func:`decompress`; nothing is held between
    pieces, so checking that a payload decompresses costs one piece)."""
    if kind not in COMPRESSIONS:
        raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")
    stream = ChunkDecompressor(kind, path="<bytes>")
    total = 0
    try:
        for piece in stream.pieces(data):
            total += len(piece)
            if max_bytes is not None and total > max_bytes:
                raise MemberTooLargeError.over_limit(
                    f"{kind} data of {len(data):,} bytes decompresses to more than {max_bytes:,} bytes",
                    limit=max_bytes,
                    option="max_member_bytes",
                    amount=total,
                )
            yield piece
        stream.finish()
    except MemberTooLargeError:
        raise
    except CorruptShardError as exc:
        raise ValueError(f"corrupt {kind} data: {exc.detail}") from None


#: Most decompressed bytes one :meth:`ChunkDecompressor.pieces` step
#: returns, by default (a zstandard step may return one block more).
PIECE_BYTES = 1 << 20

#: Most bytes one zstandard block decompresses to (the format's
#: ``Block_Maximum_Size``); blocks that claim more are refused.
ZSTD_BLOCK_BYTES = 128 << 10
_ZSTD_SKIPPABLE = 0x184D2A50  # skippable frames: this magic | 0..15, then a 4-byte size


class _ZstdBlocks:
    """Finds where zstandard blocks end in a stream fed in chunks.

    zstandard's streaming decompressor has no output limit per call, but it
    can only emit a block once the block's bytes have all arrived, and a
    block holds at most :data:`ZSTD_BLOCK_BYTES`. Feeding it input cut after
    every few block ends therefore bounds each call's output. Only the frame
    and block headers are read here (sizes are claims: a compressed or raw
    block claiming more than the format allows is refused); the decompressor
    checks everything else. Each step advances by at least one byte.
    """

    def __init__(self) -> None:
        self._state = "magic"  # the header waited for: magic, skippable, descriptor or block
        self._need = 4  # its length
        self._head = bytearray()
        self._skip = 0  # bytes to pass over before that header
        self._ends = False  # a block ends where the skip does
        self._checksum = False  # the current frame ends with a 4-byte checksum

    def cuts(self, chunk: bytes | memoryview) -> list[int]:
        """Positions in ``chunk`` just after each block that ends in it.

        Raises:
            ValueError: A block header claims more than a block may hold.
        """
        out: list[int] = []
        pos, n = 0, len(chunk)
        while pos < n:
            if self._skip:
                step = min(self._skip, n - pos)
                self._skip -= step
                pos += step
                if self._skip == 0 and self._ends:
                    out.append(pos)
                    self._ends = False
                continue
            take = min(self._need - len(self._head), n - pos)
            self._head += chunk[pos : pos + take]
            pos += take
            if len(self._head) == self._need:
                head = bytes(self._head)
                self._head.clear()
                self._header(head)
                if self._ends and not self._skip:  # an empty block ends at its header
                    out.append(pos)
                    self._ends = False
        return out

    def _expect(self, state: str, skip: int = 0) -> None:
        self._state, self._need, self._skip = state, {"magic": 4, "skippable": 4, "descriptor": 1, "block": 3}[state], skip

    def _header(self, head: bytes) -> None:
        if self._state == "magic":
            if head == ZSTD_MAGIC:
                self._expect("descriptor")
            elif int.from_bytes(head, "little") & 0xFFFFFFF0 == _ZSTD_SKIPPABLE:
                self._expect("skippable")
            else:  # not a frame: the decompressor refuses it; nothing more to cut
                self._expect("magic", skip=1 << 62)
        elif self._state == "skippable":
            self._expect("magic", skip=int.from_bytes(head, "little"))
        elif self._state == "descriptor":
            d = head[0]
            fcs_flag, single, dict_flag = d >> 6, (d >> 5) & 1, d & 3
            self._checksum = bool((d >> 2) & 1)
            self._expect("block", skip=(0 if single else 1) + (0, 1, 2, 4)[dict_flag] + (single, 2, 4, 8)[fcs_flag])
        else:  # a block header: bit 0 last block, bits 1-2 type, the rest its size
            value = int.from_bytes(head, "little")
            last, kind, size = value & 1, (value >> 1) & 3, value >> 3
            if kind == 3 or size > ZSTD_BLOCK_BYTES:
                raise ValueError(f"a zstd block header claims {size} bytes in a block of type {kind}")
            length = 1 if kind == 1 else size  # an RLE block stores one byte
            if last:
                self._expect("magic", skip=length + (4 if self._checksum else 0))
            else:
                self._expect("block", skip=length)
            self._ends = True


class ChunkDecompressor:
    """Push decompressor for a gzip or zstandard stream, with bounded output.

    Feed compressed chunks in order with :meth:`pieces`, which yields the
    bytes they decompress to in pieces of at most ``max_output_bytes`` (for
    zstandard, at most one block of 128 KiB more): the output of one call is
    bounded whatever the compression ratio, so a stream is inflated with
    memory bounded by what the caller holds of it (gzip through zlib's
    ``max_length`` and ``unconsumed_tail``; zstandard by feeding its
    decompressor input cut after a few blocks, see :class:`_ZstdBlocks`).
    Concatenated gzip members and zstandard frames (what ``pigz`` and
    ``zstd -T`` write) are followed. :meth:`finish` checks that the stream
    ended on a frame boundary. Errors name the *compressed* offset: the
    bytes fed before the chunk that failed, or where the stream stopped. A
    failed allocation is a ``MemoryError``, never reported as corruption.

    Args:
        kind: ``"gzip"`` or ``"zstd"``.
        path: The shard, for error messages.
        max_output_bytes: Most bytes one yielded piece holds (default
            :data:`PIECE_BYTES`, 1 MiB).
    """

    def __init__(self, kind: Compression, *, path: str, max_output_bytes: int = PIECE_BYTES):
        if kind not in COMPRESSIONS:
            raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")
        if max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be positive, not {max_output_bytes}")
        self.kind = kind
        self.path = path
        self.max_output_bytes = max_output_bytes
        self.consumed = 0  # compressed bytes fed so far
        self._errors: tuple[type[BaseException], ...] = (zlib.error,) if kind == "gzip" else (_zstd().ZstdError,)
        self._obj = self._new()
        self._in_frame = False  # a frame has started and not yet ended
        self._blocks = _ZstdBlocks() if kind == "zstd" else None
        #: Blocks per zstandard call, so one call yields about max_output_bytes.
        self._blocks_per_call = max(1, max_output_bytes // ZSTD_BLOCK_BYTES)

    def _new(self):  # type: ignore[no-untyped-def]
        if self.kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        return _zstd().ZstdDecompressor().decompressobj()

    def _error(self, message: str, offset: int, where: str = "") -> CorruptShardError:
        where = where or f"at compressed byte {offset}"
        error = CorruptShardError(
            f"{self.path}: {self.kind}-compressed shard {message} {where}. "
            "Re-download or rewrite this shard (`shardkit write` reshards it uncompressed).",
            path=self.path,
            offset=offset,
        )
        error.detail = f"{message} {where}"  # type: ignore[attr-defined]  # for member errors, which name their own place
        return error

    def feed(self, chunk: bytes) -> bytes:
        """Decompress ``chunk``; return all it yields at once (unbounded:
        prefer :meth:`pieces` for data you did not write).

        Raises:
            CorruptShardError: The data is not valid for the compression.
        """
        return b"".join(self.pieces(chunk))

    def pieces(self, chunk: bytes | memoryview) -> Iterator[bytes]:
        """Decompress ``chunk``, yielding its output in bounded pieces
        (possibly none). Consume the pieces before feeding the next chunk.

        Raises:
            CorruptShardError: The data is not valid for the compression.
            MemoryError: An allocation failed (memory ran out).
        """
        start = self.consumed
        self.consumed += len(chunk)
        view = memoryview(chunk)
        try:
            if self._blocks is None:
                yield from self._gzip(view)
                return
            try:
                cuts = self._blocks.cuts(view)
            except ValueError as exc:
                raise self._error(f"is corrupt ({exc})", start, f"in compressed bytes {start}..{self.consumed}") from None
            lo = 0
            step = self._blocks_per_call
            for i in range(step - 1, len(cuts), step):
                yield from self._zstd(view[lo : cuts[i]])
                lo = cuts[i]
            if lo < len(view):
                yield from self._zstd(view[lo:])
        except self._errors as exc:
            raise self._error(f"is corrupt ({exc})", start, f"in compressed bytes {start}..{self.consumed}") from None

    def _gzip(self, data: memoryview | bytes) -> Iterator[bytes]:
        limit = self.max_output_bytes
        while True:
            out = self._obj.decompress(data, limit)
            if data or out:
                self._in_frame = True
            if out:
                yield out
            if self._obj.eof:
                # One member ended; anything after it starts the next one.
                data = self._obj.unused_data
                self._obj = self._new()
                self._in_frame = False
                if data and data.strip(b"\x00") == b"":
                    return  # zero padding after the last member (tar -z pads blocks)
                if not data:
                    return
                continue
            data = self._obj.unconsumed_tail
            if not data and len(out) < limit:
                return

    def _zstd(self, data: memoryview) -> Iterator[bytes]:
        while data:
            out = self._obj.decompress(data)
            self._in_frame = True
            if out:
                yield out
            if not self._obj.eof:
                return
            data = memoryview(self._obj.unused_data)
            self._obj = self._new()
            self._in_frame = False

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
