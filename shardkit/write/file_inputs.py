"""Files as inputs: an ImageFolder's images and a directory tree's files.

Scanning walks a partition's folders once with :func:`~shardkit.write.detect.walk_tree`
and asks each file for its size with one ``stat`` (from its directory entry);
names and keys are built from the folder being walked, not recomputed from
full paths. Writing reads a file with an open, one read and a close
(:func:`read_file`), knowing the size the scan found (see
:mod:`shardkit.write.inputs` for the formats).
"""

from __future__ import annotations

import os
import stat
from typing import Any

from shardkit.errors import DuplicateSampleError, InputFileError, SourceError
from shardkit.format.tar import encoded_sample_size, field_name, member_name_problem, split_key
from shardkit.write.detect import IMAGE_EXTENSIONS, walk_tree
from shardkit.write.partition import Partition
from shardkit.write.spill import short_digest

#: How names are encoded in the spill (file names that are not UTF-8 survive).
ENC = ("utf-8", "surrogateescape")

#: The largest size a ustar header's size field holds.
MAX_OCTAL_SIZE = 8**11 - 1


def file_size(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_file(path)
    return st.st_size


def _entry_size(entry: os.DirEntry) -> int:
    """:func:`file_size` of a directory entry met while walking (one ``stat``)."""
    try:
        st = entry.stat()
    except OSError as exc:
        raise _unreadable(entry.path, exc) from exc
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_file(entry.path)
    return st.st_size


def _unreadable(path: str, exc: OSError) -> SourceError:
    return SourceError(f"{path}: cannot read input file ({exc.strerror or exc})", path=path)


def _not_a_file(path: str) -> SourceError:
    return SourceError(f"{path}: input is not a regular file", path=path)


def scan_class_folder(part: Partition, scan: Any) -> None:
    """Scan one class folder of an ImageFolder into ``scan`` (an ``inputs._Scan``):
    one sample per image file, its label the partition's."""
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
                size = _entry_size(entry)
            except SourceError as exc:
                scan.skip_or_raise(exc, entry.path)
                continue
            key = f"{where}/{stem.replace('.', '_')}"
            name = f"{where}/{entry.name}".encode(*ENC)
            scan.num_distinct_files += 1
            if size <= MAX_OCTAL_SIZE and len(key) + len(ext) < 100 and key.isascii():  # one header per member
                tar_size = 512 + size + (-size % 512) + label_tar
            else:
                tar_size = encoded_sample_size(key, [(ext, size), ("cls", len(label))])
            scan.add_sized(key, name, 0, size, (ext, "cls"), tar_size, short_digest(name + b"\0%d" % size))


def load_class_file(part: Partition, name: str, size: int) -> list[tuple[str, bytes]]:
    """An ImageFolder sample's members: the image ``name`` (relative to the
    root; ``size`` bytes when scanned) and its label."""
    path = os.path.join(part.root, name)
    ext = name.rpartition(".")[2].lower()
    return [(ext, read_file(path, size)), ("cls", str(part.label).encode("ascii"))]


def scan_directory(part: Partition, scan: Any) -> None:
    """Scan a tree into ``scan``: its files grouped into samples by key (the
    name up to its first dot), wherever they sit."""
    root = part.path
    groups: dict[str, dict[str, tuple[str, int]]] = {}
    for folder, entries in walk_tree(root):
        for entry in entries:
            path = entry.path
            parts = split_key(entry.name)
            if parts is None:
                problem = "file name has no KEY.EXT form, so it fits no sample"
                scan.skip_or_raise(SourceError(f"{path}: {problem}", path=path), path)
                continue
            problem = member_name_problem(entry.name)
            if problem is not None:
                error = SourceError(f"{path!r}: file name refused as a member name: {problem}", path=path)
                scan.skip_or_raise(error, path)
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
                fields[ext] = (f"{folder}/{entry.name}" if folder else entry.name, _entry_size(entry))
            except SourceError as exc:
                scan.skip_or_raise(exc, path)
    for key, fields in sorted(groups.items()):
        if not fields:
            continue
        ordered = sorted(fields.items())
        name = "\0".join(rel for _, (rel, _) in ordered).encode(*ENC)
        sizes = [(ext, size) for ext, (_, size) in ordered]
        scan.num_distinct_files += len(ordered)
        scan.add(key, name, 0, sum(s for _, s in sizes), sizes, short_digest(name + repr(sizes).encode()))


def load_directory_files(part: Partition, name: str) -> list[tuple[str, bytes]]:
    """A tree sample's members: its files (``name``: their paths relative to
    the tree, ``\\0``-separated, in member order)."""
    fields = []
    for rel in name.split("\0"):
        parts = split_key(os.path.basename(rel))
        assert parts is not None  # the scan checked it
        fields.append((parts[1], read_file(os.path.join(part.path, rel))))
    return fields


def read_file(path: str, size: int | None = None) -> bytes:
    """The bytes of input file ``path``, read with an open, one read and a close.

    ``size`` is its size when scanned (None: the open file's). One read of a
    byte more than that returns the whole file while its size is unchanged;
    when it returns any other length (the file changed, or a read came back
    short) the file is read on to its end, for the caller's size check.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            if size is None:
                size = os.fstat(fd).st_size
            data = os.read(fd, size + 1)
            if len(data) != size:
                data = _read_rest(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise InputFileError(
            f"{path}: cannot read input file ({exc.strerror or exc}); "
            "restore it, or pass --on-error skip to leave it out",
            path=path,
        ) from exc
    return data


def _read_rest(fd: int, start: bytes) -> bytes:
    """``start`` and what follows it in open file ``fd``, to the end."""
    chunks = [start]
    while chunk := os.read(fd, max(len(start), 1 << 16)):
        chunks.append(chunk)
    return b"".join(chunks)
