"""ImageFolder sources: ``ROOT/CLASS/.../IMAGE.EXT``, one sample per image.

Detected when every file is an image under a class folder. Each sample holds
the image bytes as they are (``jpg``, ``png``...) and ``cls``, the index of
its class folder in sorted order. Key: ``CLASS/REL/PATH`` without the
extension (other dots become ``_`` so the key splits back correctly). One
partition per class folder.
"""

from __future__ import annotations

import os
from typing import Any

from shardkit.errors import SourceError
from shardkit.format.tar import encoded_sample_size
from shardkit.write.extensions import IMAGE_EXTENSIONS
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
from shardkit.write.sources.files import ENC, MAX_OCTAL_SIZE, entry_size, read_file, walk_tree
from shardkit.write.spill import short_digest

class ImageFolderKind(SourceKind):
    """An ImageFolder tree, labelled by class folder."""

    name = "imagefolder"
    options = IMAGE_OPTIONS

    def partitions(self, source: str, settings: SourceSettings) -> Listing:
        classes = sorted(e.name for e in os.scandir(source) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise SourceError(f"{source}: no class folders found for an ImageFolder source", path=source)
        parts = [
            Partition(i, self.name, os.path.join(source, name), root=source, label=i) for i, name in enumerate(classes)
        ]
        return Listing(parts, tuple(classes))

    def scan(self, part: Partition, collector: ScanCollector, settings: SourceSettings, spec: Any) -> tuple[str, int]:
        """One sample per image file of the class folder, its label the partition's."""
        label = str(part.label).encode("ascii")
        label_tar = 512 + len(label) + (-len(label) % 512)  # its "cls" member in a shard
        # Names relative to the ImageFolder's root: the class folder's, then the
        # folders under it; each file's entry comes from the walk (one stat each).
        top = os.path.relpath(part.path, part.root).replace(os.sep, "/")
        for folder, entries in walk_tree(part.path):
            where = f"{top}/{folder}" if folder else top
            for entry in entries:
                stem, dot, ext = entry.name.rpartition(".")
                if not dot:
                    continue
                ext = ext.lower()
                if ext not in IMAGE_EXTENSIONS:
                    continue  # not an image: ImageFolder ignores it too
                try:
                    size = entry_size(entry)
                except SourceError as exc:
                    collector.skip_or_raise(exc, entry.path)
                    continue
                key = f"{where}/{stem.replace('.', '_')}"
                name = f"{where}/{entry.name}".encode(*ENC)
                collector.num_distinct_files += 1
                if size <= MAX_OCTAL_SIZE and len(key) + len(ext) < 100 and key.isascii():  # one header per member
                    tar_size = 512 + size + (-size % 512) + label_tar
                else:
                    tar_size = encoded_sample_size(key, [(ext, size), ("cls", len(label))])
                collector.add_sized(key, name, 0, size, (ext, "cls"), tar_size, short_digest(name + b"\0%d" % size))
        return part.path, 0

    def load(self, part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
        """The image ``name`` (relative to the root; ``rec.length`` bytes when
        scanned) and its label."""
        ext = name.rpartition(".")[2].lower()
        image = read_file(os.path.join(part.root, name), rec.length)
        members = [(ext, image), ("cls", str(part.label).encode("ascii"))]
        if len(image) == rec.length:
            return members  # the sizes the scan planned with (the label is the partition's)
        return self.checked_size(part, read_path, key, name, rec, members)

    def origin(self, part: Partition, read_path: str, name: str, offset: int) -> str:
        return os.path.join(part.root, name)
