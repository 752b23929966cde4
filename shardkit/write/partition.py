"""Cutting a source into partitions that workers scan independently.

A partition is a small, picklable description of one slice of the input:

``jsonl``
    A byte range ``[start, end)`` of a JSONL file; it owns the lines that
    *begin* inside it, so ranges cut anywhere still give every line once.
    Ranges are :attr:`PARTITION_BYTES` long (64 MiB by default).
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
    A part of a table (see :mod:`shardkit.write.table_source`): Parquet row
    groups ``[start, end)``, a CSV/TSV byte range, or one Arrow file of a
    ``datasets`` folder; ``root`` is the table source as given.

Listing partitions reads directory entries and file sizes only; the driver
holds one :class:`Partition` per partition, never one object per sample.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from shardkit.errors import SourceError
from shardkit.format.brace import expand_patterns, is_pattern
from shardkit.write.detect import TAR_SUFFIXES

#: Default length of a JSONL partition (bytes of the file).
PARTITION_BYTES = 64 << 20

#: Partition kinds (and source formats) of tables: Parquet, CSV, TSV and
#: ``datasets`` save_to_disk folders (``hf``).
TABLE_KINDS = ("parquet", "csv", "tsv", "hf")


@dataclass(frozen=True)
class Partition:
    """One slice of the input, scanned by one worker.

    Attributes:
        index: Position in source order.
        kind: ``"jsonl"``, ``"tar"``, ``"imagefolder"``, ``"directory"``, or
            one of :data:`TABLE_KINDS`.
        path: The JSONL file, the input shard, the class folder or the tree.
        start: First byte of a JSONL range (0 otherwise).
        end: End of a JSONL range (0 otherwise).
        root: For an ImageFolder, its root (keys are relative to it); for
            a JSONL range, the folder its rows' file paths must stay in
            (``""``: the JSONL file's).
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


def list_partitions(
    source: str, format: str, *, partition_bytes: int = PARTITION_BYTES, files_root: str | None = None
) -> tuple[list[Partition], tuple[str, ...] | None]:
    """The partitions of ``source`` in source order, and the class names of an ImageFolder.

    ``files_root``: the folder a JSONL's rows may name files in (None: the JSONL file's).

    Raises:
        SourceError: No class folders, or no tar files.
    """
    if format == "jsonl":
        size = os.path.getsize(source)
        bounds = list(range(0, size, partition_bytes)) + [size]
        if len(bounds) == 1:
            bounds = [0, 0]
        root = os.path.abspath(files_root) if files_root else ""
        ranges = enumerate(zip(bounds, bounds[1:]))
        return [Partition(i, "jsonl", source, start, end, root=root) for i, (start, end) in ranges], None
    if format == "tar":
        paths = tar_paths(source)
        if not paths:
            raise SourceError(f"{source}: no .tar files found", path=source)
        return [Partition(i, "tar", path) for i, path in enumerate(paths)], None
    if format == "imagefolder":
        classes = sorted(e.name for e in os.scandir(source) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise SourceError(f"{source}: no class folders found for an ImageFolder source", path=source)
        parts = [
            Partition(i, "imagefolder", os.path.join(source, name), root=source, label=i) for i, name in enumerate(classes)
        ]
        return parts, tuple(classes)
    return [Partition(0, "directory", source)], None


def tar_paths(source: str) -> list[str]:
    """The input shards of a tar source: a brace pattern, a folder of shards, or one file."""
    if is_pattern(source):
        return list(expand_patterns(source))
    if os.path.isdir(source):
        return sorted(os.path.join(source, n) for n in os.listdir(source) if n.endswith(TAR_SUFFIXES))
    return [source]
