"""One tar shard being written: bytes, checksum and offset index together.

:class:`ShardFile` appends samples to ``NAME.tar.tmp`` while hashing them and
recording sample boundaries. :meth:`ShardFile.commit` writes the end-of-archive
marker, fsyncs, writes the ``.idx`` sidecar atomically and then renames the
tar into place; the tar's final name appearing is what marks the shard done.
The index also stores each sample's CRC-32 (see :mod:`shardkit.format.index`)
and, when the shard has token fields (1-D integer ``.npy`` values, see
:mod:`shardkit.format.tokens`), each sample's token counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.format.index import encode_index, index_path_for
from shardkit.format.manifest import ShardEntry
from shardkit.format.tokens import TokenTally
from shardkit.format.tar import (
    END_OF_ARCHIVE,
    append_joined_sample,
    append_sample,
    encode_joined_block,
    joined_members,
    split_joined,
)
from shardkit.io.atomic import TMP_SUFFIX, atomic_write_bytes, commit

#: Bytes gathered in memory before one write() to the file and one hash
#: update: small enough that both read them while they are still in the CPU's
#: L2 cache (with 4 MiB, writing the 2 GB of shards of 10^6 tiny samples took
#: 4.3 s of system time; with 256 KiB, 1.4 s).
WRITE_BUFFER_BYTES = 256 << 10

#: Samples encoded together by :meth:`ShardFile.add_joined_block`: 2,048 tiny
#: samples make ~4 MB of tar and a few MB of working arrays.
_BLOCK_SAMPLES = 2048
#: The block encoder indexes its input byte by byte (~30-60 ns a byte), one
#: sample at a time costs ~9 us: a group whose samples hold more than this
#: many bytes on average goes one by one (300 images of 28 KB: 0.48 s in a
#: block, 0.02 s one by one).
_BLOCK_MEAN_BYTES = 512


@dataclass(frozen=True)
class WrittenShard:
    """What a finished shard looks like on disk."""

    path: str
    index_path: str
    num_samples: int
    num_bytes: int
    sha256: str
    token_fields: tuple[str, ...] = ()
    token_totals: tuple[int, ...] = ()

    def entry(self) -> ShardEntry:
        """The manifest entry, with paths relative to the shard's folder."""
        return ShardEntry(
            path=os.path.basename(self.path),
            index=os.path.basename(self.index_path),
            num_samples=self.num_samples,
            num_bytes=self.num_bytes,
            sha256=self.sha256,
        )


