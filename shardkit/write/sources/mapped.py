"""The map stage's output as a source, and a path source's samples as the map's items.

:class:`SequenceKind` is a Python sequence given as the source, cut into
ranges of positions. :class:`MappedKind` is the kind of every partition the
map stage (:mod:`shardkit.write.mapping`) makes: each sample's members sit
joined (:func:`~shardkit.format.tar.join_members`) in the partition's stage
file, and a shard writer copies them from their byte range
(:meth:`MappedKind.joined`, :meth:`MappedKind.load`). A sample is named in
messages by the item it came from, which its spill record keeps as its name.

:class:`ScannedItems` hands a path source's samples (already scanned, see
:mod:`shardkit.write.sources`) to the user's ``map`` as the reader would see
them: ``{"__key__": key, EXT: bytes, ...}``, in source order.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shardkit.errors import InputFileError, ShardkitError
from shardkit.format.tar import field_name, joined_members
from shardkit.write.sources.base import (
    IMAGE_OPTIONS,
    Listing,
    Members,
    Partition,
    Reading,
    ReadRange,
    SourceKind,
    SourceSettings,
)
from shardkit.write.sources.files import OpenFiles
from shardkit.write.spill import Record

#: The partition kind of the map stage's output.
MAPPED = "mapped"
#: The kind (and the manifest's format) of a Python sequence given as the source.
SEQUENCE = "python"
#: What messages and skip records call a sequence source (``items#row=17``).
SEQUENCE_SOURCE = "items"

#: A sequence is cut into about this many partitions, each of at least
#: :data:`MIN_PARTITION_ITEMS` and at most :data:`MAX_PARTITION_ITEMS` items:
#: enough partitions to keep every worker busy to the end (3,000 photos make
#: 188 partitions), few enough that a partition's files and its round trip
#: cost nothing beside its items, and 2,442 summaries at 10**7 items.
TARGET_PARTITIONS = 256
MIN_PARTITION_ITEMS = 16
MAX_PARTITION_ITEMS = 4096


def items_per_partition(num_items: int) -> int:
    """Items in each partition (the last may hold fewer): a function of ``num_items`` only."""
    return max(MIN_PARTITION_ITEMS, min(MAX_PARTITION_ITEMS, -(-num_items // TARGET_PARTITIONS)))


def item_partitions(num_items: int, path: str) -> list[Partition]:
    """``num_items`` items (by position) cut into partitions of kind
    :data:`MAPPED`: ``start``/``end`` are the positions of each one's items."""
    step = items_per_partition(num_items)
    return [
        Partition(index, MAPPED, path, start, min(num_items, start + step))
        for index, start in enumerate(range(0, num_items, step))
    ]


class SequenceKind(SourceKind):
    """A Python sequence of items (``write_dataset(items, dest, map=fn)``):
    cut into ranges of positions, which the map stage runs ``fn`` over
    (:mod:`shardkit.write.mapping`); without ``fn`` the items are samples.
    Its partitions are :data:`MAPPED` from the start: there is nothing to
    scan, the map stage stages them."""

    name = SEQUENCE
    options = IMAGE_OPTIONS
    source_is_path = False

    def partitions(self, source: Any, settings: SourceSettings) -> Listing:
        return Listing(item_partitions(len(source), SEQUENCE_SOURCE))


