"""One pass over a whole shard's bytes: hashed, inflated when compressed
whole, and parsed into samples; and the summary of a shard built on it.

Indexing published shards (:mod:`shardkit.index.shard`), ``shardkit info
SHARD`` and a resumed :class:`~shardkit.ShardWriter` (which checks the shards
it keeps) read shards this way.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from shardkit.format.compression import MAGIC_BYTES, ChunkDecompressor, detect_compression
from shardkit.format.location import open_regular
from shardkit.format.tar import RawSample, SampleParser
from shardkit.format.tokens import TokenTally

#: Bytes read at a time from a local shard. Reads this small let the
#: kernel's read-ahead fetch the next ones while a chunk is hashed and
#: parsed: on an emulated HDD (bench/bench_index.py) 4 MiB reads indexed at
#: 77% of `cat`'s rate, 1 MiB at 90%, 256 KiB at 98-100%.
READ_BYTES = 256 << 10
#: Most decompressed bytes handed to the parser at once (compressed shards).
DECOMPRESS_PIECE_BYTES = 16 << 20


def local_chunks(path: str, facts: dict[str, int]) -> Iterator[bytes]:
    """A local shard's bytes in :data:`READ_BYTES` reads; puts its ``size``
    and ``version`` (``mtime_ns``, of the descriptor read) in ``facts``."""
    f, size = open_regular(path, what="shard", buffering=0)
    with f:
        info = os.fstat(f.fileno())
        facts["size"], facts["version"] = size, info.st_mtime_ns
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            chunk = f.read(READ_BYTES)
            if not chunk:
                return
            yield chunk


class ShardScan:
    """One pass over a shard's bytes: hashes them, inflates them when the
    first bytes say gzip or zstd, and parses the tar stream into samples."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.digest = hashlib.sha256()
        self.read = 0
        self.decompressor: ChunkDecompressor | None = None

    def samples(self, chunks: Iterable[bytes]) -> Iterator[RawSample]:
        parser = SampleParser(path=self.name)
        for chunk in chunks:
            if self.read == 0 and len(chunk) >= MAGIC_BYTES:
                kind = detect_compression(chunk[:MAGIC_BYTES])
                if kind is not None:
                    self.decompressor = ChunkDecompressor(kind, path=self.name, max_output_bytes=DECOMPRESS_PIECE_BYTES)
                    parser = SampleParser(path=self.name, offset_name="uncompressed byte")
            self.read += len(chunk)
            self.digest.update(chunk)
            if self.decompressor is None:
                yield from parser.feed(chunk)
            else:
                for piece in self.decompressor.pieces(chunk):
                    yield from parser.feed(piece)
        if self.decompressor is not None:
            self.decompressor.finish()
        yield from parser.finish()


@dataclass(frozen=True)
class ShardSummary:
    """One shard read through, for ``shardkit info SHARD``.

    Attributes:
        num_samples: Samples in the shard.
        num_bytes: Its size in bytes (as stored, compressed or not).
        sha256: Its SHA-256, hex.
        compression: ``"gzip"`` or ``"zstd"`` when compressed whole, else None.
        fields: Extension -> how many samples have it, most common first.
        first_key: The first sample's key (None when empty).
        last_key: The last sample's key.
        largest_sample: The most tar bytes one sample takes.
        token_fields: Its token fields (see :mod:`shardkit.format.tokens`).
        token_totals: Their token counts, in the same order.
    """

    num_samples: int
    num_bytes: int
    sha256: str
    compression: str | None
    fields: dict[str, int]
    first_key: str | None
    last_key: str | None
    largest_sample: int
    token_fields: tuple[str, ...] = ()
    token_totals: tuple[int, ...] = ()


def summarize(name: str, chunks: Iterable[bytes]) -> ShardSummary:
    """Summarize the shard whose bytes are ``chunks`` (``name`` for messages).

    Raises:
        CorruptShardError: It is not a tar shard, or is damaged (the message
            names the shard and the byte offset).
        OSError: It cannot be read.
    """
    scan = ShardScan(name)
    fields: Counter[str] = Counter()
    count, largest, first, last = 0, 0, None, None
    tokens = TokenTally()
    for sample in scan.samples(chunks):
        count += 1
        first = sample.key if first is None else first
        last = sample.key
        largest = max(largest, sample.end - sample.start)
        fields.update(sample.fields.keys())
        tokens.add(sample.fields.items())
    return ShardSummary(
        num_samples=count,
        num_bytes=scan.read,
        sha256=scan.digest.hexdigest(),
        compression=scan.decompressor.kind if scan.decompressor is not None else None,
        fields=dict(fields.most_common()),
        first_key=first,
        last_key=last,
        largest_sample=largest,
        token_fields=tokens.fields,
        token_totals=tuple(tokens.counts().sum(axis=0).tolist()),
    )
