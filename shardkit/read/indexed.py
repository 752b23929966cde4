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

Each read is one ``read_at`` of the held shard (see :mod:`.handles`; for a
remote one, :meth:`~shardkit.io.base.ByteSource.read_at` of its source),
which returns exactly the bytes asked for or raises, naming the shard and
the range.

The bytes must hold exactly one sample, which
:func:`~shardkit.format.span.parse_span` parses, checking tar structure.
The samples of a DataLoader batch (``__getitems__``) are read by a few
threads at once, so a remote batch costs about one request's latency.

What is kept per process, all bounded (see :mod:`.handles`): the shards
read so far, each held open with its offset index checked once (a local
shard: its file and its index file open, each read a ``pread`` of the
sample's two boundaries and one of its bytes; a remote shard: its index
fetched into memory and its connection), in a least-recently-used table of
``max_open_shards`` entries, by default as many as half the process's
descriptor limit allows (two descriptors a shard), so that a random read
over thousands of shards costs two ``pread`` s and a parse, not an index
load; fetched indexes are held within ``MAX_FETCHED_INDEX_BYTES`` too. A
shard dropped from the table is closed once the reads in progress on it
end. Opening a dataset reads only the manifest: the dataset holds the shard
catalog (see :mod:`.catalog`) and one array of ``num_shards + 1``
cumulative counts derived from it, which is not pickled but derived again
in each process.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from shardkit.errors import TRANSFORM_FAULTS, CorruptShardError, MemberTooLargeError, ShardkitError, UsageError
from shardkit.format.compression import MAGIC_BYTES, compression_from_name, detect_compression, file_compression
from shardkit.format.index import OffsetIndex
from shardkit.format.removed import stored_positions
from shardkit.format.manifest import Manifest
from shardkit.format.span import parse_span
from shardkit.format.tar import RawSample
from shardkit.io.base import SourceOptions
from shardkit.io.index import fetch_offset_index
from shardkit.io.local import LocalFile
from shardkit.io.registry import open_remote, open_source
from shardkit.io.urls import is_local, local_path, redact_url
from shardkit.read.catalog import ShardCatalog, resolve_catalog
from shardkit.read.joined import read_joined
from shardkit.read.counters import SharedCounters
from shardkit.read.handles import (
    MAX_FETCHED_INDEX_BYTES,
    HeldShard,
    LocalShard,
    RecentTable,
    RemoteShard,
    open_shard_limit,
)
from shardkit.read.decode import Decoder, ImageMode, describe_fault, make_decoder, undecodable
from shardkit.read.notebook import INDEXED, notebook_view
from shardkit.read.pieces import FAULTS, ON_ERROR, OnError
from shardkit.read.collate import collate_samples

log = logging.getLogger(__name__)

__all__ = ["IndexedDataset", "compression_of"]

Sample = dict[str, Any]

#: Faulty shards a process remembers having logged (least recently faulty
#: forgotten first), so a damaged shard gives one warning, not one a sample.
MAX_FAULTY_SHARDS_REMEMBERED = 1024

#: Datasets whose local shards this process opens before it first forks
#: (see :meth:`IndexedDataset.open_shards`); weak, so a dataset is not kept alive by it.
_OPEN_BEFORE_FORK: weakref.WeakSet[IndexedDataset] = weakref.WeakSet()


def _open_before_fork() -> None:
    for dataset in list(_OPEN_BEFORE_FORK):
        try:
            dataset._open_ahead()
        except Exception:  # never a reason for a fork to fail: the shards open as they are read
            log.debug("opening shards before a fork failed", exc_info=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_open_before_fork)


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


