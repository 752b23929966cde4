"""Planning: which sample goes into which shard, decided before any writing.

The write order is the samples sorted by a seeded hash of their key (see
:mod:`shardkit.write.spill`): a seeded random permutation that depends on the
keys and the seed only, never on how the source was partitioned, how many
processes scanned it or in which order they finished. ``shuffle=False`` keeps
source order (partitions in order, lines or files in order).

The sort is done bucket by bucket: bucket ``b`` holds the hashes whose top
``k`` bits are ``b`` (``2**k`` buckets of about :data:`BUCKET_ROWS` samples,
``k`` chosen from the total count only), and is a contiguous slice of every
partition's spill (each is sorted by hash), so the driver holds one bucket at
a time. Samples with one key have one hash, so they meet in one bucket: that
is where duplicates are found, across partitions, without holding all keys.

Each bucket's order is written to ``PLAN/order-NNNNNN.npy`` (``(partition,
record)`` rows); shards are cut from the sizes by arithmetic
(:class:`~shardkit.write.limits.ShardLimits`), walking the buckets in order,
and a :class:`ShardTask` names row ranges of those files: it pickles small,
and any process (or another machine that sees the folder) writes it with
:func:`shardkit.write.shard_task.write_shard`. The driver's memory is
O(bucket + partitions + shards).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.format.tar import END_OF_ARCHIVE
from shardkit.io.atomic import atomic_write_bytes
from shardkit.write.destination import shard_name
from shardkit.write.limits import ShardLimits
from shardkit.write.scan import ScanResult
from shardkit.write.sources import Partition, duplicate_error, record_origin
from shardkit.write.sources.files import OpenFiles
from shardkit.write.spill import Record, SpillFetcher, SpillReader, load_summary, spill_prefix

#: Samples per bucket of the shuffle, about: what the driver holds at once
#: (~40 bytes each, ~10 MB a bucket).
BUCKET_ROWS = 1 << 18

#: A row of an order file: which partition's spill, which record of it.
ORDER = np.dtype([("part", "<u4"), ("rec", "<u8")])

PARTITIONS_FILE = "partitions.json"

#: Samples a shard writer fetches records for at once.
_BLOCK_ROWS = 8192


@dataclass(frozen=True)
class ShardTask:
    """Everything needed to write one shard.

    Attributes:
        index: Shard number.
        name: File name of the shard (``shard-000042.tar``).
        plan_dir: The plan's folder (order files and ``partitions.json``).
        spill_dir: The scan's folder (the partitions' spills).
        segments: ``(order file number, first row, end row)`` ranges, in write order.
        num_samples: Samples in the shard.
        planned_bytes: Tar size if every sample is written as planned.
        fingerprint: Hash of what goes in (each sample's key, source and
            size, in order): a resumed run reuses an existing shard only when
            its task fingerprint matches.
    """

    index: int
    name: str
    plan_dir: str
    spill_dir: str
    segments: tuple[tuple[int, int, int], ...]
    num_samples: int
    planned_bytes: int
    fingerprint: str


def order_path(plan_dir: str, chunk: int) -> str:
    return os.path.join(plan_dir, f"order-{chunk:06d}.npy")


#: Samples over ``max_bytes`` a plan names (it counts them all).
OVERSIZED_LISTED = 10


@dataclass(frozen=True)
class Oversized:
    """Samples that alone exceed ``max_bytes`` (each still gets a shard of its
    own): how many, and the first few as ``"origin (sample 'key', N bytes in tar)"``. A limit
    set too small can make every sample one: the plan holds no list of them."""

    count: int = 0
    examples: tuple[str, ...] = ()

    def warning(self, max_bytes: Any) -> str:
        """One line saying so, for the log."""
        if self.count == 1:
            return f"{self.examples[0]} alone exceeds max_bytes={max_bytes}; it gets a shard of its own"
        return (
            f"{self.count} samples alone exceed max_bytes={max_bytes}, each getting a shard of its own "
            f"(e.g. {self.examples[0]}); raise --max-bytes"
        )


def plan_shards(
    scan: ScanResult, *, limits: ShardLimits, shuffle: bool = True, plan_dir: str, first_shard: int = 0
) -> tuple[list[ShardTask], Oversized]:
    """Order the scanned samples and cut them into shards that respect ``limits``.

    Args:
        scan: The scanned source (spills sorted by the seeded key hash).
        limits: Shard limits.
        shuffle: The seeded hash order, or source order when False.
        plan_dir: An existing folder for the order files.
        first_shard: The number of the first shard (its index and name):
            an append numbers its shards after the dataset's last.

    Returns:
        The shard tasks in order, and the samples that alone exceed
        ``max_bytes`` (:class:`Oversized`; the caller warns).

    Raises:
        DuplicateSampleError: Two samples share a key (both inputs named).
    """
    readers = [scan.reader(p.index) for p in scan.partitions]
    read_paths = [s["read_path"] for s in scan.summaries]
    atomic_write_bytes(
        os.path.join(plan_dir, PARTITIONS_FILE),
        json.dumps([{**p.to_dict(), "read_path": r} for p, r in zip(scan.partitions, read_paths)]).encode(),
        sync_dir=False,
    )
    context = _Context(scan.partitions, read_paths, readers)
    cutter = _Cutter(limits, plan_dir, scan.spill_dir, context, first_shard)
    buckets = _buckets(readers, scan.num_samples, context)
    if shuffle:
        for chunk, (parts, recs, sizes, digests) in enumerate(buckets):
            _save_order(plan_dir, chunk, parts, recs)
            cutter.feed(chunk, parts, recs, sizes, digests)
    else:
        for _ in buckets:  # duplicates are found in buckets; the order is the source's
            pass
        for chunk, reader in enumerate(readers):
            by_source = reader.read_by_source()
            parts = np.full(len(by_source), chunk, dtype="<u4")
            _save_order(plan_dir, chunk, parts, by_source)
            records = reader.read_rows(0, len(by_source))
            cutter.feed(chunk, parts, by_source, records["size"][by_source], records["digest"][by_source])
            del records
    return cutter.finish(), Oversized(cutter.num_oversized, tuple(cutter.oversized))


def _save_order(plan_dir: str, chunk: int, parts: np.ndarray, recs: np.ndarray) -> None:
    rows = np.empty(len(parts), dtype=ORDER)
    rows["part"], rows["rec"] = parts, recs
    tmp = order_path(plan_dir, chunk) + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, rows, allow_pickle=False)
    os.replace(tmp, order_path(plan_dir, chunk))


@dataclass
class _Context:
    """The partitions, for naming samples in messages."""

    partitions: list[Partition]
    read_paths: list[str]
    readers: list[SpillReader]

    def where(self, part: int, rec: int) -> tuple[Partition, str, str, int]:
        reader = self.readers[part]
        name = reader.name(rec).decode("utf-8", "surrogateescape")
        return self.partitions[part], self.read_paths[part], name, int(reader.records[rec]["offset"])

    def key(self, part: int, rec: int) -> bytes:
        return self.readers[part].key(rec)


def _buckets(
    readers: list[SpillReader], num_samples: int, context: _Context
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Each bucket's samples sorted by hash: ``(partitions, records, sizes,
    digests)``; raises :class:`DuplicateSampleError` on a key met twice."""
    bits = max(0, int(np.ceil(np.log2(max(num_samples, 1) / BUCKET_ROWS))))
    bounds = [_bucket_bounds(reader, bits) for reader in readers]
    for bucket in range(1 << bits):
        slices = []
        for index, edges in enumerate(bounds):
            lo, hi = int(edges[bucket]), int(edges[bucket + 1])
            if hi > lo:
                slices.append((index, lo, hi))
        if not slices:
            continue
        # Read into memory of its own, one partition's slice at a time, keeping
        # the columns the plan needs (24 bytes a sample), then put in hash order.
        total = sum(hi - lo for _, lo, hi in slices)
        columns = {name: np.empty(total, dtype="<u8") for name in ("hash", "size", "digest")}
        start = 0
        for i, lo, hi in slices:
            rows = readers[i].read_rows(lo, hi)
            for name, column in columns.items():
                column[start : start + hi - lo] = rows[name]
            start += hi - lo
        del rows
        order = np.argsort(columns["hash"], kind="stable")
        hashes_sorted, sizes, digests = (columns.pop(name)[order] for name in ("hash", "size", "digest"))
        part = np.concatenate([np.full(hi - lo, i, dtype="<u4") for i, lo, hi in slices])[order]
        rec = np.concatenate([np.arange(lo, hi, dtype="<u8") for i, lo, hi in slices])[order]
        del order
        for i in np.flatnonzero(hashes_sorted[1:] == hashes_sorted[:-1]).tolist():
            first, second = (int(part[i]), int(rec[i])), (int(part[i + 1]), int(rec[i + 1]))
            key = context.key(*first)
            if key == context.key(*second):  # else two keys whose 64-bit hashes collide
                raise duplicate_error(key.decode("utf-8", "surrogateescape"), context.where(*first), context.where(*second))
        del hashes_sorted
        yield part, rec, sizes, digests


