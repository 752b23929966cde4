"""Directory sources: any tree of files, grouped into samples by name.

Files are grouped by key = basename up to its first dot, wherever they sit:
``imgs/a1.jpg`` + ``labels/a1.cls`` form sample ``a1``. Two files with the
same key and extension are an error. The tree is one partition (files of one
key may sit anywhere in it).
"""

from __future__ import annotations

import os
from typing import Any

from shardkit.errors import DuplicateSampleError, SourceError
from shardkit.format.tar import field_name, member_name_problem, split_key
from shardkit.write.sources.base import (
    IMAGE_OPTIONS,
    Listing,
    Members,
    Partition,
    ReadRange,
    ScanCollector,
    SourceKind,
    SourceSettings,
)
from shardkit.write.sources.files import ENC, entry_size, read_file, walk_tree
from shardkit.write.spill import short_digest


class DirectoryKind(SourceKind):
    """A tree of files, one sample per key."""

    name = "directory"
    options = IMAGE_OPTIONS

    def partitions(self, source: str, settings: SourceSettings) -> Listing:
        return Listing([Partition(0, self.name, source)])

    def scan(self, part: Partition, collector: ScanCollector, settings: SourceSettings, spec: Any) -> tuple[str, int]:
        """The tree's files grouped into samples by key (the name up to its
        first dot), wherever they sit."""
        root = part.path
        groups: dict[str, dict[str, tuple[str, int]]] = {}
        for folder, entries in walk_tree(root):
            for entry in entries:
                path = entry.path
                parts = split_key(entry.name)
                if parts is None:
                    problem = "file name has no KEY.EXT form, so it fits no sample"
                    collector.skip_or_raise(SourceError(f"{path}: {problem}", path=path), path)
                    continue
                problem = member_name_problem(entry.name)
                if problem is not None:
                    error = SourceError(f"{path!r}: file name refused as a member name: {problem}", path=path)
                    collector.skip_or_raise(error, path)
                    continue
                key, ext = parts
                fields = groups.setdefault(key, {})
                same = next((e for e in fields if field_name(e) == field_name(ext)), None)  # one field: a.TXT, a.txt
                if same is not None:
                    raise DuplicateSampleError(
                        f"{os.path.join(root, fields[same][0])} and {path} both map to sample {key!r} field "
                        f"{field_name(ext)!r}; rename one of them or write the folders separately",
                        first=os.path.join(root, fields[same][0]),
                        second=path,
                    )
                try:
                    fields[ext] = (f"{folder}/{entry.name}" if folder else entry.name, entry_size(entry))
                except SourceError as exc:
                    collector.skip_or_raise(exc, path)
        for key, fields in sorted(groups.items()):
            if not fields:
                continue
            ordered = sorted(fields.items())
            name = "\0".join(rel for _, (rel, _) in ordered).encode(*ENC)
            sizes = [(ext, size) for ext, (_, size) in ordered]
            collector.num_distinct_files += len(ordered)
            collector.add(key, name, 0, sum(s for _, s in sizes), sizes, short_digest(name + repr(sizes).encode()))
        return part.path, 0

    def load(self, part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
        """The sample's files (``name``: their paths relative to the tree,
        ``\\0``-separated, in member order)."""
        members = []
        for rel in name.split("\0"):
            parts = split_key(os.path.basename(rel))
            assert parts is not None  # the scan checked it
            members.append((parts[1], read_file(os.path.join(part.path, rel))))
        return self.checked_size(part, read_path, key, name, rec, members)

    def origin(self, part: Partition, read_path: str, name: str, offset: int) -> str:
        return os.path.join(part.path, name.split("\0")[0])
