"""What every source kind shares: its partitions, the settings it reads, the scan collector, its interface.

A source kind (:mod:`shardkit.write.sources` lists them) cuts a source into
:class:`Partition` s (:meth:`SourceKind.partitions`), scans one partition at a
time into a :class:`ScanCollector` (:meth:`SourceKind.scan`, in a worker: names
and sizes only, one spill record per sample) and, while a shard is written,
reads a scanned sample's members back (:meth:`SourceKind.load`). What a kind
reads of the write's options comes in one frozen, picklable
:class:`SourceSettings`; which options apply to it at all is
:attr:`SourceKind.options`.

Partitions per kind:

``jsonl``
    A byte range ``[start, end)`` of the file; a partition owns the lines that
    *begin* inside it, so ranges cut anywhere still give every line once.
    Ranges are :attr:`SourceSettings.partition_bytes` long (64 MiB by default).
``tar``
    One input shard (plain, or compressed whole: then unpacked by the worker
    that scans it).
``imagefolder``
    One class folder (its label is the folder's index in sorted order).
``directory``
    The whole tree: files are grouped into samples by key wherever they sit,
    so the tree is one partition (scanned by one worker; its memory, not the
    driver's, grows with the files).
``parquet``, ``csv``, ``tsv``, ``hf``
    A part of a table (see :mod:`shardkit.write.sources.table`): Parquet row
    groups ``[start, end)``, a CSV/TSV byte range, or one Arrow file of a
    ``datasets`` folder; ``root`` is the table source as given.

Listing partitions reads directory entries and file sizes only (a table's
metadata); the driver holds one :class:`Partition` per partition, never one
object per sample.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardkit.errors import DuplicateSampleError, InputFileError, SourceError
from shardkit.format.tar import encoded_sample_size
from shardkit.write.fieldmap import FieldMap
from shardkit.write.sources.files import ENC, MAX_OCTAL_SIZE
from shardkit.write.spill import SpillWriter

#: Default length of a JSONL or CSV/TSV partition (bytes of the file).
PARTITION_BYTES = 64 << 20

#: Default of ``max_unpack_bytes``: most bytes the unpacked copies of input
#: shards compressed whole may take in the temporary folder, all together.
DEFAULT_MAX_UNPACK_BYTES = 64 << 30

#: Options every source kind takes (how images are stored), listed in each kind's :attr:`SourceKind.options`.
IMAGE_OPTIONS = frozenset({"resize", "resize_mode", "image_format", "image_quality"})

#: Reads ``length`` bytes of a file at an offset (the shard writer keeps its input files open).
ReadRange = Callable[[str, int, int], bytes]

#: A sample's members as read back: ``(extension, bytes)``, sorted by extension.
Members = list[tuple[str, bytes]]


@dataclass(frozen=True)
class Partition:
    """One slice of the input, scanned by one worker.

    Attributes:
        index: Position in source order.
        kind: The source kind's name (``"jsonl"``, ``"tar"``, ``"imagefolder"``,
            ``"directory"``, or a table's: ``"parquet"``, ``"csv"``, ``"tsv"``, ``"hf"``).
        path: The JSONL file, the input shard, the class folder, the tree or the table file.
        start: First byte of a JSONL or CSV/TSV range, first Parquet row group (0 otherwise).
        end: End of that range (0 otherwise).
        root: For an ImageFolder, its root (keys are relative to it); for
            a JSONL range, the folder its rows' file paths must stay in
            (``""``: the JSONL file's); for a table, the source as given.
        label: For an ImageFolder, the class index (-1 otherwise).
        first_row: For a table, the position of its first row in the table.
        first_line: For a CSV/TSV table, the line number of its first row.
    """

    index: int
    kind: str
    path: str
    start: int = 0
    end: int = 0
    root: str = ""
    label: int = -1
    first_row: int = 0
    first_line: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def signature(self) -> dict:
        """What identifies this partition's input now: a rerun with
        ``--resume`` reuses its scan only while this is unchanged."""
        try:
            st = os.stat(self.path)
        except OSError:
            return {**self.to_dict(), "missing": True}
        return {**self.to_dict(), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass(frozen=True)
class SourceSettings:
    """What the sources read of a write's options (picklable: it travels with every scan job).

    Attributes:
        partition_bytes: Length of a JSONL or CSV/TSV partition (does not change the output).
        files_root: The folder a JSONL's rows may name files in (None: the JSONL file's).
        fields: A table's column map (``--field``/``--key``; empty: columns
            named after extensions map to themselves).
        table_output: What of the write's options changes a table row's
            stored bytes (in each row's digest, for ``--resume``).
        unpack_dir: Where input shards compressed whole are unpacked to; it
            must outlive the write (None: such an input is refused).
        max_unpack_bytes: Most bytes those copies may take, all together
            (None: no limit but the folder's free space).
    """

    partition_bytes: int = PARTITION_BYTES
    files_root: str | None = None
    fields: FieldMap = field(default_factory=FieldMap)
    table_output: str = ""
    unpack_dir: str | None = None
    max_unpack_bytes: int | None = DEFAULT_MAX_UNPACK_BYTES


@dataclass(frozen=True)
class Listing:
    """A source cut into partitions, as :meth:`SourceKind.partitions` finds it.

    Attributes:
        partitions: In source order.
        class_names: An ImageFolder's classes, else None.
        spec: What every partition's scan shares that listing found (a
            table's columns and resolved field map), handed to
            :meth:`SourceKind.scan`; picklable. None for most kinds.
        signature: What of ``spec`` a resumed run's spills must have been
            scanned with (added to every partition's signature).
    """

    partitions: list[Partition]
    class_names: tuple[str, ...] | None = None
    spec: Any = None
    signature: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Reading:
    """How :meth:`SourceKind.read_samples` reads samples for a user's ``map``.

    Attributes:
        read_range: Reads a byte range of a file.
        on_error: ``"raise"`` or ``"skip"`` for an input that cannot be read.
        ingest: For a table: how its fields are fetched and its images
            prepared (:class:`~shardkit.write.sources.table.IngestOptions`).
        row_errors: For a table: ``"raise"`` or ``"skip"`` for a row whose
            fields could not be fetched (the write's ``download_errors``).
    """

    read_range: ReadRange
    on_error: str = "raise"
    ingest: Any = None
    row_errors: str = "skip"


class ScanCollector:
    """What one partition's scan collects besides the spill records: skips,
    extensions, input files (a worker-side helper of
    :func:`~shardkit.write.sources.scan_partition`)."""

    def __init__(self, spill: SpillWriter, on_error: str):
        self.spill = spill
        self.on_error = on_error
        self.skipped: list[list[str]] = []
        self.extensions: set[str] = set()
        self.num_bytes = 0
        self.files: set[str] = set()  # input files that rows may share (JSONL rows' fields)
        self.num_distinct_files = 0  # input files met once each (an ImageFolder's, a tree's)
        self.has_urls = False  # a table row with a field to download (its size is not known yet)
        self._last_exts: tuple[str, ...] = ()

    def skip_or_raise(self, error: SourceError, default_path: str) -> None:
        if self.on_error == "raise":
            raise error
        self.skipped.append([error.path or default_path, str(error)])

    def add(self, key: str, name: bytes, offset: int, length: int, fields: list[tuple[str, int]], digest: bytes) -> None:
        self.add_sized(key, name, offset, length, tuple(ext for ext, _ in fields), sample_size(key, fields), digest)

    def add_sized(self, key: str, name: bytes, offset: int, length: int, exts: tuple[str, ...], size: int, digest: bytes) -> None:
        """:meth:`add` for a sample whose tar ``size`` is known."""
        self.spill.add(key.encode(*ENC), name, offset, length, size, digest)
        self.num_bytes += size
        if exts != self._last_exts:  # rows mostly repeat the extensions of the row before
            self._last_exts = exts
            self.extensions.update(exts)


def sample_size(key: str, fields: list[tuple[str, int]]) -> int:
    """:func:`~shardkit.format.tar.encoded_sample_size`, with the common case
    (short ASCII names, sizes an octal field holds: one 512-byte header per
    member) done inline: it runs once per sample scanned."""
    if key.isascii():
        total = 0
        for ext, size in fields:
            if len(key) + len(ext) >= 100 or size > MAX_OCTAL_SIZE or not ext.isascii():
                return encoded_sample_size(key, fields)
            total += 512 + size + (-size % 512)
        return total
    return encoded_sample_size(key, fields)


class SourceKind:
    """One kind of source: how it is cut into partitions, scanned and read back.

    Subclasses set :attr:`name` and :attr:`options` and implement
    :meth:`partitions`, :meth:`scan`, :meth:`load` and :meth:`origin`; the
    registry (:mod:`shardkit.write.sources`) holds one instance per name.

    Attributes:
        name: The format name (``--format NAME``), also each partition's ``kind``.
        options: The :class:`~shardkit.write.parallel.WriteOptions` fields
            that only some kinds use and this one does (see
            :func:`~shardkit.write.sources.check_options`); options every
            kind uses (``max_bytes``, ``shuffle``...) are not listed.
        source_is_path: The source must exist as a path (False where it may
            be a brace pattern or a cached dataset's name).
        inline_values: The scan may keep a sample's values in its spill
            record (JSONL rows whose values are all inline), which the shard
            writer takes from there while the input is unchanged.
        rows_in_spill: Every sample is whole in its spill record (a table
            row, or the URLs to fetch for it): the shard writer makes it from
            there (:func:`~shardkit.write.sources.table.table_rows`), never
            through :meth:`load`.
        joined_in_stage: Every sample's members sit joined
            (:func:`~shardkit.format.tar.join_members`) at its record's byte
            range of ``read_path`` (the map stage's output): the shard writer
            copies them in blocks through ``joined()``.
    """

    name: str = ""
    options: frozenset[str] = frozenset()
    source_is_path: bool = True
    inline_values: bool = False
    rows_in_spill: bool = False
    joined_in_stage: bool = False

    def partitions(self, source: str, settings: SourceSettings) -> Listing:
        """``source`` cut into partitions, in source order.

        Raises:
            SourceError: Nothing to read there (no class folders, no shards, no rows).
        """
        raise NotImplementedError

    def scan(self, part: Partition, collector: ScanCollector, settings: SourceSettings, spec: Any) -> tuple[str, int]:
        """Scan one partition into ``collector``; ``spec`` is its
        :attr:`Listing.spec`. Return the path the records' offsets point
        into and the bytes unpacked to get it (``part.path, 0`` but for an
        input shard compressed whole)."""
        raise NotImplementedError

    def load(self, part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
        """A scanned sample's members, read from its input and checked
        against the scan (:meth:`checked_size`).

        Args:
            part: Its partition.
            read_path: The file the partition's offsets point into (an input
                shard's unpacked copy, when it was compressed).
            key: Its key.
            name: Its name from the spill (relative file paths).
            rec: Its spill record (a :data:`~shardkit.write.spill.Record`).
            read_range: Reads a byte range of a file.

        Raises:
            InputFileError: An input vanished, became unreadable, or changed
                since it was scanned.
        """
        raise NotImplementedError

    def origin(self, part: Partition, read_path: str, name: str, offset: int) -> str:
        """Where a sample came from, for messages (its file, ``shard@byte``, ``table#row=N``)."""
        raise NotImplementedError

    def read_samples(
        self, part: Partition, read_path: str, rows: Sequence[tuple[str, bytes, Any]], reading: Reading
    ) -> Iterator[tuple[str, Members | None, SourceError | None]]:
        """Scanned samples of ``part`` read whole, in order, for a user's
        ``map`` (:mod:`shardkit.write.mapping`): ``(where, members, None)``
        each, or ``(where, None, error)`` for one left out under
        ``reading.on_error="skip"``.

        Args:
            rows: ``(key, name, record)`` of each sample, as the scan spilled
                them (the name as bytes).
            reading: How to read them (see :class:`Reading`).

        Raises:
            InputFileError: An input cannot be read, under ``on_error="raise"``.
        """
        for key, raw_name, rec in rows:
            name = raw_name.decode("utf-8", "surrogateescape")
            where = self.origin(part, read_path, name, rec.offset)
            try:
                members = self.load(part, read_path, key, name, rec, reading.read_range)
            except InputFileError as exc:
                if reading.on_error == "raise":
                    raise
                yield where, None, exc
                continue
            yield where, members, None

    def checked_size(self, part: Partition, read_path: str, key: str, name: str, rec: Any, members: Members) -> Members:
        """``members``, once their tar size is the one the scan planned.

        Raises:
            InputFileError: It is not: an input changed size since the scan.
        """
        if sample_size(key, [(ext, len(data)) for ext, data in members]) != rec.size:
            where = self.origin(part, read_path, name, rec.offset)
            raise InputFileError(
                f"{where}: input changed size since it was scanned (sample {key!r}); rerun the write", path=where
            )
        return members

    def duplicate_error(self, key: str, first: Sequence[Any], second: Sequence[Any]) -> DuplicateSampleError:
        """The error for two samples with one key: ``(partition, read path, name, offset)`` each."""
        a, b = self.origin(*first), self.origin(*second)
        return DuplicateSampleError(
            f"sample key {key!r} appears in both {a} and {b}; rename one of them (keys are unique in a dataset)",
            first=a,
            second=b,
        )

    def unpacks(self, part: Partition) -> bool:
        """Scanning ``part`` writes a plain copy of it into the unpack folder."""
        return False

    def count_files(self, partitions: Sequence[Partition], summaries: Sequence[dict]) -> int:
        """Input files the samples are read from, by the partitions' scan summaries."""
        return sum(s["num_files"] for s in summaries)
