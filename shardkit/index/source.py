"""What ``shardkit index SOURCE`` indexes: the shard files, their base location and their versions.

SOURCE is a folder (local, ``s3://``, or another fsspec URL ending in
``/``), a brace pattern, one shard, or a list of shards. A folder is walked
for tar shards (``.tar``, and the compressed ``.tar.gz``, ``.tgz``,
``.tar.zst``); every other file is ignored, which leaves out img2dataset's
``NNNNN.parquet`` and ``NNNNN_stats.json`` sidecars, offset indexes and
manifests. Hidden folders (``.git``, ``.cache``) are not entered.

The listing is columnar: shard names relative to the base are one numpy
bytes array, sizes and versions int64 arrays (a version is a local file's
``mtime_ns``, or a hash of an object's ETag; -1 when the listing does not
say, and the indexing worker finds out). Nothing here holds a Python object
per shard once the listing is built.

Given a folder to spill into (``shardkit index`` gives its temporary
folder), a folder's listing holds no column in memory at all: names are
sorted in runs of :data:`RUN_ROWS`, each written to a file, and the runs
merged into one file per column, which :class:`SpilledColumn` reads a range
at a time. The memory of listing a folder does not grow with its size.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from shardkit.errors import UsageError
from shardkit.format.brace import expand_patterns, is_pattern
from shardkit.format.compression import SHARD_SUFFIXES
from shardkit.io.base import SourceOptions
from shardkit.io.urls import is_local, local_path, redact_url, url_scheme

#: Shard file suffixes a folder listing takes (lower-cased names).
SHARD_FILE_SUFFIXES = (".tar", *SHARD_SUFFIXES)
#: Names gathered before they are packed into an array.
_BATCH = 8192
#: Rows sorted in memory at a time when a listing spills to files.
RUN_ROWS = 1 << 14
#: Rows each sorted run hands to the merge at a time.
_MERGE_BLOCK = 128
#: Runs merged at once.
_FAN_IN = 16


class SpilledColumn:
    """A column of a listing kept in a file: indexed like a numpy array
    (an int, a slice, an array of positions), it reads only the rows asked for.

    Args:
        path: The file: ``length`` values of ``dtype`` back to back.
    """

    def __init__(self, path: str, dtype: np.dtype, length: int):
        self.path = path
        self.dtype = np.dtype(dtype)
        self._length = length
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self._length

    def _read(self, start: int, stop: int) -> np.ndarray:
        size = (stop - start) * self.dtype.itemsize
        data = os.pread(self._fd, size, start * self.dtype.itemsize)
        assert len(data) == size, (self.path, len(data), size)
        return np.frombuffer(data, dtype=self.dtype)

    def __getitem__(self, key: int | slice | np.ndarray) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(self._length)
            assert step == 1
            return self._read(start, max(start, stop))
        if isinstance(key, np.ndarray):
            if len(key) == 0:
                return np.zeros(0, dtype=self.dtype)
            low, high = int(key.min()), int(key.max()) + 1
            return self._read(low, high)[key - low]
        i = int(key) + (self._length if int(key) < 0 else 0)
        if not 0 <= i < self._length:
            raise IndexError(f"row {key} of {self._length}")
        return self._read(i, i + 1)[0]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


Column = Union[np.ndarray, SpilledColumn]


@dataclass(frozen=True)
class ShardListing:
    """The shards of one SOURCE.

    Attributes:
        base: Their base location: an absolute folder or a URL prefix, no
            trailing ``/``.
        names: Paths relative to ``base``, UTF-8 (``S`` dtype), in dataset
            order (sorted for a folder; as given for a list or pattern).
        sizes: Bytes per shard (-1: unknown until read).
        versions: ``mtime_ns`` of a local file, a hash of a remote object's
            ETag, or -1 when unknown.
        left_out: ``(name, reason)`` of shards listed but not to be read:
            a pattern or list naming a missing file, a symlink in a folder
            that leads out of it (readers refuse it).
    """

    base: str
    names: Column
    sizes: Column
    versions: Column
    left_out: tuple[tuple[str, str], ...] = ()

    @property
    def num_shards(self) -> int:
        return len(self.names)

    @property
    def is_local(self) -> bool:
        return is_local(self.base)

    def name(self, i: int) -> str:
        return bytes(self.names[i]).decode("utf-8", "surrogateescape")

    def url(self, i: int) -> str:
        return join(self.base, self.name(i))

    def close(self) -> None:
        """Close the files of spilled columns (their folder is the caller's)."""
        for column in (self.names, self.sizes, self.versions):
            if isinstance(column, SpilledColumn):
                column.close()


def join(base: str, name: str) -> str:
    """``base`` + ``/`` + ``name`` (a path or URL)."""
    return base + "/" + name if not is_local(base) else os.path.join(base, name)


def is_shard_name(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(SHARD_FILE_SUFFIXES)


def etag_version(etag: str | None) -> int:
    """An int64 version from an object's ETag (-1 without one)."""
    if not etag:
        return -1
    return int.from_bytes(hashlib.sha256(etag.strip('"').encode()).digest()[:7], "little")


class _Gather:
    """Gathers (name, size, version) rows; every ``limit`` rows go to :meth:`_flush`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._batch: list[bytes] = []
        self._batch_numbers: list[int] = []

    def add(self, name: str, size: int, version: int) -> None:
        self._batch.append(name.encode("utf-8", "surrogateescape"))
        self._batch_numbers += (size, version)
        if len(self._batch) >= self._limit:
            self._flush()

    def _flush(self) -> None:
        raise NotImplementedError

    def _take(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows gathered since the last call: names, and (size, version) pairs."""
        names = np.array(self._batch, dtype=np.bytes_)
        numbers = np.array(self._batch_numbers, dtype=np.int64).reshape(-1, 2)
        self._batch, self._batch_numbers = [], []
        return names, numbers


class _Columns(_Gather):
    """Gathers rows into arrays in memory, a batch at a time."""

    def __init__(self) -> None:
        super().__init__(_BATCH)
        self._names: list[np.ndarray] = []
        self._numbers: list[np.ndarray] = []

    def _flush(self) -> None:
        if self._batch:
            names, numbers = self._take()
            self._names.append(names)
            self._numbers.append(numbers)

    def arrays(self, *, sort: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Names, sizes and versions (sorted by name when ``sort``); one
        column at a time is copied, so the peak stays near the result's size."""
        self._flush()
        if not self._names:
            return np.zeros(0, dtype="S1"), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        names = np.concatenate(self._names, dtype=f"S{max(a.dtype.itemsize for a in self._names)}")
        self._names = []
        order = np.argsort(names, kind="stable") if sort else slice(None)
        names = names[order]
        columns = []
        for column in (0, 1):
            columns.append(np.concatenate([a[:, column] for a in self._numbers])[order])
        self._numbers = []
        return names, columns[0], columns[1]


class _SortedSpill(_Gather):
    """Gathers rows into files under ``folder``, sorted by name: runs of
    :data:`RUN_ROWS` rows sorted in memory, then merged."""

    def __init__(self, folder: str) -> None:
        super().__init__(RUN_ROWS)
        self._folder = folder
        self._runs: list[tuple[str, str, int, int]] = []  # names file, numbers file, rows, name width

    def _flush(self) -> None:
        if not self._batch:
            return
        names, numbers = self._take()
        order = np.argsort(names, kind="stable")
        stem = os.path.join(self._folder, f"listing-run-{len(self._runs)}")
        names[order].tofile(stem + ".names")
        numbers[order].tofile(stem + ".numbers")
        self._runs.append((stem + ".names", stem + ".numbers", len(names), names.dtype.itemsize))

    def _rows(self, run: tuple[str, str, int, int]) -> Iterator[tuple[bytes, list[int]]]:
        names_file, numbers_file, rows, width = run
        names = SpilledColumn(names_file, np.dtype(f"S{width}"), rows)
        numbers = SpilledColumn(numbers_file, np.dtype(("<i8", 2)), rows)
        try:
            for start in range(0, rows, _MERGE_BLOCK):
                stop = min(rows, start + _MERGE_BLOCK)
                yield from zip(names[start:stop].tolist(), numbers[start:stop].tolist())
        finally:
            names.close()
            numbers.close()
            os.unlink(names_file)
            os.unlink(numbers_file)

    def _merge(self, runs: list[tuple[str, str, int, int]], stem: str) -> tuple[str, str, int, int]:
        """Merge sorted runs into one (``stem.names``, ``stem.numbers``); the runs' files go."""
        width = max(run[3] for run in runs)
        rows = 0
        with open(stem + ".names", "wb") as names, open(stem + ".numbers", "wb") as numbers:
            merged = heapq.merge(*(self._rows(run) for run in runs), key=lambda row: row[0])
            while block := list(itertools.islice(merged, _MERGE_BLOCK * 2)):
                np.array([name for name, _ in block], dtype=f"S{width}").tofile(names)
                np.array([number for _, number in block], dtype=np.int64).tofile(numbers)
                rows += len(block)
        return stem + ".names", stem + ".numbers", rows, width

    def columns(self) -> tuple[SpilledColumn, SpilledColumn, SpilledColumn]:
        """The sorted columns: names, sizes, versions. Runs are merged
        :data:`_FAN_IN` at a time (a pass more for each 16 times as many),
        so the merge holds a block of at most that many runs."""
        self._flush()
        runs, passes = self._runs, 0
        while len(runs) > 1:
            passes += 1
            runs = [
                self._merge(runs[i : i + _FAN_IN], os.path.join(self._folder, f"listing-merge-{passes}-{i}"))
                for i in range(0, len(runs), _FAN_IN)
            ]
        paths = [os.path.join(self._folder, f"listing.{column}") for column in ("names", "sizes", "versions")]
        rows, width = 0, 1
        if not runs:
            for path in paths:
                open(path, "wb").close()
        else:
            names_file, numbers_file, rows, width = runs[0]
            os.replace(names_file, paths[0])
            numbers = SpilledColumn(numbers_file, np.dtype(("<i8", 2)), rows)
            try:
                with open(paths[1], "wb") as sizes, open(paths[2], "wb") as versions:
                    for start in range(0, rows, _MERGE_BLOCK * 2):
                        block = numbers[start : min(rows, start + _MERGE_BLOCK * 2)]
                        block[:, 0].tofile(sizes)
                        block[:, 1].tofile(versions)
            finally:
                numbers.close()
                os.unlink(numbers_file)
        return (SpilledColumn(paths[0], np.dtype(f"S{width}"), rows),
                SpilledColumn(paths[1], np.dtype("<i8"), rows), SpilledColumn(paths[2], np.dtype("<i8"), rows))


def _sorted_columns(rows: Iterator[tuple[str, int, int]], spill: str | None) -> tuple[Column, Column, Column]:
    """Names, sizes and versions of ``rows``, sorted by name: in memory, or in files under ``spill``."""
    gather: _Columns | _SortedSpill = _Columns() if spill is None else _SortedSpill(spill)
    for name, size, version in rows:
        gather.add(name, size, version)
    return gather.arrays(sort=True) if isinstance(gather, _Columns) else gather.columns()


def _walk_local(root: str, skip: str | None, outside: list[tuple[str, str]]) -> Iterator[tuple[str, os.stat_result]]:
    """Shard files under ``root`` (relative path, stat), hidden folders and
    ``skip`` left out; symlinks leading out of ``root`` go to ``outside``."""
    real_root = os.path.realpath(root)
    stack = [""]
    while stack:
        relative = stack.pop()
        folder = os.path.join(root, relative) if relative else root
        with os.scandir(folder) as entries:
            for entry in entries:
                name = posixpath.join(relative, entry.name) if relative else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if not entry.name.startswith(".") and (skip is None or os.path.realpath(entry.path) != skip):
                        stack.append(name)
                elif is_shard_name(entry.name) and entry.is_file():
                    real = os.path.realpath(entry.path) if entry.is_symlink() else None
                    if real is not None and not real.startswith(real_root.rstrip(os.sep) + os.sep):
                        outside.append((name, f"a symlink to {real}, outside the folder (readers refuse it)"))
                        continue
                    yield name, entry.stat()


def _local_folder(path: str, skip: str | None, spill: str | None) -> ShardListing:
    base = os.path.abspath(path)
    outside: list[tuple[str, str]] = []
    rows = ((name, info.st_size, info.st_mtime_ns) for name, info in _walk_local(base, skip, outside))
    names, sizes, versions = _sorted_columns(rows, spill)
    return ShardListing(base, names, sizes, versions, tuple(outside))


def _remote_folder(url: str, options: SourceOptions, spill: str | None) -> ShardListing:
    base = url.rstrip("/")
    names, sizes, versions = _sorted_columns(_remote_rows(url, base, options), spill)
    return ShardListing(base, names, sizes, versions)


def _remote_rows(url: str, base: str, options: SourceOptions) -> Iterator[tuple[str, int, int]]:
    """(name, size, version) of the shards in a remote folder."""
    if url_scheme(url) == "s3":
        from shardkit.io.s3 import classify_s3_error, s3_client, split_s3_url

        bucket, prefix = split_s3_url(base + "/")
        pages = s3_client(options).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        try:
            for page in pages:
                for item in page.get("Contents", ()):
                    name = item["Key"][len(prefix) :]
                    if is_shard_name(name) and not any(p.startswith(".") for p in name.split("/")[:-1]):
                        yield name, int(item["Size"]), etag_version(item.get("ETag"))
        except Exception as exc:
            raise classify_s3_error(exc, redact_url(url), None) from exc
    elif url_scheme(url) in ("http", "https"):
        raise UsageError(
            f"{redact_url(url)}: an http(s) folder cannot be listed; name its shards with a brace pattern "
            "('https://host/data/{00000..00099}.tar') or list them"
        )
    else:
        from shardkit.io.fsspec import url_to_fs

        fs, root = url_to_fs(base)
        root = root.rstrip("/")
        for path, info in fs.find(root, detail=True).items():
            name = path[len(root) :].lstrip("/")
            if is_shard_name(name) and info.get("type", "file") == "file":
                yield name, int(info.get("size") or -1), etag_version(info.get("ETag") or info.get("etag"))


def _common_base(urls: Sequence[str]) -> str:
    """The deepest folder (or URL prefix) holding every one of ``urls``."""
    local = [is_local(u) for u in urls]
    if any(local) and not all(local):
        raise UsageError("SOURCE mixes local shards and URLs; index them separately")
    if all(local):
        return os.path.commonpath([os.path.dirname(os.path.abspath(local_path(u))) for u in urls])
    folders = [u.rsplit("/", 1)[0] for u in urls]
    common = folders[0]
    for folder in folders[1:]:
        while folder != common and not folder.startswith(common + "/"):
            if "/" not in common.split("://", 1)[-1]:
                raise UsageError(
                    f"SOURCE names shards on different hosts ({redact_url(folders[0])}, {redact_url(folder)}); "
                    "index each host's shards separately"
                )
            common = common.rsplit("/", 1)[0]
    return common


def _listed(urls: Sequence[str]) -> ShardListing:
    base = _common_base(urls)
    columns = _Columns()
    left_out = []
    for url in urls:
        if is_local(url):
            path = os.path.abspath(local_path(url))
            name = os.path.relpath(path, base).replace(os.sep, "/")
            try:
                info = os.stat(path)
            except FileNotFoundError:
                left_out.append((name, "listed in SOURCE but missing"))
                continue
            columns.add(name, info.st_size, info.st_mtime_ns)
        else:
            columns.add(url[len(base) + 1 :], -1, -1)
    names, sizes, versions = columns.arrays(sort=False)
    return ShardListing(base, names, sizes, versions, tuple(left_out))


def list_shards(
    source: str | Sequence[str],
    *,
    options: SourceOptions | None = None,
    skip: str | None = None,
    spill: str | None = None,
) -> ShardListing:
    """List the shards of SOURCE.

    Args:
        source: A folder (local path, or a URL ending in ``/``), a brace
            pattern, one shard, or a list of shards.
        options: How to reach remote storage.
        skip: A local folder not to walk into (the index's own ``--out``).
        spill: A folder for a folder listing's columns (None: in memory);
            close the listing before removing it.

    Raises:
        UsageError: Nothing to index, a missing folder, local shards mixed
            with URLs, an http(s) folder (it cannot be listed).
    """
    options = options or SourceOptions()
    if not isinstance(source, str):
        urls = [os.fspath(u) for u in source]
        if len(urls) == 1:
            return list_shards(urls[0], options=options, skip=skip, spill=spill)
        listing = _listed(urls)
    elif is_pattern(source):
        listing = _listed(list(expand_patterns(source)))
    elif is_local(source) and os.path.isdir(local_path(source)):
        listing = _local_folder(local_path(source), None if skip is None else os.path.realpath(skip), spill)
    elif is_local(source):
        if not os.path.exists(local_path(source)):
            raise UsageError(f"{source}: no such shard or folder; name a folder of shards, a brace pattern or shards")
        listing = _listed([source])
    elif source.endswith("/") or not is_shard_name(source.split("?", 1)[0]):
        listing = _remote_folder(source, options, spill)
    else:
        listing = _listed([source])
    if listing.num_shards == 0 and not listing.left_out:
        raise UsageError(
            f"{redact_url(source if isinstance(source, str) else listing.base)}: no tar shards found "
            f"(files ending in {', '.join(SHARD_FILE_SUFFIXES)}); name the folder that holds them"
        )
    return listing
