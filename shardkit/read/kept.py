"""The samples of a shard a reader does not yield: removed ones (``shardkit
remove``) and, of a view or an extension, those outside its selection (see
:mod:`.derived`). A catalog's ``removed`` says which, by stored position.

:class:`KeptSamples` is the part of :class:`~.pieces.PieceReader` that reads
around them. A piece's positions count kept samples; it is read as the
stored range from its first kept sample to its last, and the others in
between are dropped after parsing. A local piece with samples left out
inside hands the parser only its kept samples, back to back (read through
gaps under :data:`GATHER_GAP_BYTES`, a new read past larger ones; see
:func:`~.ranges.gathered`), so a sparse view parses nothing else. A remote
one is cut where more than :data:`GAP_SAMPLES` samples in a row are left
out, a range each side.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardkit.format.compression import Compression
from shardkit.format.removed import stored_positions
from shardkit.io.base import ByteSource, close_iterator
from shardkit.io.urls import is_local
from shardkit.read.ranges import gathered, runs_of
from shardkit.read.split import Piece

#: Most samples in a row left out that a remote read of a shard's kept
#: samples reads through rather than cuts around.
GAP_SAMPLES = 8
#: Bytes between the kept samples of a local shard up to which a read goes
#: through them (and drops them) rather than skipping them with a new read.
#: Reading through is one sequential read the disk streams; a pread a run
#: of a 50% subset (runs of a sample or two) read 0.33-0.40x a compact
#: copy's samples/s cold against about 0.5x read through, and 0.64x
#: against 0.55-0.6x from the page cache (``make bench-revisions``).
GATHER_GAP_BYTES = 64 << 10

Located = tuple[int, int, Any]


class Job:
    """One piece being read; the reader thread fills in the byte range."""

    __slots__ = (
        "piece", "url", "bounds", "checksums", "byte_start", "byte_stop", "whole", "compression", "raw_bytes",
        "gather",
    )  # fmt: skip

    def __init__(self, piece: Piece, url: str):
        self.piece = piece
        self.url = url
        self.bounds: np.ndarray | None = None
        self.checksums: np.ndarray | None = None  # per-sample checksums to check, when asked for
        self.byte_start = 0
        self.byte_stop: int | None = None
        self.whole = True  # the range runs to the end of the shard
        self.compression: Compression | None = None  # set by the reader thread on a compressed shard
        self.raw_bytes = 0  # compressed bytes read, for a compressed shard
        self.gather: np.ndarray | None = None  # stored positions read back to back (a local sparse piece)


class KeptSamples:
    """Reading around the samples not yielded (mixed into :class:`~.pieces.PieceReader`)."""

    catalog: Any
    options: Any
    _removed: Any
    _load_index: Any  # PieceReader's
    _use_index: Any
    _gone: tuple[int, np.ndarray, frozenset[int], list[int]]

    def _removed_from(self, shard: int) -> np.ndarray:
        """Stored positions removed from ``shard``, rising; empty without removals."""
        return self._removed_held(shard)[1]

    def _removed_held(self, shard: int) -> tuple[int, np.ndarray, frozenset[int], list[int]]:
        """The last shard asked for: it, its removed positions as an array,
        a set and a list (one tuple, swapped whole: threads share it)."""
        held = self._gone
        if self._removed is not None and held[0] != shard:
            gone = self._removed.in_shard(shard)
            listed = gone.tolist()
            held = self._gone = (shard, gone, frozenset(listed), listed)
        return held

    def _stored_pieces(self, piece: Piece) -> list[Piece]:
        """``piece`` (kept positions) as the stored ranges holding its
        samples: one range; a remote one is cut where more than
        :data:`GAP_SAMPLES` samples in a row are not kept."""
        gone = self._removed_from(piece.shard)
        if not len(gone) or piece.stop <= piece.start:
            return [piece]
        if is_local(self.catalog.url(piece.shard)):  # read back to back instead (see _job)
            first = int(stored_positions(gone, piece.start))
            return [Piece(piece.shard, first, int(stored_positions(gone, piece.stop - 1)) + 1)]
        at = np.asarray(stored_positions(gone, np.arange(piece.start, piece.stop, dtype=np.int64)))
        cuts = np.flatnonzero(np.diff(at) > GAP_SAMPLES) + 1
        firsts = at[np.concatenate(([0], cuts))]
        lasts = at[np.concatenate((cuts - 1, [len(at) - 1]))]
        return [Piece(piece.shard, int(a), int(b) + 1) for a, b in zip(firsts.tolist(), lasts.tolist())]

    def _kept(self, samples: Iterator[Located]) -> Iterator[Located]:
        """``samples`` (at stored positions) less the removed ones, each at
        its kept position. A run (of a shard none were removed from) passes."""
        held = -1
        removed: frozenset[int] = frozenset()
        listed: list[int] = []
        try:
            for shard, position, raw in samples:
                if shard != held:  # a shard's samples come together: look its removals up once
                    _, _, removed, listed = self._removed_held(shard)
                    held = shard
                if not listed:
                    yield shard, position, raw
                elif position not in removed:
                    yield shard, position - bisect.bisect_left(listed, position), raw  # as kept_positions
        finally:
            close_iterator(samples)

    def _job(self, piece: Piece) -> Job:
        """The job of a piece: a local piece whose kept samples are not one
        run of the shard (a view's subset) reads them alone, back to back."""
        job = Job(piece, self.catalog.url(piece.shard))
        if self._removed is not None and is_local(job.url) and piece.stop > piece.start:
            gone = self._removed_from(piece.shard)
            if len(gone) and int(gone[0]) < piece.stop and int(gone[-1]) >= piece.start:
                kept_at = np.setdiff1d(np.arange(piece.start, piece.stop, dtype=np.int64), gone, assume_unique=True)
                if len(kept_at) < piece.stop - piece.start:
                    job.gather = kept_at
        return job

    def _gather(self, job: Job, source: ByteSource) -> Iterator[bytes]:
        """The bytes of ``job``'s gathered samples, end to end; its bounds
        become theirs (no end marker is checked: the range is not the shard's)."""
        assert job.gather is not None
        self._use_index(job, self._load_index(job.piece.shard))
        assert job.bounds is not None
        bounds, spans = gathered(job.bounds, job.gather, gap_bytes=GATHER_GAP_BYTES)
        if job.checksums is not None:
            job.checksums = job.checksums[job.gather]
        job.bounds, job.byte_start, job.byte_stop, job.whole = bounds, 0, int(bounds[-1]), False
        job.piece = Piece(job.piece.shard, 0, len(job.gather))
        # The runs' bytes are joined into chunks of about chunk_bytes: the
        # parser's pass costs per chunk, and a sparse subset's runs are a
        # sample or two each.
        chunk_bytes = self.options.chunk_bytes
        parts: list[bytes | memoryview] = []
        size = 0
        for lo, hi, runs in spans:
            for part in runs_of(source.iter_range(lo, hi, chunk_bytes=chunk_bytes), lo, runs):
                parts.append(part)
                size += len(part)
                if size >= chunk_bytes:
                    yield b"".join(parts)
                    parts, size = [], 0
        if parts:
            yield b"".join(parts)