def _bucket_bounds(reader: SpillReader, bits: int) -> np.ndarray:
    """Where each of the ``2**bits`` buckets starts in a partition's records
    (sorted by hash), and its end: ``2**bits + 1`` row numbers.

    The hashes are read in slices of :data:`BUCKET_ROWS` rows into memory of
    the driver's own and searched there, once per partition: searching the
    memory-mapped spill would leave its pages in the driver's resident set.
    """
    num_rows = len(reader.records)
    starts = np.zeros(1, dtype=np.uint64) if bits == 0 else np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
    first = np.full(len(starts), num_rows, dtype=np.int64)
    for lo in range(0, num_rows, BUCKET_ROWS):
        hashes = reader.read_rows(lo, min(num_rows, lo + BUCKET_ROWS))["hash"]
        where = np.searchsorted(hashes, starts)
        found = (first == num_rows) & (where < len(hashes))
        first[found] = lo + where[found]
    return np.append(first, num_rows)


class _Cutter:
    """Cut the ordered samples into shards, one chunk (bucket) at a time;
    a shard may span chunks."""

    def __init__(self, limits: ShardLimits, plan_dir: str, spill_dir: str, context: _Context, first_shard: int = 0):
        self.first_shard = first_shard
        self.limits = limits
        self.plan_dir = plan_dir
        self.spill_dir = spill_dir
        self.context = context
        self.tasks: list[ShardTask] = []
        self.oversized: list[str] = []  # the first OVERSIZED_LISTED
        self.num_oversized = 0
        self._segments: list[tuple[int, int, int]] = []
        self._count = 0
        self._bytes = 0
        self._digest = hashlib.sha256()

    def feed(self, chunk: int, parts: np.ndarray, recs: np.ndarray, sizes: np.ndarray, digests: np.ndarray) -> None:
        sizes = np.asarray(sizes, dtype=np.int64)
        n = len(sizes)
        cum = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=cum[1:])
        max_bytes, max_samples = self.limits.max_bytes, self.limits.max_samples
        end_marker = len(END_OF_ARCHIVE)
        if max_bytes is not None:
            over = np.flatnonzero(sizes + end_marker > max_bytes)
            self.num_oversized += len(over)
            for i in over[: OVERSIZED_LISTED - len(self.oversized)]:
                partition, read_path, name, offset = self.context.where(int(parts[i]), int(recs[i]))
                key = self.context.key(int(parts[i]), int(recs[i])).decode("utf-8", "surrogateescape")
                where = record_origin(partition, read_path, name, offset)
                self.oversized.append(f"{where} (sample {key!r}, {int(sizes[i]):,} bytes in tar)")
        i = 0
        while i < n:
            j = n
            if max_bytes is not None:
                room = max_bytes - end_marker - self._bytes
                j = int(np.searchsorted(cum, cum[i] + room, side="right")) - 1
                if j <= i and self._count == 0:
                    j = i + 1  # an empty shard takes any sample, even an oversized one
            if max_samples is not None:
                j = min(j, i + max_samples - self._count)
            j = min(j, n)
            if j > i:
                self._segments.append((chunk, i, j))
                self._count += j - i
                self._bytes += int(cum[j] - cum[i])
                self._digest.update(np.ascontiguousarray(digests[i:j]).tobytes())
            full = j < n or (max_samples is not None and self._count >= max_samples)
            if max_bytes is not None and self._bytes + end_marker > max_bytes:
                full = True  # an oversized sample keeps its shard to itself
            if full:
                self._close()
            i = j

    def _close(self) -> None:
        if self._count:
            index = self.first_shard + len(self.tasks)
            self.tasks.append(
                ShardTask(
                    index=index,
                    name=shard_name(index),
                    plan_dir=self.plan_dir,
                    spill_dir=self.spill_dir,
                    segments=tuple(self._segments),
                    num_samples=self._count,
                    planned_bytes=self._bytes + len(END_OF_ARCHIVE),
                    fingerprint=self._digest.hexdigest(),
                )
            )
        self._segments, self._count, self._bytes = [], 0, 0
        self._digest = hashlib.sha256()

    def finish(self) -> list[ShardTask]:
        self._close()
        return self.tasks


