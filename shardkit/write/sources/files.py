"""Input files as the sources read them: walking a tree, sizing and reading a file.

Scanning walks folders once with :func:`walk_tree` and asks each file for its
size with one ``stat`` (from its directory entry, :func:`entry_size`); names
and keys are built from the folder being walked, not recomputed from full
paths. Writing reads a file with an open, one read and a close
(:func:`read_file`), knowing the size the scan found.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

from shardkit.errors import InputFileError, SourceError
from shardkit.format.brace import expand_patterns
from shardkit.format.location import path_under

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


def entry_size(entry: os.DirEntry) -> int:
    """:func:`file_size` of a directory entry met while walking (one ``stat``)."""
    try:
        st = entry.stat()
    except OSError as exc:
        raise _unreadable(entry.path, exc) from exc
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_file(entry.path)
    return st.st_size


class RowFileError(Exception):
    """Why the file a row names cannot be taken: its message starts with the
    field (``field 'jpg' refers to ...``), for the caller to put the row first."""


def row_file(ext: str, value: str, base: str, root: str) -> tuple[str, int]:
    """The file a row's field ``ext`` names by ``value`` (relative to
    ``base``), and its size; a JSONL row's and a table row's alike.

    The file must stay in ``root`` (``..`` and absolute paths resolved by
    name): a row naming any file could otherwise copy it into the shards.

    Raises:
        RowFileError: Outside ``root``, missing or not a regular file.
    """
    file = os.path.join(base, value)
    if not path_under(os.path.abspath(file), os.path.abspath(root)):  # ".." resolved by name
        raise RowFileError(
            f"field {ext!r} refers to {file}, outside {root}, the folder row paths must stay in (a row naming any "
            "file could copy it into the shards); pass --files-root with a folder that holds the files "
            "(files_root=...) to allow it"
        )
    try:
        return file, file_size(file)
    except SourceError as exc:
        detail = str(exc).removeprefix(f"{file}: ")  # the message names the file first
        raise RowFileError(f"field {ext!r} refers to {file}: {detail}") from exc


def _unreadable(path: str, exc: OSError) -> SourceError:
    return SourceError(f"{path}: cannot read input file ({exc.strerror or exc})", path=path)


def _not_a_file(path: str) -> SourceError:
    return SourceError(f"{path}: input is not a regular file", path=path)


def walk_files(root: str) -> Iterator[str]:
    """Regular files under ``root`` in sorted order, skipping hidden names."""
    for _, entries in walk_tree(root):
        for entry in entries:
            yield entry.path


def walk_tree(root: str, relative: str = "") -> Iterator[tuple[str, list[os.DirEntry]]]:
    """Each folder under ``root`` (itself first), as ``(path relative to
    root, its files)``: the files sorted by name, the folders in the order
    :func:`walk_files` lists their files, hidden names left out.

    What ``os.walk(root, followlinks=True)`` sees, with the directory entries
    kept: an entry's ``path`` is ``os.path.join(folder, name)`` and its
    ``stat()`` is one system call, not one per question asked of the file.
    ``relative`` is ``""`` for ``root``, else ``"sub/sub2"``. A folder that
    cannot be listed is left out, as ``os.walk`` leaves it out.
    """
    files, folders = [], []
    try:
        with os.scandir(root) as listing:
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                (folders if is_dir else files).append(entry)
    except OSError:
        return
    files.sort(key=_entry_name)
    yield relative, files
    del files
    folders.sort(key=_entry_name)
    for entry in folders:
        yield from walk_tree(entry.path, f"{relative}/{entry.name}" if relative else entry.name)


def _entry_name(entry: os.DirEntry) -> str:
    return entry.name


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


class OpenFiles:
    """Byte ranges of input files, each file opened once and kept open until
    :meth:`close` (a shard writer, or a map job, reads many samples of each)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``path`` at ``offset`` (fewer at its end).

        Raises:
            OSError: The file cannot be opened or read.
        """
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return os.pread(fd, length, offset)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


#: Most input files a brace pattern may name: a write lists its inputs
#: before it plans (LAION-2B-en is ~2.3 x 10^5 shards of 10^4 samples).
MAX_PATTERN_INPUTS = 10_000_000


def pattern_inputs(source: str) -> list[str]:
    """The files a brace pattern (or ``::``-joined patterns) names, in order.

    Raises:
        SourceError: It names more than :data:`MAX_PATTERN_INPUTS` (counted
            without listing them).
    """
    names = expand_patterns(source)
    if len(names) > MAX_PATTERN_INPUTS:
        raise SourceError(
            f"{source}: the pattern names {len(names):,} inputs, more than the {MAX_PATTERN_INPUTS:,} a write "
            "lists before it plans; check the pattern's ranges (one digit too many?), or write it in parts",
            path=source,
        )
    return list(names)