class ShardFile:
    """Write samples into one shard file, crash-safely.

    Args:
        path: Final shard path (``.tar``). Bytes go to ``path + ".tmp"`` until
            :meth:`commit`.
        turn: A lock the caller holds while it adds samples, shared with a
            writer in another thread: the file lets go of it while it hashes
            and writes a buffer or encodes a block of samples (work that runs
            mostly without the GIL), so the other writer makes its samples
            meanwhile.

    Use as a context manager: leaving the block by an exception removes the
    temporary file and leaves no final file.
    """

    def __init__(self, path: str, *, turn: Any = None):
        self.path = path
        self._turn = turn
        self.index_path = index_path_for(path)
        self._tmp = path + TMP_SUFFIX
        self._file = open(self._tmp, "wb")
        self._hash = hashlib.sha256()
        self._pending = bytearray()  # bytes not yet written
        self._size = 0
        self._bounds = array("Q", [0])  # machine words, not Python ints: np.asarray takes them as they are
        self._checksums = array("I")
        self._tokens = TokenTally()

    @property
    def num_samples(self) -> int:
        return len(self._bounds) - 1

    @property
    def num_bytes(self) -> int:
        """Bytes written so far, not counting the end-of-archive marker."""
        return self._size

    def add(self, key: str, fields: Sequence[tuple[str, bytes]]) -> None:
        """Append one sample; ``fields`` are ``(extension, data)`` in member order."""
        start = len(self._pending)
        self._tokens.add(fields)
        self._added(start, append_sample(self._pending, key, fields))

    def add_joined(self, key: str, heads: Sequence[bytes], data: bytes) -> None:
        """:meth:`add` for members given joined (see
        :func:`~shardkit.format.tar.append_joined_sample`)."""
        start = len(self._pending)
        if any(ext.endswith((b"npy", b"NPY")) for ext in heads[::2]):
            self._tokens.add(_member_pairs(heads, data))
        else:
            self._tokens.skip()
        self._added(start, append_joined_sample(self._pending, key, heads, data))

    def add_joined_block(self, keys: Sequence[bytes], joined: Sequence[bytes]) -> None:
        """:meth:`add_joined` for many samples, given by their keys (UTF-8)
        and members joined (:func:`~shardkit.format.tar.join_members`),
        encoded together (:func:`~shardkit.format.tar.encode_joined_block`)
        a group at a time; a group it does not take goes one by one."""
        for lo in range(0, len(keys), _BLOCK_SAMPLES):
            hi = lo + _BLOCK_SAMPLES
            encoded = None
            if sum(map(len, joined[lo:hi])) <= _BLOCK_MEAN_BYTES * len(joined[lo:hi]):
                with self._letting_go():  # large numpy steps, many of them without the GIL
                    encoded = encode_joined_block(keys[lo:hi], joined[lo:hi])
            if encoded is None:
                for key, members in zip(keys[lo:hi], joined[lo:hi]):
                    self.add_joined(key.decode("utf-8", "surrogateescape"), *split_joined(members))
                continue
            out, ends, checksums = encoded
            self._count_tokens(joined[lo:hi])
            self._bounds.extend((ends + self._size).tolist())
            self._checksums.extend(checksums)
            self._size += len(out)
            self._drain()
            view = memoryview(out)
            with self._letting_go():
                for at in range(0, len(out), WRITE_BUFFER_BYTES):
                    self._write(view[at : at + WRITE_BUFFER_BYTES])

    def _count_tokens(self, joined: Sequence[bytes]) -> None:
        """Count the token fields of samples given joined; a group in which
        no ``npy`` extension can be is counted in one look."""
        blob = b"".join(joined)
        if b"npy\0" not in blob and b"NPY\0" not in blob:
            self._tokens.skip(len(joined))
            return
        for members in joined:
            if b"npy\0" in members or b"NPY\0" in members:
                self._tokens.add(joined_members(members))
            else:
                self._tokens.skip()

    def _added(self, start: int, crc: int) -> None:
        """Account for the sample appended to the buffer from ``start`` on."""
        self._size += len(self._pending) - start
        self._bounds.append(self._size)
        self._checksums.append(crc)
        if len(self._pending) >= WRITE_BUFFER_BYTES:
            self._drain()

    def _drain(self) -> None:
        if self._pending:
            with self._letting_go():
                self._write(self._pending)  # one write and one hash update, not one per member
            self._pending.clear()

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._hash.update(data)
        self._file.write(data)

    @contextlib.contextmanager
    def _letting_go(self) -> Iterator[None]:
        """Let go of the turn (if any) for the block's duration."""
        if self._turn is None:
            yield
            return
        self._turn.release()
        try:
            yield
        finally:
            self._turn.acquire()

    def commit(self) -> WrittenShard:
        """Finish the tar, fsync, write the index, and rename into place
        (called without the turn)."""
        self._pending += END_OF_ARCHIVE
        self._size += len(END_OF_ARCHIVE)
        self._write(self._pending)
        self._pending.clear()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        # The index first; the directory sync after the tar's rename covers both.
        assert self._tokens.num_samples == self.num_samples
        tokens = self._tokens.counts()
        atomic_write_bytes(self.index_path, encode_index(self._bounds, self._checksums, tokens), sync_dir=False)
        commit(self._tmp, self.path)
        return WrittenShard(
            path=self.path,
            index_path=self.index_path,
            num_samples=self.num_samples,
            num_bytes=self._size,
            sha256=self._hash.hexdigest(),
            token_fields=self._tokens.fields,
            token_totals=tuple(tokens.sum(axis=0).tolist()),
        )

    def abort(self) -> None:
        """Drop the temporary file; nothing appears under the final name."""
        if not self._file.closed:
            self._file.close()
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def _member_pairs(heads: Sequence[bytes], data: bytes) -> list[tuple[str, memoryview]]:
    """``(extension, bytes)`` of members given joined (see :meth:`ShardFile.add_joined`)."""
    pairs, pos, view = [], 0, memoryview(data)
    for i in range(0, len(heads), 2):
        size = int(heads[i + 1])
        pairs.append((heads[i].decode("utf-8", "surrogateescape"), view[pos : pos + size]))
        pos += size
    return pairs
