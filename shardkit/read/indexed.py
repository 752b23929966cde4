"""Map-style random access: sample *i* of a dataset with one ranged read.

:class:`IndexedDataset` turns a global sample number into ``(shard, sample
in shard)`` with a binary search over cumulative per-shard counts, looks the
sample's byte range up in the shard's offset index (see
:mod:`shardkit.format.index`) and reads exactly those bytes:

* a local shard: one ``pread`` on a file descriptor kept open (marked
  ``POSIX_FADV_RANDOM``, so the kernel does not read ahead bytes nobody asked
  for; random reads do not take turns on a spinning disk as streams do);
* a remote shard: one HTTP ``Range`` request or S3 ranged GET for a sample of
  up to ``part_bytes`` (larger samples are fetched in concurrent parts);
* a remote shard with ``cache_dir`` set: the first read of a shard is a
  ranged request as above, and starts fetching the whole shard into the
  cache in a background thread (as the streaming reader caches whole
  shards); once it is there, reads are ``pread`` s of the cached file.

The bytes are parsed with :class:`~shardkit.format.tar.SampleParser`, which
checks tar structure, and must hold exactly one sample. The samples of a
DataLoader batch (``__getitems__``) are read by a few threads at once, so a
remote batch costs about one request's latency.

What is kept per process, all bounded: the per-shard offset indexes
(memory-mapped for local files, fetched once for remote ones) and open files
or connections, each in a least-recently-used table of ``max_open_shards``
entries. Opening a dataset reads only the manifest; for a manifest already
in memory it costs two integer arrays of ``num_shards + 1`` entries.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from torch.utils.data import Dataset, default_collate

from shardkit.errors import CorruptShardError, ManifestError, MemberTooLargeError, TruncatedShardError, UsageError
from shardkit.format.compression import MAGIC_BYTES, compression_from_name, detect_compression, file_compression
from shardkit.format.index import OffsetIndex, check_bounds, decode_offset_index, load_offset_index
from shardkit.format.location import open_regular
from shardkit.format.manifest import Manifest
from shardkit.format.tar import SampleParser
from shardkit.io.base import ByteSource, SourceOptions
from shardkit.io.cache import CachedSource
from shardkit.io.local import size_mismatch
from shardkit.io.ranged import RangedObject, stream_range
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, local_path, redact_url
from shardkit.read.catalog import resolve_catalog
from shardkit.read.counters import SharedCounters
from shardkit.read.decode import Decoder, ImageMode, make_decoder
from shardkit.read.pieces import FAULTS, ON_ERROR, OnError

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_OPEN_SHARDS", "IndexedDataset", "compression_of"]

Sample = dict[str, Any]

#: Shards whose index and file (or connection) stay open per process.
DEFAULT_MAX_OPEN_SHARDS = 64

def compression_of(url: str, head: bytes | None = None) -> str | None:
    """The whole-shard compression of a shard, or None for a plain tar.

    Decided by the first bytes when given (gzip ``1f 8b``, zstandard
    ``28 b5 2f fd``), else by the name (``.tar.gz``, ``.tgz``, ``.tar.zst``);
    see :mod:`shardkit.format.compression`.
    """
    if head is not None:
        return detect_compression(head)
    return compression_from_name(url)


def _refuse_compressed(url: str, kind: str) -> UsageError:
    return UsageError(
        f"{redact_url(url)}: a {kind}-compressed shard cannot be read at random (a sample cannot be reached "
        "without decompressing everything before it). Reshard it uncompressed with "
        "`shardkit write SOURCE DEST` and open DEST, or stream it with ShardDataset."
    )


class _LocalShard:
    """A local shard file held open: each read is one ``pread``."""

    def __init__(self, url: str, *, expected_size: int | None = None):
        self.url = url
        self.fd = -1
        f, size = open_regular(local_path(url), what="shard")
        if expected_size is not None and size != expected_size:
            with f:
                kind = detect_compression(f.read(MAGIC_BYTES))
            if kind is not None:  # the more useful advice for a shard compressed after indexing
                raise _refuse_compressed(url, kind)
            raise size_mismatch(local_path(url), size, expected_size)
        self._file = f  # owns the descriptor
        self.fd = f.fileno()
        if hasattr(os, "posix_fadvise"):
            # Reads are small and scattered: the kernel's read-ahead would fetch bytes nobody asked for.
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def read(self, start: int, end: int, *, chunk_bytes: int) -> bytes:
        del chunk_bytes
        return os.pread(self.fd, end - start, start)

    def head(self, size: int) -> bytes:
        return os.pread(self.fd, size, 0)

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self._file.close()
            self.fd = -1


def _ranged(source: ByteSource, start: int, end: int, *, options: SourceOptions, chunk_bytes: int) -> bytes:
    """Bytes ``[start, end)`` of a remote object; one request when the range
    is at most ``part_bytes`` (a ranged object cuts a range over 1 MiB into
    concurrent parts, which pays for large samples only)."""
    if isinstance(source, RangedObject) and end - start <= options.part_bytes:
        return b"".join(stream_range(source.fetcher, start, end, options=options, chunk_bytes=chunk_bytes))
    return b"".join(source.iter_range(start, end, chunk_bytes=chunk_bytes))


class _CacheFills:
    """Whole-shard downloads into the shard cache, in background threads.

    A sample of a shard that is not cached yet is read with a ranged request
    at once, while the whole shard is fetched into the cache beside it (at
    most ``limit`` at a time per process); later samples of the shard are
    read from the cache. A shard another process is fetching is left to it.
    """

    def __init__(self, *, limit: int = 2):
        self.limit = limit
        self._lock = threading.Lock()
        self._started: set[str] = set()
        self._active = 0

    def start(self, source: CachedSource) -> None:
        with self._lock:
            if source.key in self._started or self._active >= self.limit:
                return
            self._started.add(source.key)
            self._active += 1
        threading.Thread(target=self._fill, args=(source,), name="shardkit-cache-fill", daemon=True).start()

    def _fill(self, source: CachedSource) -> None:
        try:
            writer = source.cache.begin(source.key, size=source.expected_size)
            if writer is None:
                return  # cached already, or another process is fetching it
            try:
                for chunk in source.remote.iter_range(0, None, chunk_bytes=source.options.chunk_bytes):
                    writer.write(chunk)
            except BaseException:
                writer.abort()
                raise
            writer.commit(url=source.url, expected_size=source.expected_size, expected_sha256=source.expected_sha256)
        except Exception as exc:  # the samples are still read by ranged requests
            log.warning("could not cache %s: %s", source.url, exc)
            with self._lock:
                self._started.discard(source.key)  # try again on a later read
        finally:
            with self._lock:
                self._active -= 1


class _RemoteShard:
    """A remote shard opened through the storage layer (optionally cached)."""

    def __init__(self, source: ByteSource, *, options: SourceOptions, fills: _CacheFills):
        self.url = source.url
        self.source = source
        self.options = options
        self.fills = fills

    def read(self, start: int, end: int, *, chunk_bytes: int) -> bytes:
        source = self.source
        if isinstance(source, CachedSource):
            hit = source.cache.open(source.key)
            if hit is not None:
                try:
                    return b"".join(hit.iter_range(start, end, chunk_bytes=chunk_bytes))
                finally:
                    hit.close()
            self.fills.start(source)
            source = source.remote
        return _ranged(source, start, end, options=self.options, chunk_bytes=chunk_bytes)

    def head(self, size: int) -> bytes:
        source = self.source.remote if isinstance(self.source, CachedSource) else self.source
        return _ranged(source, 0, size, options=self.options, chunk_bytes=size)


class _LRU(OrderedDict):
    """A dict that keeps its ``limit`` most recently used entries.

    Dropped entries are not closed here: a thread may still be reading one,
    and an entry closes itself when the last reference goes (a closed and
    reused file descriptor could otherwise be read as another shard).
    """

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get_recent(self, key: int) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: int, value: Any) -> Any:
        """Add ``value`` unless ``key`` is there already; returns the entry kept."""
        if key in self:
            self.move_to_end(key)  # another thread opened it first
            return self[key]
        self[key] = value
        while len(self) > self.limit:
            self.popitem(last=False)
        return value


class IndexedDataset(Dataset):
    """Samples by number: ``ds[i]`` is the *i*-th sample in manifest order.

    Index *i* counts samples shard by shard in manifest order, then by
    position within the shard. Each ``ds[i]`` reads exactly that sample's
    bytes with one ranged read (see the module docstring), parses them and
    returns the same dict :class:`~shardkit.ShardDataset` yields, ``"__key__"``
    and one entry per field, plus ``"__index__"`` (the int *i*), decoded with
    ``decode`` and then passed through ``map``.

    Indices follow ``Sequence`` rules: ``-1`` is the last sample, and an index
    outside ``[-len(ds), len(ds))`` raises :class:`IndexError` naming the
    length. Works with any sampler, :class:`torch.utils.data.DistributedSampler`,
    :class:`~shardkit.ShardWindowSampler` (which keeps reads local to a few
    shards at a time, the sampler to use for remote or cached data),
    ``num_workers > 0`` under ``fork`` and ``spawn``, and ``StatefulDataLoader``.

    Compressed shards (``.tar.gz``, ``.tgz``, ``.tar.zst``) cannot be entered
    in the middle and are refused: reshard them uncompressed with
    ``shardkit write``.

    Faults: under ``on_error="raise"`` a damaged sample raises
    :class:`~shardkit.CorruptShardError` naming the shard and the byte
    offset. Under ``"skip"`` the fault is logged and counted in
    :attr:`num_skipped` (summed over DataLoader workers) and ``ds[i]``
    returns None; batch with ``collate_fn=IndexedDataset.collate``, which
    leaves the Nones out (a batch may thus be smaller).

    Example::

        ds = shardkit.IndexedDataset("data/val", decode="tensor")
        loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds), num_workers=4)

    Args:
        source: A manifest path or URL, a dataset directory (or URL ending in
            ``/``) holding ``manifest.json``, a :class:`~shardkit.Manifest`,
            or local shard paths (a list or brace pattern) that have ``.idx``
            sidecars.
        decode: None for raw bytes; ``"pil"`` / ``"tensor"``; or a
            :class:`~shardkit.Decoder`.
        map: A function applied to each (decoded) sample dict.
        source_options: Storage options. With ``cache_dir``, a remote shard
            is copied whole into the cache in the background when first read;
            ``part_bytes`` (4 MiB) is the largest sample fetched with one
            request; ``max_concurrent_requests`` (8) is how many samples of a
            DataLoader batch are read at once. ``allowed_prefixes`` names the
            places outside the dataset its manifest may point to.
        on_error: ``"raise"`` or ``"skip"`` (see above).
        max_open_shards: Shards whose index and open file or connection are
            kept per process; least recently used ones beyond it are dropped
            (and closed once no read in progress holds them).
        verify_checksums: Check each sample against the CRC-32 its offset index
            stores, so a changed byte is a :class:`~shardkit.CorruptShardError`
            naming the sample (indexes written before checksums existed are
            read unchecked).

    Raises:
        UsageError: Invalid options; shards without sample counts and offset
            indexes; compressed shards.
        ManifestError: The manifest is missing or invalid.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str] | Manifest,
        *,
        decode: ImageMode | Decoder | None = None,
        map: Callable[[Sample], Any] | None = None,  # noqa: A002 - the documented name
        source_options: SourceOptions | None = None,
        on_error: OnError = "raise",
        max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS,
        verify_checksums: bool = False,
    ):
        super().__init__()
        if on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        if max_open_shards < 1:
            raise UsageError(f"max_open_shards must be >= 1, not {max_open_shards}")
        self._options = source_options or SourceOptions()
        self._manifest: Manifest | None
        self._urls: tuple[str, ...] | None = None
        self._index_urls: tuple[str, ...] | None = None
        if isinstance(source, Manifest):
            # Shard URLs are resolved when a shard is first read, so a huge
            # manifest costs only its counts here.
            self._manifest = source
            counts = np.fromiter((s.num_samples for s in source.shards), dtype=np.int64, count=len(source.shards))
        else:
            catalog = resolve_catalog(source, options=self._options)
            self._manifest = catalog.manifest
            if catalog.counts is None or catalog.index_urls is None:
                for url in catalog.urls:
                    kind = compression_of(url) or (_local_compression(url) if is_local(url) else None)
                    if kind is not None:
                        raise _refuse_compressed(url, kind)
                raise UsageError(
                    "IndexedDataset needs per-sample offsets: open a dataset with a manifest (a directory "
                    "holding manifest.json, its URL, or a Manifest), or shards with .idx sidecars. "
                    "Write the shards with `shardkit write` to get both."
                )
            if self._manifest is None:
                self._urls, self._index_urls = catalog.urls, catalog.index_urls
            counts = np.asarray(catalog.counts, dtype=np.int64)
        self._counts = counts
        self._starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self._decoder = make_decoder(decode)
        self._map = map
        self._on_error = on_error
        self._max_open_shards = max_open_shards
        self._verify_checksums = verify_checksums
        self._counters = SharedCounters()
        self._reset_handles()

    # ------------------------------------------------------------ properties

    @property
    def manifest(self) -> Manifest | None:
        """The manifest the dataset was opened from, if any."""
        return self._manifest

    @property
    def num_shards(self) -> int:
        return len(self._counts)

    @property
    def shard_counts(self) -> np.ndarray:
        """Samples per shard, in manifest order (a read-only array)."""
        view = self._counts.view()
        view.flags.writeable = False
        return view

    @property
    def num_skipped(self) -> int:
        """Samples skipped under ``on_error="skip"``, summed over this
        process and its DataLoader workers."""
        return int(self._counters.skipped.value)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __repr__(self) -> str:
        return f"IndexedDataset({len(self)} samples in {self.num_shards} shards)"

    # ------------------------------------------------------------ locating

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, sample number in the shard)`` of sample ``index``.

        Raises:
            IndexError: ``index`` is out of range (see the class docstring).
        """
        length = len(self)
        try:
            i = operator.index(index)  # numpy and torch integers too
        except TypeError:
            raise TypeError(f"IndexedDataset indices must be integers, not {type(index).__name__}") from None
        if i < 0:
            i += length
        if not 0 <= i < length:
            raise IndexError(f"sample index {index} out of range for IndexedDataset of length {length}")
        shard = int(np.searchsorted(self._starts, i, side="right")) - 1
        return shard, i - int(self._starts[shard])

    def shard_url(self, shard: int) -> str:
        """The path or URL of shard number ``shard``."""
        if self._manifest is not None:
            return self._manifest.shard_url(shard, allowed_prefixes=self._options.allowed_prefixes)
        assert self._urls is not None
        return self._urls[shard]

    def _index_url(self, shard: int) -> str:
        if self._manifest is not None:
            return self._manifest.index_url(shard, allowed_prefixes=self._options.allowed_prefixes)
        assert self._index_urls is not None
        return self._index_urls[shard]

    # ------------------------------------------------------------ reading

    def __getitem__(self, index: int) -> Any:
        shard, position = self.locate(index)
        global_index = int(self._starts[shard]) + position
        try:
            raw = self._read(shard, position)
        except FAULTS as exc:
            if self._on_error == "raise":
                raise
            log.warning("skipping sample %d: %s", global_index, exc)
            self._counters.count_skip(exc)
            return None
        sample: Sample = {"__key__": raw.key}
        sample.update(raw.fields)
        sample["__index__"] = global_index
        try:
            if self._decoder is not None:
                sample = self._decoder(sample, path=self.shard_url(shard))
            return sample if self._map is None else self._map(sample)
        except MemberTooLargeError as exc:  # a data fault, like corruption
            error = exc if exc.path is not None else exc.located(path=self.shard_url(shard), member=exc.member)
            if self._on_error == "raise":
                raise error from None
            log.warning("skipping sample %d: %s", global_index, error)
            self._counters.count_skip(error)
            return None

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Samples ``indices`` (a DataLoader batch), read concurrently with up
        to ``source_options.max_concurrent_requests`` threads, so that a
        batch of remote samples costs about one request's latency, not one
        per sample."""
        if len(indices) <= 1:
            return [self[i] for i in indices]
        self._check_process()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self._options.max_concurrent_requests, thread_name_prefix="shardkit-indexed"
            )
        return list(self._pool.map(self.__getitem__, indices))

    @staticmethod
    def collate(batch: list[Any]) -> Any:
        """``default_collate`` over the samples that are not None (skipped)."""
        return default_collate([sample for sample in batch if sample is not None])

    def _read(self, shard: int, position: int):
        index = self._index(shard)
        start, end = int(index.bounds[position]), int(index.bounds[position + 1])
        checksums = None
        if self._verify_checksums and index.checksums is not None:
            checksums = index.checksums[position : position + 1]
        handle = self._shard(shard)
        url = handle.url
        data = handle.read(start, end, chunk_bytes=max(end - start, 1))
        if len(data) != end - start:
            self._check_compressed(handle)
            raise TruncatedShardError(
                f"{url}: sample {position} should occupy bytes [{start}, {end}) but the shard ends at byte "
                f"{start + len(data)}. Run `shardkit verify` on the dataset or rewrite this shard.",
                path=url,
                offset=start + len(data),
            )
        # With the sample's span as its bounds, the parser returns exactly one
        # sample filling it, or raises.
        parser = SampleParser(path=url, base_offset=start, bounds=(start, end), checksums=checksums)
        try:
            samples = parser.feed(data)
            samples += parser.finish(expect_end_marker=False)
        except CorruptShardError:
            self._check_compressed(handle)
            raise
        return samples[0]

    def _check_compressed(self, handle: _LocalShard | _RemoteShard) -> None:
        """Raise the reshard advice when a shard that failed to parse is compressed."""
        try:
            head = handle.head(MAGIC_BYTES)
        except OSError:
            return
        kind = compression_of(handle.url, head)
        if kind is not None:
            raise _refuse_compressed(handle.url, kind)

    # ------------------------------------------------------------ per-process handles

    def _reset_handles(self) -> None:
        self._pid = os.getpid()
        self._indexes = _LRU(self._max_open_shards)
        self._handles = _LRU(self._max_open_shards)
        self._fills = _CacheFills()
        self._tables = threading.Lock()  # guards _indexes and _handles
        self._pool: ThreadPoolExecutor | None = None

    def _check_process(self) -> None:
        # A forked worker inherits the parent's tables; connections must not
        # be shared across processes, so it starts its own.
        if self._pid != os.getpid():
            self._reset_handles()

    def _index(self, shard: int) -> OffsetIndex:
        self._check_process()
        with self._tables:
            index = self._indexes.get_recent(shard)
        if index is not None:
            return index
        url = self._index_url(shard)
        shard_url = self.shard_url(shard)
        kind = compression_of(shard_url)
        if kind is not None:
            raise _refuse_compressed(shard_url, kind)
        if is_local(url):
            index = load_offset_index(local_path(url))
        else:
            index = decode_offset_index(open_source(url, options=self._options).read_all(), path=redact_url(url))
        entry = None if self._manifest is None else self._manifest.shards[shard]
        check_bounds(
            index.bounds,
            path=redact_url(url),
            num_samples=int(self._counts[shard]),
            shard_bytes=None if entry is None else entry.num_bytes,
        )
        with self._tables:
            return self._indexes.put(shard, index)

    def _shard(self, shard: int) -> _LocalShard | _RemoteShard:
        with self._tables:
            handle = self._handles.get_recent(shard)
        if handle is not None:
            return handle
        url = self.shard_url(shard)
        if is_local(url):
            handle = _LocalShard(url, expected_size=None if self._manifest is None else self._manifest.shards[shard].num_bytes)
        else:
            entry = None if self._manifest is None else self._manifest.shards[shard]
            source = open_source(
                url,
                options=self._options,
                expected_size=None if entry is None else entry.num_bytes,
                expected_sha256=None if entry is None else entry.sha256,
            )
            handle = _RemoteShard(source, options=self._options, fills=self._fills)
        with self._tables:
            return self._handles.put(shard, handle)

    def close(self) -> None:
        """Close open files and forget loaded indexes (reopened on the next read)."""
        with self._tables:
            self._handles.clear()  # files close as the last reader lets go
            self._indexes.clear()

    # ------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_indexes", "_handles", "_pid", "_fills", "_tables", "_pool"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_handles()


def _local_compression(url: str) -> str | None:
    try:
        return file_compression(local_path(url))
    except OSError:
        return None
