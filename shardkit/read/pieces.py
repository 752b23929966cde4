"""Read pieces of shards into complete raw samples, with a fault policy.

:class:`PieceReader` turns the pieces a slot owns (see :mod:`.split`) into
:class:`~shardkit.format.tar.RawSample` s. With an offset index a piece is one
byte range ``[bounds[start], bounds[stop])``: the read starts at the piece's
first sample and reads no byte of skipped samples. Without an index the whole
shard is streamed. Bytes arrive through one :class:`~.prefetch.ReadAhead`
thread in large chunks and are parsed by :class:`SampleParser`. On a disk
whose readers take turns, the shard's source comes wrapped by
:func:`~shardkit.io.device.take_turns`, with the read-ahead queue as the room
each turn asks for; the reader itself only sees chunks.

What is checked, so that nothing corrupt is yielded silently:

* tar structure (the parser): header checksums, range-checked sizes,
  truncation, names without a key;
* the index, once per load (:func:`~shardkit.format.index.check_bounds`):
  rising block-aligned boundaries inside the shard, the manifest's count;
* the content against the index: each sample fills its span exactly, the
  range holds exactly the samples the index lists, and a shard's last
  sample is followed by the end marker.

With an offset index (whenever the catalog has one, whole shards included)
the parser knows each sample's span, so a fault anywhere inside a sample (a
header, its data, a zero block, a member running past the span) condemns
that whole sample before any of it is yielded; with ``verify_checksums`` and an
index that stores them, so does a changed byte in a member's data.

Under ``on_error="raise"`` the first fault raises. Under ``"skip"`` it is
logged and counted; with an index the reader resumes at the next sample
boundary after the bad sample (re-reading the good samples before it), without
one it drops the rest of the shard. A truncated range loses its remainder.
Recovery is a loop over the ranges left to read, each fault taking at least
one sample (or the end-marker check) out of them, so any number of faults in
a shard ends. A partial sample is never yielded.

Compressed shards (gzip, zstandard; recognised by their first bytes, see
:mod:`shardkit.format.compression`) are read whole, from byte 0: the
read-ahead thread decompresses them as it reads (in slices of
:data:`DECOMPRESS_SLICE_BYTES`, so one queued chunk stays bounded) and the
parser sees the plain tar. Their catalog deals them whole (see
:mod:`.catalog`). A fault inside one ends the shard (nothing can be entered
after it); decompression faults name the compressed offset, tar faults the
uncompressed one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import deque
from concurrent.futures import Future
from itertools import chain
from collections.abc import Callable, Iterator
from typing import Literal

import numpy as np

from shardkit.errors import CorruptShardError, ManifestError, TruncatedShardError
from shardkit.format.compression import MAGIC_BYTES, ChunkDecompressor, detect_compression
from shardkit.format.index import OffsetIndex
from shardkit.format.plain import SampleRun
from shardkit.format.removed import stored_positions
from shardkit.format.tar import END_OF_ARCHIVE, RawSample, SampleParser
from shardkit.io.base import ByteSource, SourceOptions, close_iterator
from shardkit.io.device import reserved_room_bytes, take_turns
from shardkit.io.index import fetch_offset_index
from shardkit.io.registry import open_source
from shardkit.io.retry import current_stop, stopping_on
from shardkit.io.urls import is_local, local_path, redact_url
from shardkit.read.catalog import ShardCatalog
from shardkit.read.kept import Job, KeptSamples
from shardkit.read.prefetch import ReadAhead
from shardkit.read.ranges import AlignedSource, remote_range, salvage_ranges
from shardkit.read.split import Piece

log = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]
ON_ERROR: tuple[str, ...] = ("raise", "skip")

#: A sample with where it came from: ``(shard number, sample number within
#: the shard, sample)``. Positions travel with samples so that a reader state
#: (what a slot consumed, what its shuffle buffer holds) can be named by
#: position and restored through the offset index. A reader of one field
#: (``run_field``) also gets runs of samples: ``(shard, first sample's
#: number, SampleRun)``.
Located = tuple[int, int, RawSample]

#: Faults the skip policy may skip; anything else is a bug and propagates.
FAULTS = (CorruptShardError, ManifestError, OSError)

#: Read-ahead budget of a remote reader before its consumer has taken
#: anything, per request it may have in flight (``max_concurrent_requests``,
#: shared by the rank's workers); it then grows with what is taken (see
#: :class:`ReadAhead`'s ``start_bytes``). With one request (a worker of 8
#: sharing the default 8), about 9 samples of 110 KB: what an in-order
#: DataLoader takes from each worker for a first batch of 64 at 8 workers.
#: Twice that (the earlier value) had each worker fetch bytes nobody asked
#: for yet while its siblings still waited for their first samples: the
#: first 64 samples over the emulated store of ``bench/bench_remote.py`` at
#: 8 workers came after 0.19-0.20 s against 0.13-0.17 s now (webdataset
#: 0.14-0.16 s), and faster or the same at 1, 2 and 4 workers.
REMOTE_START_READ_AHEAD_BYTES = 1 << 20

#: Most read-ahead of a remote reader per request it may have in flight,
#: below its ``read_ahead_bytes`` where that is larger: under a second of
#: what one connection to an object store delivers (0.4 s at 20 MiB/s). A
#: DataLoader that delivers in order (torch's default) hands out its
#: workers' samples in turn, so the rank gets its samples no faster than
#: its slowest worker receives them. A worker whose connection got ahead of
#: its siblings' only holds bytes nobody asks for yet, and while it has room
#: for more, its connection keeps taking a share of the link from the
#: workers behind. With little room it stops, and the link goes to those
#: that lag: the workers finish an epoch together instead of the last one
#: alone on one connection. (Out of order, as ``make_loader`` delivers by
#: default, nothing holds a worker back and this changes little.)
REMOTE_READ_AHEAD_BYTES_PER_REQUEST = 8 << 20

#: Most decompressed bytes in one chunk of a compressed shard, however well
#: it compresses, so that the read-ahead queue's byte budget bounds memory.
DECOMPRESS_SLICE_BYTES = 1 << 20


class PieceReader(KeptSamples):
    """Reads pieces of a catalog's shards as raw samples.

    Args:
        catalog: The shards.
        on_error: ``"raise"`` or ``"skip"`` (see the module docstring).
        on_skip: Called with each skipped fault (e.g. to count it).
        options: Storage options (``chunk_bytes`` is the read size).
        read_ahead_bytes: Byte budget of the read-ahead thread.
        verify_checksums: Check each sample against the checksum its offset index
            stores (indexes written before checksums existed are read
            unchecked).
        run_field: Give consecutive plain samples of one member of this
            field each as one :class:`~shardkit.format.plain.SampleRun`
            (see :class:`~shardkit.format.tar.SampleParser`), for a reader
            of that field alone.
    """

    def __init__(
        self,
        catalog: ShardCatalog,
        *,
        on_error: OnError,
        on_skip: Callable[[Exception], None],
        options: SourceOptions,
        read_ahead_bytes: int,
        verify_checksums: bool = False,
        run_field: str | None = None,
    ):
        self.catalog = catalog
        self.run_field = run_field
        self.on_error = on_error
        self.on_skip = on_skip
        self.options = options
        self.read_ahead_bytes = read_ahead_bytes
        self.verify_checksums = verify_checksums
        #: Samples removed from the shards, or None (see :meth:`read`).
        self._removed = catalog.removed
        self._gone: tuple[int, np.ndarray, frozenset[int], list[int]] = (-1, np.zeros(0, dtype=np.int64), frozenset(), [])

    # ------------------------------------------------------- reader thread

    def _load_index(self, shard: int) -> OffsetIndex:
        """A shard's offset index, checked against the manifest before use."""
        entry = self.catalog.entry(shard)
        return fetch_offset_index(
            self.catalog.index_url(shard),
            num_samples=None if self.catalog.counts is None else self.catalog.stored_count(shard),
            shard_bytes=None if entry is None else entry.num_bytes,
            options=self.options,
        )

    def _open_shard(self, shard: int, url: str, *, salvage: bool = False) -> ByteSource:
        """Open a shard, telling the source its manifest size and checksum:
        a file or object of another size is refused at open, and a shard
        cache verifies what it stores against them. ``salvage`` (reading
        back the good samples after a skipped fault) opens without the size
        check, which would refuse the shard again: the samples read then are
        checked one by one against the offset index instead."""
        entry = self.catalog.entry(shard)
        if entry is None or salvage:
            return open_source(url, options=self.options)
        return open_source(url, options=self.options, expected_size=entry.num_bytes, expected_sha256=entry.sha256)

    def _load_index_soon(self, shard: int) -> Future[OffsetIndex]:
        """:meth:`_load_index` in a thread of its own, which stops retrying
        when this thread's reads are told to stop."""
        future: Future[OffsetIndex] = Future()
        stop = current_stop()

        def run() -> None:
            with contextlib.nullcontext() if stop is None else stopping_on(stop):
                try:
                    future.set_result(self._load_index(shard))
                except BaseException as exc:  # handed to whoever waits for the index
                    future.set_exception(exc)

        threading.Thread(target=run, name="shardkit-index", daemon=True).start()
        return future

    def _locate(self, job: Job, index: OffsetIndex | None = None) -> None:
        """Fill in the byte range ``job`` reads: its samples' bytes through
        the offset index (``index``, if already loaded), or a whole shard up
        to the manifest's size."""
        if self.catalog.has_indexes:
            index = index if index is not None else self._load_index(job.piece.shard)
            self._use_index(job, index)
            job.whole = job.piece.stop == len(index.bounds) - 1
            job.byte_start = int(index.bounds[job.piece.start])
            # A range that ends the shard also takes the end marker, which
            # proves nothing follows the last indexed sample.
            job.byte_stop = int(index.bounds[job.piece.stop]) + (len(END_OF_ARCHIVE) if job.whole else 0)
        elif self.catalog.manifest is not None:
            # Up to the manifest's size: a truncated shard is caught, and extra
            # samples in a rewritten one are never read.
            job.byte_stop = self.catalog.entry(job.piece.shard).num_bytes

    def _use_index(self, job: Job, index: OffsetIndex) -> None:
        job.bounds = index.bounds
        job.checksums = index.checksums if self.verify_checksums else None

    def _parser(self, job: Job) -> SampleParser:
        """The parser of one job's bytes: with its samples' spans (and
        checksums) when the index gives them."""
        if job.bounds is None or job.compression is not None:
            offset_name = "uncompressed byte" if job.compression else "byte"
            stream_end = job.byte_stop if job.compression is None else None
            return SampleParser(
                path=job.url, base_offset=job.byte_start, offset_name=offset_name, stream_end=stream_end
            )
        lo, hi = job.piece.start, job.piece.stop
        return SampleParser(
            path=job.url,
            base_offset=job.byte_start,
            bounds=job.bounds[lo : hi + 1],
            checksums=None if job.checksums is None else job.checksums[lo:hi],
            # A run's samples are counted, not looked at one by one: none where some were removed.
            run_field=self.run_field if not len(self._removed_from(job.piece.shard)) else None,
        )

    def _fetch(self, job: Job, ahead: ReadAhead[Job]) -> Iterator[bytes]:
        source = self._open_shard(job.piece.shard, job.url)
        chunk_bytes = self.options.chunk_bytes
        if is_local(job.url) and job.gather is not None:
            chunks = self._gather(job, take_turns(source, local_path(job.url), options=self.options, room=ahead))
        elif is_local(job.url):
            self._locate(job)
            if job.bounds is not None:
                source = AlignedSource(source, job.bounds[job.piece.start + 1 : job.piece.stop + 1])
            # On a disk that takes turns, each turn first waits until the
            # read-ahead queue has room for all of it.
            source = take_turns(source, local_path(job.url), options=self.options, room=ahead)
            chunks = source.iter_range(job.byte_start, job.byte_stop, chunk_bytes=chunk_bytes)
        else:
            # A cached source fills its entry from one read from byte 0 (see
            # shardkit.io.cache), and a hit reads local disk: read whole.
            room = ahead if self.options.cache_dir is None else None
            if self._reads_whole_indexed(job):
                # A whole remote shard: its index and its bytes are asked for
                # at once, so the first sample waits for one round trip, not two.
                index = self._load_index_soon(job.piece.shard)
                shard_bytes = self.catalog.entry(job.piece.shard).num_bytes
                chunks = self._cut_to_index(job, index, remote_range(source, 0, shard_bytes, room, chunk_bytes))
            else:
                self._locate(job)
                chunks = remote_range(source, job.byte_start, job.byte_stop, room, chunk_bytes)
        return self._decompressed(job, chunks) if job.byte_start == 0 else chunks

    def _reads_whole_indexed(self, job: Job) -> bool:
        """Whether ``job`` is a whole shard with an index, whose byte range
        (from 0 to at most the manifest's size) is known before its index."""
        counts = self.catalog.counts
        return (
            self.catalog.has_indexes
            and self.catalog.entry(job.piece.shard) is not None
            and counts is not None
            and job.piece.start == 0
            and job.piece.stop == self.catalog.stored_count(job.piece.shard)
        )

    def _cut_to_index(self, job: Job, index: Future[OffsetIndex], chunks: Iterator[bytes]) -> Iterator[bytes]:
        """The chunks of a whole shard read from byte 0, passed on once its
        index (loading meanwhile) has located ``job``, and cut where the
        index says the shard's samples and end marker end (a tar may be
        padded past them)."""
        try:
            first = next(chunks, b"")
            self._locate(job, index.result())
            assert job.byte_stop is not None and job.byte_start == 0
            left = job.byte_stop
            for chunk in chain((first,), chunks):
                if left > 0:
                    yield chunk if len(chunk) <= left else chunk[:left]
                # Past the cut (padding after the end marker) the bytes are
                # still read, not dropped: a cache fills from this read.
                left -= len(chunk)
        finally:
            close_iterator(chunks)

    def _decompressed(self, job: Job, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """The chunks of a read from byte 0, decompressed if the shard is
        compressed (runs in the read-ahead thread, whose reads and
        decompression release the GIL)."""
        head: list[bytes] = []
        size = 0
        for chunk in chunks:
            head.append(chunk)
            size += len(chunk)
            if size >= MAGIC_BYTES:
                break
        kind = detect_compression(b"".join(head)[:MAGIC_BYTES])
        if kind is None:
            yield from head
            yield from chunks
            return
        if job.bounds is not None:
            raise CorruptShardError(
                f"{job.url}: the shard is {kind}-compressed, but its offset index describes a plain tar. "
                "Compressed shards are read whole and have no offset index: reshard them uncompressed with "
                "`shardkit write`, or read them without the index.",
                path=job.url,
                offset=0,
            )
        job.compression = kind
        # Each piece holds at most DECOMPRESS_SLICE_BYTES of output, however
        # well the data compresses, and is taken by the read-ahead queue (which
        # counts it at that size) before the next is inflated: memory stays
        # within the read-ahead budget, not the shard's uncompressed size.
        stream = ChunkDecompressor(kind, path=job.url, max_output_bytes=DECOMPRESS_SLICE_BYTES)
        for chunk in chain(head, chunks):
            job.raw_bytes += len(chunk)
            yield from stream.pieces(chunk)
        stream.finish()

    def _read_ahead_budget(self) -> tuple[int, int | None]:
        """The read-ahead budget, and what it starts from (None: the whole
        budget at once; see :class:`~.prefetch.ReadAhead`).

        Remote shards start from :data:`REMOTE_START_READ_AHEAD_BYTES` per
        request the reader may have in flight: a reader starts before its
        consumer asks (see :meth:`read`), and a whole budget fetched by each
        of a rank's DataLoader workers while the others still start only
        takes the link and the CPU from them. Their budget is then at most
        :data:`REMOTE_READ_AHEAD_BYTES_PER_REQUEST` per request.

        A local source's budget is raised by the room it asks for at once
        before a read it must not interrupt (a turn on a disk that takes
        turns, see :func:`~shardkit.io.device.reserved_room_bytes`): the
        usual budget on top lets the next turn start while the parser still
        works on the end of the last, instead of the device idling until it
        is done."""
        first = self.catalog.url(0) if self.catalog.num_shards else None
        if first is None:
            return self.read_ahead_bytes, None
        if not is_local(first):
            requests = max(self.options.max_concurrent_requests, 1)
            budget = min(self.read_ahead_bytes, REMOTE_READ_AHEAD_BYTES_PER_REQUEST * requests)
            return budget, min(REMOTE_START_READ_AHEAD_BYTES * requests, budget)
        return self.read_ahead_bytes + reserved_room_bytes(local_path(first), options=self.options), None

    def load_bounds(self, shard: int) -> np.ndarray:
        """A shard's offset index: sample ``i`` is bytes ``[b[i], b[i + 1])``.
        Where samples were removed from the shard, ``i`` counts the kept
        ones, and the bounds are their sizes laid end to end (what
        :meth:`read_runs` is given back; it reads by the index itself).

        Raises:
            CorruptShardError: The index disagrees with the manifest's count.
        """
        bounds = self._load_index(shard).bounds
        gone = self._removed_from(shard)
        if not len(gone):
            return bounds
        sizes = np.delete(np.diff(bounds.astype(np.int64)), gone)
        return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    def read_runs(self, shard: int, runs: list[tuple[int, int]], *, bounds: np.ndarray) -> Iterator[Located]:
        """Samples ``[lo, hi)`` of each run of one shard, each run one direct
        byte-range read through the offset index (no read-ahead thread).

        For reading back a few scattered samples, e.g. the contents of a
        restored shuffle buffer. The fault policy applies as in :meth:`read`.
        ``bounds`` are :meth:`load_bounds`' (where samples were removed from
        the shard, the runs are read by its index instead).
        """
        gone = self._removed_from(shard)
        if len(gone):
            stored: list[tuple[int, int]] = []
            for lo, hi in runs:
                at = np.asarray(stored_positions(gone, np.arange(lo, hi, dtype=np.int64)))
                cuts = np.flatnonzero(np.diff(at) != 1) + 1
                stored += [(int(part[0]), int(part[-1]) + 1) for part in np.split(at, cuts) if len(part)]
            runs, bounds = stored, self._load_index(shard).bounds
            return self._kept(self._read_runs(shard, runs, bounds=bounds))
        return self._read_runs(shard, runs, bounds=bounds)

    def _read_runs(self, shard: int, runs: list[tuple[int, int]], *, bounds: np.ndarray) -> Iterator[Located]:
        job = Job(Piece(shard, 0, len(bounds) - 1), self.catalog.url(shard))
        if self.verify_checksums and self.catalog.has_indexes:
            self._use_index(job, self._load_index(shard))
        job.bounds = bounds
        yield from self._read_ranges(job, [(lo, hi, hi == len(bounds) - 1) for lo, hi in runs], salvage=False)

    # ------------------------------------------------------------ consumer

    def _fault(self, exc: Exception) -> None:
        if self.on_error == "raise":
            raise exc
        log.warning("skipping bad data (on_error='skip'): %s", exc)
        self.on_skip(exc)

    def read(self, pieces: Iterator[Piece]) -> Iterator[Located]:
        """The samples of ``pieces`` in order, each as ``(shard, index, sample)``.

        Reading starts at once, in the background, not at the first
        ``next()``: a DataLoader worker calls ``iter(dataset)`` as soon as it
        exists, so its reads overlap the start of the other workers.
        Dropping the iterator, even unstarted, stops the reads.

        Where samples were removed from a shard (``shardkit remove``), a
        piece's positions count its kept samples: the piece is read from
        its first kept sample's stored position to its last one's, and the
        removed samples in between are parsed and dropped.
        """
        if self._removed is not None:
            pieces = (part for piece in pieces for part in self._stored_pieces(piece))
        jobs = (self._job(piece) for piece in pieces)
        budget, start = self._read_ahead_budget()
        ahead: ReadAhead[Job] = ReadAhead(
            jobs, lambda job: self._fetch(job, ahead), budget_bytes=budget, start_bytes=start
        )
        samples = self._parse(ahead)
        weakref.finalize(samples, ahead.close).atexit = False
        ahead.start()
        return samples if self._removed is None else self._kept(samples)

    def _parse(self, ahead: ReadAhead[Job]) -> Iterator[Located]:
        with ahead as chunks:
            current: Job | None = None
            parser: SampleParser | None = None
            received = got = 0
            broken = False
            for job, item in chunks:
                if job is None:
                    raise item  # type: ignore[misc]  # the plan failed (e.g. a UsageError): not a data fault
                if job is not current:
                    current, broken, received, got = job, False, 0, 0
                    parser = self._parser(job)
                if broken:
                    continue
                assert parser is not None
                shard, first = job.piece.shard, job.piece.start
                try:
                    if isinstance(item, bytes):
                        received += len(item)
                        for raw in parser.feed(item):
                            yield shard, first + got if job.gather is None else int(job.gather[got]), raw  # type: ignore[misc]
                            got += _samples_in(raw)
                    elif item is None:
                        for raw in self._finish(job, parser, received, got):
                            yield shard, first + got if job.gather is None else int(job.gather[got]), raw
                            got += 1
                    else:
                        raise item  # type: ignore[misc]
                except FAULTS as exc:
                    broken = True
                    self._fault(exc)
                    yield from self._recover(job, exc, first + got)

    def _finish(self, job: Job, parser: SampleParser, received: int, got: int) -> list[RawSample]:
        """The job's last sample, once its bytes are known to be all there
        (the parser itself checks the samples against their index spans)."""
        del got
        if job.compression is not None:
            received = job.raw_bytes  # byte_stop counts the shard's stored (compressed) bytes
        if job.byte_stop is not None and received < job.byte_stop - job.byte_start:
            end = job.byte_start + received
            raise TruncatedShardError(
                f"{job.url}: truncated: data ends at byte {end} but the "
                f"{'offset index says samples run' if job.bounds is not None else 'manifest says the shard runs'} "
                f"to byte {job.byte_stop}. Run `shardkit verify` on the dataset or rewrite this shard.",
                path=job.url,
                offset=end,
            )
        if job.whole and job.byte_stop is not None and not parser.ended:
            where = int(job.bounds[-1]) if job.bounds is not None else job.byte_stop
            raise TruncatedShardError(
                f"{job.url}: no end-of-archive marker at byte {where}, where the "
                f"{'offset index' if job.bounds is not None else 'manifest'} says the shard ends: the shard was "
                "damaged or rewritten after its index and manifest were written. Run `shardkit verify` on the "
                "dataset or rewrite this shard.",
                path=job.url,
                offset=where,
            )
        return parser.finish(expect_end_marker=job.whole)

    def _recover(self, job: Job, exc: Exception, next_sample: int) -> Iterator[Located]:
        """After a skipped fault: yield what can be saved of the rest of the piece.

        Samples before the fault are re-read (the parser may have held some
        back); after a fault inside the data, reading resumes at the next
        sample boundary; after truncation there is nothing more to read.
        """
        if job.compression is not None or job.gather is not None:
            return  # a compressed shard cannot be entered after the fault; a gathered one is dropped whole
        if job.bounds is None and self.catalog.has_indexes:
            try:  # the index failed to load with the read: try once more
                self._use_index(job, self._load_index(job.piece.shard))
            except FAULTS as index_exc:
                log.warning("cannot recover the rest of %s: %s", redact_url(job.url), index_exc)
        if job.bounds is None:
            return  # no index to resynchronize with
        ranges = salvage_ranges(job.bounds, exc, next_sample, job.piece.stop, job.whole)
        yield from self._read_ranges(job, ranges, salvage=True)

    def _read_ranges(
        self, job: Job, ranges: list[tuple[int, int, bool]], *, salvage: bool
    ) -> Iterator[Located]:
        """Samples of ``(lo, hi, whole)`` ranges of the job's shard, each one
        direct read; a fault in one is handled by the policy, and what can
        be saved of that range joins the ranges still to read (a loop, not
        recursion: every fault takes at least one sample, or the end-marker
        check, out of what is left, so any number of faults ends).
        ``salvage``: the ranges follow a skipped fault (see :meth:`_open_shard`)."""
        pending = deque((lo, hi, whole, salvage) for lo, hi, whole in ranges)
        while pending:
            lo, hi, whole, after_fault = pending.popleft()
            got = 0
            try:
                for raw in self._read_range(job, lo, hi, whole=whole, salvage=after_fault):
                    yield job.piece.shard, lo + got, raw  # type: ignore[misc]
                    got += _samples_in(raw)
            except FAULTS as exc:
                self._fault(exc)
                rest = salvage_ranges(job.bounds, exc, lo + got, hi, whole)
                pending.extendleft(reversed([(a, b, w, True) for a, b, w in rest]))

    def _read_range(
        self, job: Job, lo: int, hi: int, *, whole: bool, salvage: bool
    ) -> Iterator[RawSample | SampleRun]:
        """Samples ``[lo, hi)`` of the job's shard, read without read-ahead;
        ``whole``: the range ends the shard and takes its end marker."""
        assert job.bounds is not None
        sub = Job(Piece(job.piece.shard, lo, hi), job.url)
        sub.bounds, sub.checksums, sub.whole = job.bounds, job.checksums, whole
        sub.byte_start = int(job.bounds[lo])
        sub.byte_stop = int(job.bounds[hi]) + (len(END_OF_ARCHIVE) if whole else 0)
        parser = self._parser(sub)
        received = got = 0
        source = self._open_shard(sub.piece.shard, sub.url, salvage=salvage)
        for chunk in source.iter_range(sub.byte_start, sub.byte_stop, chunk_bytes=self.options.chunk_bytes):
            received += len(chunk)
            for raw in parser.feed(chunk):
                yield raw
                got += _samples_in(raw)
        yield from self._finish(sub, parser, received, got)


def _samples_in(item: RawSample | SampleRun) -> int:
    """How many samples a parser's item is."""
    return len(item) if isinstance(item, SampleRun) else 1