@dataclass(frozen=True)
class SampleBlock:
    """Some of a task's samples, in write order: each one's partition,
    spill record, and key and name as the spill holds them (bytes)."""

    parts: list[int]
    records: np.ndarray
    keys: list[bytes]
    names: list[bytes]

    def samples(self) -> Iterator[tuple[int, str, bytes, Record]]:
        """``(partition, key, name, record)`` of each sample, the key decoded."""
        for part, key, name, values in zip(self.parts, self.keys, self.names, self.records.tolist()):
            yield part, key.decode("utf-8", "surrogateescape"), name, Record(*values)


class PlanReader:
    """A plan read back by a shard writer: the partitions, their spills, the
    order files, and the input files it reads from (kept open until :meth:`close`)."""

    def __init__(self, task: ShardTask):
        with open(os.path.join(task.plan_dir, PARTITIONS_FILE), "rb") as f:
            rows = json.load(f)
        self.read_paths: list[str] = [row.pop("read_path") for row in rows]
        self.partitions = [Partition(**row) for row in rows]
        self.plan_dir = task.plan_dir
        self.spill_dir = task.spill_dir
        self._spills: dict[int, SpillFetcher] = {}
        self._files = OpenFiles()
        self._unchanged: dict[int, bool] = {}

    def spill(self, part: int) -> SpillFetcher:
        fetcher = self._spills.get(part)
        if fetcher is None:
            fetcher = self._spills[part] = SpillFetcher(spill_prefix(self.spill_dir, part))
        return fetcher

    def samples(self, task: ShardTask) -> Iterator[tuple[int, str, bytes, Record]]:
        """``(partition, key, name, record)`` of the task's samples, in write
        order; the name as the spill holds it (bytes)."""
        for block in self.blocks(task):
            yield from block.samples()

    def blocks(self, task: ShardTask) -> Iterator[SampleBlock]:
        """The task's samples in write order, a block at a time (memory stays small)."""
        for chunk, start, end in task.segments:
            order = np.load(order_path(self.plan_dir, chunk), mmap_mode="r", allow_pickle=False)
            for block in range(start, end, _BLOCK_ROWS):
                rows = np.array(order[block : min(end, block + _BLOCK_ROWS)])
                yield self._fetch_block(rows["part"], rows["rec"])
            del order

    def _fetch_block(self, parts: np.ndarray, recs: np.ndarray) -> SampleBlock:
        """One batch of reads per partition, put back in the order given."""
        unique = np.unique(parts).tolist()
        if len(unique) == 1:
            return SampleBlock(parts.tolist(), *self.spill(unique[0]).fetch(recs))
        fetched = [self.spill(part).fetch(recs[parts == part]) for part in unique]
        # The fetched rows come grouped by partition (a stable sort of the
        # block); the block's row i is the grouped row ``grouped[i]``.
        grouped = np.empty(len(parts), dtype=np.intp)
        grouped[np.argsort(parts, kind="stable")] = np.arange(len(parts))
        at = grouped.tolist()
        keys = [key for _, some, _ in fetched for key in some]
        names = [name for _, _, some in fetched for name in some]
        return SampleBlock(
            parts=parts.tolist(),
            records=np.concatenate([records for records, _, _ in fetched])[grouped],
            keys=[keys[i] for i in at],
            names=[names[i] for i in at],
        )

    def unchanged(self, part: int) -> bool:
        """Whether partition ``part``'s input has the size and modification
        time it had when scanned (checked once per task): then what the scan
        spilled of it can stand for its bytes."""
        same = self._unchanged.get(part)
        if same is None:
            summary = load_summary(spill_prefix(self.spill_dir, part)) or {}
            scanned, now = summary.get("signature", {}), self.partitions[part].signature()
            same = self._unchanged[part] = all(now.get(k, -1) == scanned.get(k) for k in ("size", "mtime_ns"))
        return same

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``path`` at ``offset`` (fewer at its end), the file kept open.

        Raises:
            OSError: The file cannot be opened or read.
        """
        return self._files.read_range(path, offset, length)

    def close(self) -> None:
        self._files.close()
        for fetcher in self._spills.values():
            fetcher.close()
        self._spills.clear()

    def __enter__(self) -> PlanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