class MappedKind(SourceKind):
    """Samples a user's ``map`` returned, staged by the map stage.

    Never detected nor listed: the map stage makes its partitions
    (``start``/``end``: the positions of their items), and its jobs stage
    them (:class:`~shardkit.write.mapping.MapJob`); the shard writers read
    them here.
    """

    name = MAPPED
    options = IMAGE_OPTIONS
    joined_in_stage = True

    def load(self, part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
        """The staged sample's members, read from its byte range of the stage.

        Raises:
            InputFileError: The stage cannot be read or is not what the map stage wrote.
        """
        try:
            members = joined_members(self.joined(part, read_path, name, rec, read_range))
        except ValueError as exc:
            raise InputFileError(
                f"{read_path}: the map stage's file is damaged at byte {rec.offset} ({exc}); rerun the write",
                path=read_path,
            ) from exc
        return self.checked_size(part, read_path, key, name, rec, members)

    def joined(self, part: Partition, read_path: str, name: str, rec: Any, read_range: ReadRange) -> bytes:
        """The staged sample's members joined (:func:`~shardkit.format.tar.join_members`), as staged."""
        try:
            data = read_range(read_path, rec.offset, rec.length)
        except OSError as exc:
            raise InputFileError(
                f"{read_path}: the map stage's file of {described(name)} cannot be read ({exc.strerror or exc}); "
                "rerun the write (with --resume the partition is mapped again)",
                path=read_path,
            ) from exc
        if len(data) != rec.length:
            raise InputFileError(
                f"{read_path}: the map stage's file ends at byte {rec.offset + len(data)}, before "
                f"{described(name)}'s sample; rerun the write (with --resume the partition is mapped again)",
                path=read_path,
            )
        return data

    def origin(self, part: Partition, read_path: str, name: str, offset: int) -> str:
        return described(name)

    def count_files(self, partitions: Any, summaries: Any) -> int:
        return 0


def described(where: str) -> str:
    """An item as messages name it (``where`` is what its spill record keeps):
    ``item 17`` for a sequence's ``items#row=17``, else its input as it is."""
    head, marker, row = where.rpartition("#row=")
    return f"item {row}" if marker and head == SEQUENCE_SOURCE else where


@dataclass(frozen=True)
class InputPart:
    """A partition of the scanned path source, as a map job reads its samples."""

    partition: Partition
    read_path: str
    kind: SourceKind


@dataclass(frozen=True)
class ScannedItems:
    """Some scanned samples of a path source, in source order, for the map stage.

    Attributes:
        parts: The scan's partitions these samples come from.
        rows: ``(index into parts, key, name, record values)`` per sample, in
            source order: what the scan spilled of it.
        ingest: For a table: how its rows' fields are fetched and prepared.
        row_errors: For a table: ``"raise"`` or ``"skip"`` for rows whose fields could not be fetched.
    """

    parts: tuple[InputPart, ...]
    rows: tuple[tuple[int, bytes, bytes, tuple], ...]
    ingest: Any = None
    row_errors: str = "skip"

    def entries(self, on_error: str) -> Iterator[tuple[str, Any, ShardkitError | None]]:
        """``(where, sample dict, None)`` per sample, read from its input as
        the reader would give it (``{"__key__": key, EXT: bytes}``);
        ``(where, None, error)`` for one left out under ``"skip"`` (under
        ``"raise"`` the error is raised)."""
        files = OpenFiles()
        reading = Reading(files.read_range, on_error, self.ingest, self.row_errors)
        try:
            for part_index, rows in itertools.groupby(self.rows, key=lambda row: row[0]):
                part = self.parts[part_index]
                decoded = [(key.decode("utf-8", "surrogateescape"), name, Record(*values)) for _, key, name, values in rows]
                found = part.kind.read_samples(part.partition, part.read_path, decoded, reading)
                for (key, _, _), (where, members, error) in zip(decoded, found):
                    if members is None:
                        yield where, None, error
                        continue
                    sample: dict[str, Any] = {"__key__": key}
                    for ext, data in members:
                        sample[field_name(ext)] = data
                    yield where, sample, None
        finally:
            files.close()

    def digest(self) -> str:
        """A hash of what the scan found of these samples (for ``--resume``):
        their inputs, keys and the scan's digests of their contents."""
        h = hashlib.blake2b(digest_size=16)
        for part in self.parts:
            h.update(repr((part.partition.to_dict(), part.read_path, part.kind.name)).encode("utf-8", "surrogateescape"))
        for part_index, key, name, values in self.rows:
            h.update(repr((part_index, key, name, values[Record._fields.index("digest")])).encode())
        return h.hexdigest()
