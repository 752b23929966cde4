"""The write's sources: one registry of source kinds, each detect -> partitions -> scan -> load.

:data:`KINDS` maps each format name (``--format NAME``) to its
:class:`~shardkit.write.sources.base.SourceKind`:

``imagefolder``, ``directory``, ``jsonl``, ``tar``
    :mod:`~shardkit.write.sources.imagefolder`, :mod:`~shardkit.write.sources.directory`,
    :mod:`~shardkit.write.sources.jsonl`, :mod:`~shardkit.write.sources.tar`.
``parquet``, ``csv``, ``tsv``, ``hf``
    Tables (:mod:`~shardkit.write.sources.table`), read by
    :mod:`~shardkit.write.sources.table_reader`.

The engine (:mod:`shardkit.write.scan`, :mod:`shardkit.write.plan`,
:mod:`shardkit.write.shard_task`) goes through the functions here and never
asks which kind a partition is: :func:`detect_source` names the kind of a
source given without ``--format``, :func:`list_partitions` cuts it,
:func:`scan_partition` scans one partition into its spill (in a worker:
metadata only), :func:`load_sample` reads a scanned sample back while its
shard is written, and :func:`record_origin` / :func:`duplicate_error` name
where samples came from. :func:`check_options` refuses, before anything is
scanned, a write option set for a kind that does not use it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from shardkit.errors import DuplicateSampleError, UsageError
from shardkit.write.flags import WRITE_FLAGS
from shardkit.write.sources.base import (
    Listing,
    Members,
    Partition,
    ReadRange,
    ScanCollector,
    SourceKind,
    SourceSettings,
)
from shardkit.write.sources.detect import detect_format
from shardkit.write.sources.directory import DirectoryKind
from shardkit.write.sources.imagefolder import ImageFolderKind
from shardkit.write.sources.jsonl import JsonlKind
from shardkit.write.sources.mapped import MAPPED, SEQUENCE, MappedKind, SequenceKind
from shardkit.write.sources.table import TABLE_KINDS, TableKind, detect_table
from shardkit.write.sources.tar import TarKind
from shardkit.write.spill import SpillWriter, spill_error

#: Every source kind by its format name, in the order messages list them.
KINDS: dict[str, SourceKind] = {
    kind.name: kind
    for kind in (ImageFolderKind(), DirectoryKind(), JsonlKind(), TarKind(), *(TableKind(name) for name in TABLE_KINDS))
}

#: Kinds never detected nor named by ``--format``: a Python sequence given
#: to ``write_dataset``, and the map stage's output (both in
#: :mod:`~shardkit.write.sources.mapped`).
MADE_KINDS: dict[str, SourceKind] = {SEQUENCE: SequenceKind(), MAPPED: MappedKind()}

#: The format names (``--format``), in :data:`KINDS` order.
FORMATS: tuple[str, ...] = tuple(KINDS)

#: Options that some source kinds use and others refuse (each kind's :attr:`~SourceKind.options`).
SOURCE_OPTIONS: frozenset[str] = frozenset().union(*(kind.options for kind in KINDS.values()))


def source_kind(format: str) -> SourceKind:
    """The kind named ``format``.

    Raises:
        UsageError: No kind has that name (the message lists those there are).
    """
    kind = KINDS.get(format) or MADE_KINDS.get(format)
    if kind is None:
        raise UsageError(f"unknown source format {format!r}; choose one of {', '.join(FORMATS)}")
    return kind


def detect_source(source: str) -> str:
    """The format of ``source``, told from its shape: a table by its name or
    files (:func:`~shardkit.write.sources.table.detect_table`), else a file
    source, only where exactly one kind fits
    (:func:`~shardkit.write.sources.detect.detect_format`).

    Raises:
        SourceError: The path does not exist, or its shape fits no format or
            more than one (the message names those that would apply and ``--format``).
    """
    return detect_table(source) or detect_format(source)


def check_options(options: Any, format: str, source: str) -> None:
    """Refuse an option set (to other than its default) that the kind named
    ``format`` does not use: it would do nothing there.

    Args:
        options: A :class:`~shardkit.write.parallel.WriteOptions`.
        format: The source's kind.
        source: The source as given (named in the message).

    Raises:
        UsageError: Naming the option as the command line and the library
            spell it, the kinds it applies to, and this source's kind.
    """
    kind = source_kind(format)
    for option in dataclasses.fields(options):
        if option.name not in SOURCE_OPTIONS or option.name in kind.options:
            continue
        if _is_default(getattr(options, option.name), option.default):
            continue
        flag = WRITE_FLAGS.get(option.name)
        named = f"{flag} ({option.name})" if flag else option.name
        article = "an" if format[0] in "aeiouh" else "a"
        raise UsageError(
            f"{named} applies to {_kinds_taking(option.name)} sources only; {source} is {article} {format} source"
        )


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, tuple):
        return tuple(value) == default  # --field values come as a list
    return bool(value == default)


def _kinds_taking(option: str) -> str:
    """``"jsonl and table"``: the kinds that take ``option``, the table kinds
    named together when all of them do."""
    names = [name for name, kind in KINDS.items() if option in kind.options]
    if all(name in names for name in TABLE_KINDS):
        names = [name for name in names if name not in TABLE_KINDS] + ["table"]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def list_partitions(source: str, format: str, settings: SourceSettings) -> Listing:
    """The partitions of ``source`` in source order (see :class:`~shardkit.write.sources.base.Listing`).

    Raises:
        UsageError: Unknown format.
        SourceError: Nothing to read there (no class folders, no tar files, no rows...).
    """
    return source_kind(format).partitions(source, settings)


def scan_partition(
    part: Partition,
    prefix: str,
    *,
    seed: int,
    on_error: str,
    signature: dict,
    settings: SourceSettings,
    spec: Any = None,
) -> dict:
    """Scan one partition, writing its spill at ``prefix``; return its summary.

    Args:
        part: The partition.
        prefix: Path prefix of its spill files (see :func:`~shardkit.write.spill.spill_prefix`).
        seed: Shuffle seed (the records are sorted by the seeded key hash).
        on_error: ``"raise"`` to stop at the first unusable input,
            ``"skip"`` to leave it out and record it with the reason.
        signature: The partition's input signature, stored in the summary.
        settings: What the sources read of the write's options.
        spec: The source's :attr:`~shardkit.write.sources.base.Listing.spec`.

    Returns:
        ``num_samples``, ``num_bytes`` (planned tar bytes), ``skipped``
        (``[path, reason]`` pairs in scan order), ``extensions``,
        ``num_files``, ``read_path`` (the file the records' offsets point
        into), ``unpacked_bytes``, ``has_urls`` (table rows with fields to
        download) and ``signature``.

    Raises:
        SourceError: Malformed input or a refused name (under ``"raise"``),
            a compressed input that unpacks past its limit.
        DestinationError: The spill cannot be written (full, read-only).
    """
    collector = ScanCollector(SpillWriter(prefix, seed), on_error)
    read_path, unpacked = source_kind(part.kind).scan(part, collector, settings, spec)
    summary = {
        "signature": signature,
        "num_samples": len(collector.spill),
        "num_bytes": collector.num_bytes,
        "skipped": collector.skipped,
        "extensions": sorted(collector.extensions),
        "num_files": len(collector.files) + collector.num_distinct_files,
        "read_path": read_path,
        "unpacked_bytes": unpacked,
        "has_urls": collector.has_urls,
    }
    try:
        collector.spill.finish(summary)
    except OSError as exc:
        raise spill_error(exc, os.path.dirname(prefix), part.path) from exc
    return summary


def load_sample(part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
    """A scanned sample's ``(extension, bytes)`` members, read from its input
    (see :meth:`~shardkit.write.sources.base.SourceKind.load`).

    Raises:
        InputFileError: An input vanished, became unreadable, or changed
            since it was scanned (its size or, for JSONL, its line).
    """
    return source_kind(part.kind).load(part, read_path, key, name, rec, read_range)


def record_origin(part: Partition, read_path: str, name: str, offset: int) -> str:
    """Where a sample came from, for messages: its file, ``shard@byte`` for a
    tar input, ``table#row=N`` for a table row."""
    return source_kind(part.kind).origin(part, read_path, name, offset)


def duplicate_error(
    key: str, first: tuple[Partition, str, str, int], second: tuple[Partition, str, str, int]
) -> DuplicateSampleError:
    """The error for two samples with one key: ``(partition, read path, name, offset)`` each."""
    return source_kind(first[0].kind).duplicate_error(key, first, second)


__all__ = [
    "FORMATS",
    "KINDS",
    "MADE_KINDS",
    "SOURCE_OPTIONS",
    "Listing",
    "Partition",
    "ScanCollector",
    "SourceKind",
    "SourceSettings",
    "check_options",
    "detect_source",
    "duplicate_error",
    "list_partitions",
    "load_sample",
    "record_origin",
    "scan_partition",
    "source_kind",
]