class IndexedDataset(Dataset):
    """Samples by number: ``ds[i]`` is the *i*-th sample in manifest order.

    Index *i* counts samples shard by shard in manifest order, then by
    position within the shard; samples removed with ``shardkit remove`` are
    not counted (the numbers close up over them). Each ``ds[i]`` reads exactly that sample's
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
    offset, a shard cut short names the byte range it lacks, and a damaged
    offset index names the ``.idx`` file (the error every reader raises for
    it, see :func:`~shardkit.io.index.fetch_offset_index`). Under ``"skip"``
    the fault is logged and counted in :attr:`num_skipped` (summed over
    DataLoader workers) and ``ds[i]`` returns None, as it does for a field
    ``decode`` cannot decode; batch with ``collate_fn=IndexedDataset.collate``,
    which leaves the Nones out (a batch may thus be smaller) and, unlike
    torch's default, names the field and samples when a batch cannot be
    stacked (images of different sizes, PIL images).

    Example::

        ds = shardkit.IndexedDataset("data/val", decode="tensor")
        loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds), num_workers=4,
                            collate_fn=shardkit.IndexedDataset.collate)

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
        max_open_shards: Shards kept open (their files or connections, and
            checked indexes) per process; least recently used ones beyond it are dropped
            (and closed once no read in progress holds them). None (the
            default): half the soft ``RLIMIT_NOFILE`` over two descriptors a
            shard, 8 to 16,384 (see :func:`~shardkit.read.handles.open_shard_limit`).
        verify_checksums: Check each sample against the CRC-32 its offset index stores, so a changed byte
            is a :class:`~shardkit.CorruptShardError` naming the sample (older indexes: read unchecked).
        fields: Read only these fields (of a view or extension: only the shards that hold them).

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
        max_open_shards: int | None = None,
        verify_checksums: bool = False,
        fields: Sequence[str] | None = None,
    ):
        super().__init__()
        if on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        if max_open_shards is not None and max_open_shards < 1:
            raise UsageError(f"max_open_shards must be >= 1, not {max_open_shards}")
        self._options = source_options or SourceOptions()
        self._catalog = resolve_catalog(source, options=self._options, fields=fields)
        if self._catalog.counts is None or not self._catalog.has_indexes:
            raise _no_offsets(self._catalog)
        self._decoder = make_decoder(decode)
        self._map = map
        self._on_error = on_error
        self._max_open_shards = max_open_shards
        self._verify_checksums = verify_checksums
        self._counters = SharedCounters()
        self._derive_arrays()
        self._reset_handles()
        _OPEN_BEFORE_FORK.add(self)

    def _derive_arrays(self) -> None:
        # Derived from the catalog in each process, never pickled.
        self._counts = self._catalog.counts
        self._starts = self._catalog.starts
        self._removed = self._catalog.removed  # samples `shardkit remove` took out: numbered without them
        self._local_paths = _LocalPaths(self._catalog)  # one for every held shard

    # ------------------------------------------------------------ properties

    @property
    def manifest(self) -> Manifest | None:
        """The manifest the dataset was opened from, if any."""
        return self._catalog.manifest

    @property
    def num_shards(self) -> int:
        return self._catalog.num_shards

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

    def _repr_html_(self) -> str:  # a notebook shows a few samples and the counts (shardkit.preview)
        return notebook_view(INDEXED, self)

    # ------------------------------------------------------------ locating

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, sample number in the shard)`` of sample ``index``.

        Raises:
            IndexError: ``index`` is out of range (see the class docstring).
        """
        return self._locate(index)[1:]

    def _locate(self, index: int) -> tuple[int, int, int]:
        """``(global index, shard, sample in the shard)`` of ``index``."""
        starts = self._starts
        length = int(starts[-1])
        try:
            i = operator.index(index)  # numpy and torch integers too
        except TypeError:
            raise TypeError(f"IndexedDataset indices must be integers, not {type(index).__name__}") from None
        if i < 0:
            i += length
        if not 0 <= i < length:
            raise IndexError(f"sample index {index} out of range for IndexedDataset of length {length}")
        # The last shard starting at or before i (an empty shard starts where the next does).
        shard = int(starts.searchsorted(i, "right")) - 1
        return i, shard, i - int(starts[shard])

    def shard_url(self, shard: int) -> str:
        """The path or URL of shard number ``shard``."""
        return self._catalog.url(shard)

    def _shard_facts(self, shard: int) -> tuple[int | None, str | None]:
        """The manifest's size and SHA-256 of a shard, when there is a manifest."""
        manifest = self._catalog.manifest
        if manifest is None:
            return None, None
        table = manifest.table
        return int(table.num_bytes[shard]), table.sha256_hex(shard)

    # ------------------------------------------------------------ reading

    def __getitem__(self, index: int) -> Any:
        return self._sample(*self._locate(index))

    def _sample(self, global_index: int, shard: int, position: int) -> Any:
        """The sample at ``position`` of ``shard`` (number ``global_index``),
        decoded and mapped, or None when skipped."""
        try:
            raw = self._read(shard, position)
        except FAULTS as exc:
            if self._on_error == "raise":
                raise
            return self._skip(shard, global_index, exc)
        sample: Sample = {"__key__": raw.key}
        sample.update(raw.fields)
        sample["__index__"] = global_index
        if self._decoder is not None:
            try:
                sample = self._decoder(sample, path=self.shard_url(shard))
            except Exception as exc:
                if self._on_error == "raise" or not undecodable(exc):
                    raise
                return self._skip(shard, global_index, exc, describe_fault(exc))
        try:
            return sample if self._map is None else self._map(sample)
        except TRANSFORM_FAULTS as exc:  # a data fault, like corruption
            error = exc if exc.path is not None else exc.located(path=self.shard_url(shard), member=exc.member)
            if self._on_error == "raise":
                raise error from None
            return self._skip(shard, global_index, error)

    def _skip(self, shard: int, global_index: int, exc: BaseException, what: object = None) -> None:
        """Count a sample skipped under ``on_error="skip"``; log the first
        fault of each shard (per process), since one damaged shard fails every
        sample read from it, and the rest at debug level."""
        self._counters.count_skip(exc)
        first = self._faulty_shards.get_recent(shard) is None
        if first:
            self._faulty_shards.put(shard, True)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "skipping sample %d: %s%s", global_index, exc if what is None else what,
            " (further faults in this shard are counted in num_skipped, not logged)" if first else "",
        )  # fmt: skip
        return None

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Samples ``indices`` (a DataLoader batch), read concurrently with up
        to ``source_options.max_concurrent_requests`` threads, so that a
        batch of remote samples costs about one request's latency, not one
        per sample. Local samples with no ``decode`` or ``map`` are read one
        after another: a ``pread`` and a parse have no wait to overlap, and
        handing them to threads cost more than reading them (29 against 19 µs
        a tiny sample)."""
        located = self._locate_all(indices)
        if len(located) <= 1 or self._reads_alone(located[0][1]):
            return [self._sample(*where) for where in located]
        self._check_process()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self._options.max_concurrent_requests, thread_name_prefix="shardkit-indexed"
            )
        return list(self._pool.map(lambda where: self._sample(*where), located))

    def _locate_all(self, indices: Sequence[int]) -> list[tuple[int, int, int]]:
        """:meth:`_locate` of every index, in one search when they are all
        integers in range (a tenth of the time one by one); else one by one,
        the first bad index raising its error."""
        array = np.asarray(indices) if not isinstance(indices, np.ndarray) else indices
        starts = self._starts
        length = int(starts[-1])
        if array.ndim != 1 or array.dtype.kind not in "iu" or not len(array):
            return [self._locate(index) for index in indices]
        array = np.where(array < 0, array + length, array)
        if int(array.min()) < 0 or int(array.max()) >= length:
            return [self._locate(index) for index in indices]
        array = array.astype(np.int64, copy=False)
        shards = starts.searchsorted(array, "right") - 1
        return list(zip(array.tolist(), shards.tolist(), (array - starts[shards]).tolist()))

    def _reads_alone(self, shard: int) -> bool:
        """Whether a batch starting in ``shard`` gains nothing from threads:
        the shard is a local file and no decode or map runs."""
        if self._decoder is not None or self._map is not None:
            return False
        return is_local(self.shard_url(shard))

    @staticmethod
    def collate(batch: list[Any]) -> Any:
        """``default_collate`` over the samples that are not None (skipped),
        with the clear error of :func:`~shardkit.read.slot.collate_samples`
        for fields that cannot be stacked (tensors of different shapes, PIL
        images)."""
        return collate_samples([sample for sample in batch if sample is not None])

    def raw_sample(self, index: int, *, max_bytes: int | None = None) -> RawSample:
        """Sample ``index`` as stored, neither decoded nor mapped: its key,
        member bytes and byte range in shard :meth:`locate` gives. Faults
        raise, whatever ``on_error`` says.

        Raises:
            MemberTooLargeError: The offset index gives the sample more than
                ``max_bytes`` bytes (checked before any of them is read).
        """
        _, shard, position = self._locate(index)
        return self._read(shard, position, max_bytes=max_bytes)

    def _read(self, shard: int, position: int, *, max_bytes: int | None = None) -> RawSample:
        """Sample ``position`` of shard ``shard`` (counting its kept samples)."""
        if self._catalog.sides is not None or self._catalog.fields is not None:
            return read_joined(self, shard, position, max_bytes=max_bytes)  # an extension's sides, or some fields
        if self._removed is not None:
            position = int(stored_positions(self._removed.in_shard(shard), position))
        try:
            held = self._hold(shard)
            try:
                if max_bytes is not None:
                    _check_size(held, position, max_bytes)
                start, data, checksum = held.read(position)
            finally:
                self._let_go(held)
            return parse_span(data, start=start, path=lambda: held.url, checksums=None if checksum is None else (checksum,))
        except MemberTooLargeError:
            raise  # refused by its size (max_bytes): nothing was read, no need to look at the shard
        except CorruptShardError:
            self._check_compressed(self.shard_url(shard))
            raise

    def _check_compressed(self, url: str) -> None:
        """Raise the reshard advice when a shard that failed to read is
        compressed (looked at without the manifest's size, which such a
        shard fails)."""
        probe = LocalFile(url) if is_local(url) else open_remote(url, options=self._options)
        try:
            head = probe.read_at(0, MAGIC_BYTES)
        except (ShardkitError, OSError):
            return
        finally:
            probe.close()
        kind = compression_of(url, head)
        if kind is not None:
            raise _refuse_compressed(url, kind)

    # ------------------------------------------------------------ per-process handles

    def _reset_handles(self) -> None:
        self._pid = os.getpid()
        # Sized when a process first needs it (a worker reads its own limit).
        self._held = RecentTable(self._max_open_shards or open_shard_limit(), max_weight=MAX_FETCHED_INDEX_BYTES)
        self._lock = threading.Lock()  # guards _held and each held shard's readers
        self._pool: ThreadPoolExecutor | None = None
        self._faulty_shards = RecentTable(MAX_FAULTY_SHARDS_REMEMBERED)  # shards whose first fault was logged
        self._opened_ahead = False  # this process opened its shards before forking (or found it could not)
        self._joined: list[Any] | None = None  # a reader of each side (see read_joined), made when first read

    def _check_process(self) -> None:
        # A forked worker inherits the parent's table. It keeps the local
        # shards (the descriptors are its own copies, and a pread moves no
        # shared offset), not the remote ones: a connection must not be shared.
        if self._pid != os.getpid():
            local = [(shard, held) for shard, held in self._held.items() if isinstance(held, LocalShard)]
            self._reset_handles()
            for shard, held in local:
                held.readers, held.dropped = 0, False
                self._held.put(shard, held)

    def _hold(self, shard: int) -> HeldShard:
        """Shard ``shard``, opened (its index checked) unless held already,
        counted as in use until :meth:`_let_go`."""
        self._check_process()
        with self._lock:
            held = self._held.get_recent(shard)
            if held is not None:
                held.readers += 1
                return held
        held = self._open_shard(shard)
        with self._lock:
            held, dropped = self._held.put(shard, held, weight=held.weight)
            held.readers += 1
        self._close_idle(dropped)
        return held

    def _let_go(self, held: HeldShard) -> None:
        with self._lock:
            held.readers -= 1
            idle = held.dropped and not held.readers
        if idle:
            held.close()

    def _close_idle(self, dropped: list[HeldShard]) -> None:
        """Close the shards a table let go that no read uses; the others
        close when their last read ends (see :class:`~.handles.HeldShard`)."""
        with self._lock:
            for held in dropped:
                held.dropped = True
            idle = [held for held in dropped if not held.readers]
        for held in idle:
            held.close()

    def _open_shard(self, shard: int) -> HeldShard:
        url = self.shard_url(shard)
        kind = compression_of(url)
        if kind is not None:
            raise _refuse_compressed(url, kind)
        index_url = self._catalog.index_url(shard)
        num_bytes, sha256 = self._shard_facts(shard)
        num_samples = self._catalog.stored_count(shard)
        # Each index is checked here, once per process while its shard stays held, never per read.
        if is_local(url) and is_local(index_url):
            return LocalShard(
                local_path(url), local_path(index_url), paths=self._local_paths, shard=shard,
                num_samples=num_samples, shard_bytes=num_bytes, checksums=self._verify_checksums,
            )
        index = fetch_offset_index(index_url, num_samples=num_samples, shard_bytes=num_bytes, options=self._options)
        if not self._verify_checksums:
            index = OffsetIndex(index.bounds)  # a shard held costs its arrays: no unused one
        source = open_source(url, options=self._options, expected_size=num_bytes, expected_sha256=sha256)
        return RemoteShard(url, index, source)

    def open_shards(self) -> IndexedDataset:
        """Open every shard now, in this process: its file and its offset
        index, checked, as a first read of it would. Returns the dataset.

        A process does this on its own before it first forks (the
        DataLoader starting its workers with ``fork``, Linux's default up
        to Python 3.13), when every shard is local and they fit in
        ``max_open_shards``: the workers inherit the open shards, where
        each would otherwise open and check every shard itself on its first
        read of it (16 workers over 5,000 shards: 80,000 opens, most of
        their work). It costs about 75 µs and two descriptors a shard, once.
        Workers started by ``spawn`` or ``forkserver`` open shards as they
        need them. Call this to open them at a time of your choosing, or to
        have their faults raised here.

        Raises:
            UsageError: The dataset has more shards than a process holds
                open (``max_open_shards``; raise ``ulimit -n``), or remote
                shards (a connection is not shared with workers).
            CorruptShardError: A shard or index is damaged, as its first
                read would raise.
        """
        self._check_process()
        self._opened_ahead = True
        if self.num_shards > self._held.limit:
            raise UsageError(
                f"open_shards(): the dataset has {self.num_shards} shards, more than the {self._held.limit} a "
                "process holds open (max_open_shards, from half the descriptor limit); raise `ulimit -n` "
                "or leave the shards to open as they are read."
            )
        for shard in range(self.num_shards):
            if not is_local(self.shard_url(shard)):
                raise UsageError(f"open_shards(): {redact_url(self.shard_url(shard))} is remote; only local "
                                 "shards are opened ahead (workers must not share connections).")
            self._let_go(self._hold(shard))
        return self

    def _open_ahead(self) -> None:
        """:meth:`open_shards` before this process first forks, when it
        applies; a shard that fails to open is left to the read that needs
        it, which raises or skips it as ``on_error`` says."""
        if self._pid != os.getpid() or self._opened_ahead:
            return
        self._opened_ahead = True
        if self.num_shards > self._held.limit:
            return
        for shard in range(self.num_shards):
            try:
                if not is_local(self.shard_url(shard)):
                    return  # remote shards open in each worker
                self._let_go(self._hold(shard))
            except (ShardkitError, OSError):
                continue

    def close(self) -> None:
        """Close open files and connections (reopened on the next read)."""
        with self._lock:
            dropped = self._held.drop_all()
        self._close_idle(dropped)

    # ------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_held", "_pid", "_lock", "_pool", "_counts", "_starts", "_local_paths", "_faulty_shards",
                     "_opened_ahead", "_joined"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derive_arrays()
        self._reset_handles()
        _OPEN_BEFORE_FORK.add(self)


class _LocalPaths:
    """The local paths of a catalog's shard ``n`` and of its index
    (:data:`~.handles.ShardPaths`), named again rather than kept by each held shard."""

    __slots__ = ("catalog",)

    def __init__(self, catalog: ShardCatalog):
        self.catalog = catalog

    def __call__(self, shard: int) -> tuple[str, str]:
        return local_path(self.catalog.url(shard)), local_path(self.catalog.index_url(shard))


def _check_size(held: HeldShard, position: int, max_bytes: int) -> None:
    """Refuse sample ``position`` of ``held`` when its index gives it more than ``max_bytes``."""
    start, end = held.span(position)
    if end - start > max_bytes:
        raise MemberTooLargeError.over_limit(
            f"the offset index gives the sample at byte {start} {end - start:,} bytes",
            limit=max_bytes, option="max_sample_bytes", path=held.url, amount=end - start,
        )  # fmt: skip


def _no_offsets(catalog: ShardCatalog) -> UsageError:
    """Why a catalog cannot be read at random: a compressed shard (the
    first, named), or no counts and indexes."""
    for shard in range(catalog.num_shards):
        url = catalog.url(shard)
        kind = compression_of(url) or (_local_compression(url) if is_local(url) else None)
        if kind is not None:
            return _refuse_compressed(url, kind)
    return UsageError(
        "IndexedDataset needs per-sample offsets: open a dataset with a manifest (a directory "
        "holding manifest.json, its URL, or a Manifest), or shards with .idx sidecars. "
        "Index published shards in place with `shardkit index SOURCE` to get both."
    )


def _local_compression(url: str) -> str | None:
    try:
        return file_compression(local_path(url))
    except OSError:
        return None
