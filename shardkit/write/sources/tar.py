"""Tar sources: existing shards (webdataset's or shardkit's), to be resharded.

The source is a ``.tar`` file, a brace pattern, or a folder of shards; one
partition per input shard, read back by byte range. Shards compressed whole
(``.tar.gz``, ``.tgz``, ``.tar.zst``, recognised by their first bytes whatever
their name) cannot be read by byte range: they are decompressed once while
scanning, into a plain tar in the unpack folder, and read by byte range from
there; memory does not grow with their size. Temporary space does: all the
unpacked copies together may take at most ``max_unpack_bytes``
(:data:`~shardkit.write.sources.base.DEFAULT_MAX_UNPACK_BYTES`, 64 GiB), and
never leave less than :data:`UNPACK_RESERVE_BYTES` (1 GiB, or a twentieth of a
smaller file system) free where they are written; past either, scanning stops
with a :class:`~shardkit.errors.SourceError` naming the input, the limit and
what to do (nothing is written yet).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from shardkit.errors import InputFileError, SourceError
from shardkit.format.brace import is_pattern
from shardkit.format.compression import SHARD_SUFFIXES, ChunkDecompressor, Compression, file_compression
from shardkit.format.tar import RawSample, SampleParser, member_name_problem
from shardkit.io.atomic import remove_quietly
from shardkit.io.local import LocalFile
from shardkit.write.sources.files import pattern_inputs
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
from shardkit.write.spill import short_digest

_TAR_SCAN_CHUNK = 4 << 20

#: File name endings of tar shards, plain or compressed whole.
TAR_SUFFIXES: tuple[str, ...] = (".tar", *SHARD_SUFFIXES)

#: Free space unpacking always leaves in the temporary folder, whatever
#: ``max_unpack_bytes`` says (it may be a RAM-backed ``/tmp``): this, or a
#: twentieth of the file system where that is less.
UNPACK_RESERVE_BYTES = 1 << 30
#: How often (in bytes unpacked) the folder's free space is looked at.
_FREE_SPACE_CHECK_BYTES = 64 << 20


class TarKind(SourceKind):
    """Input shards, one partition each."""

    name = "tar"
    options = IMAGE_OPTIONS | {"max_unpack_bytes"}
    source_is_path = False  # a brace pattern names the shards

    def partitions(self, source: str, settings: SourceSettings) -> Listing:
        paths = tar_paths(source)
        if not paths:
            raise SourceError(f"{source}: no .tar files found", path=source)
        return Listing([Partition(i, self.name, path) for i, path in enumerate(paths)])

    def scan(self, part: Partition, collector: ScanCollector, settings: SourceSettings, spec: Any) -> tuple[str, int]:
        """Scan one input shard; return the path its records point into and the bytes unpacked."""
        path = part.path
        if not os.path.isfile(path):
            raise SourceError(f"{path}: input shard does not exist", path=path)
        kind = file_compression(path)
        parser = SampleParser(path=path, offset_name="uncompressed byte" if kind else "byte")
        chunks = LocalFile(path).iter_range(0, None, chunk_bytes=_TAR_SCAN_CHUNK)
        if kind is None:
            for raw in _parse_all(parser, chunks):
                _add_tar_sample(collector, raw, path, compressed=False)
            collector.files.add(path)
            return path, 0
        unpack_dir = settings.unpack_dir
        if unpack_dir is None:
            raise SourceError(
                f"{path} is compressed ({kind}): scanning it needs an unpack_dir to decompress into", path=path
            )
        unpacked = os.path.join(unpack_dir, f"input-{part.index:06d}.tar")
        budget = UnpackBudget(settings.max_unpack_bytes)
        os.makedirs(unpack_dir, exist_ok=True)  # made by the first copy: a write without one makes no folder
        try:
            with open(unpacked, "wb") as out:
                copied = _copied(_decompressed(chunks, kind, path), out, budget.taker(path, unpack_dir))
                for raw in _parse_all(parser, copied):
                    _add_tar_sample(collector, raw, path, compressed=True)
        except BaseException:
            remove_quietly(unpacked)  # no partial copy left behind, whoever owns the folder
            raise
        collector.files.add(path)
        return unpacked, budget.used

    def load(self, part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
        """The sample parsed from its byte range of ``read_path``.

        Raises:
            InputFileError: The input shard cannot be read, or changed since it was scanned.
        """
        named = part.path  # an unpacked copy is named by its input
        offset = rec.offset
        parser = SampleParser(path=read_path, base_offset=offset)
        try:
            raws = parser.feed(read_range(read_path, offset, rec.length)) + parser.finish(expect_end_marker=False)
        except OSError as exc:
            raise InputFileError(
                f"{named}: cannot read input shard ({exc.strerror or exc}); "
                "restore it, or pass --on-error skip to leave its samples out",
                path=named,
            ) from exc
        except SourceError as exc:
            raise InputFileError(
                f"{named}: input shard changed since it was scanned ({exc}); rerun the write", path=named
            ) from exc
        if len(raws) != 1 or raws[0].key != key:
            raise InputFileError(
                f"{named}: input shard changed since it was scanned (at byte {offset}); rerun the write", path=named
            )
        return self.checked_size(part, read_path, key, name, rec, sorted(raws[0].fields.items()))

    def origin(self, part: Partition, read_path: str, name: str, offset: int) -> str:
        return f"{part.path}@{offset}" + (" (uncompressed)" if read_path != part.path else "")

    def unpacks(self, part: Partition) -> bool:
        """An input compressed whole is unpacked (False for one that cannot
        be opened: its scan names it)."""
        try:
            return file_compression(part.path) is not None
        except OSError:
            return False


def tar_paths(source: str) -> list[str]:
    """The input shards of a tar source: a brace pattern, a folder of shards, or one file."""
    if is_pattern(source):
        return pattern_inputs(source)
    if os.path.isdir(source):
        _refuse_removed(source)
        return sorted(os.path.join(source, n) for n in os.listdir(source) if n.endswith(TAR_SUFFIXES))
    return [source]


def _refuse_removed(folder: str) -> None:
    """Refuse a dataset folder some of whose samples were removed (``shardkit
    remove``): its tar files still hold them, and resharding the files would
    bring them back."""
    import json

    try:
        with open(os.path.join(folder, "manifest.json"), "rb") as f:
            removed = json.loads(f.read(1 << 20)).get("removed")
    except (OSError, ValueError, AttributeError):
        return  # no manifest here, or one the reader itself would refuse
    if isinstance(removed, dict) and removed.get("num_samples"):
        raise SourceError(
            f"{folder}: {removed['num_samples']} samples were removed from this dataset (`shardkit remove`) and are "
            "still in its tar files: resharding the files would bring them back. Write from the dataset itself "
            "instead: shardkit.write_dataset(shardkit.IndexedDataset(FOLDER), DEST)"
        )


def _add_tar_sample(collector: ScanCollector, raw: RawSample, path: str, *, compressed: bool) -> None:
    """Add a tar input's sample, unless a member name is one a shard must not
    carry (``..``, absolute, NUL or control characters): that sample is
    refused (``--on-error skip`` records it)."""
    for ext in raw.fields:
        name = f"{raw.key}.{ext}"
        problem = member_name_problem(name)
        if problem is not None:
            collector.skip_or_raise(
                SourceError(
                    f"{path}: member {name!r} at {'uncompressed ' if compressed else ''}byte {raw.start}: "
                    f"name refused ({problem}); rename it or rerun with --on-error skip",
                    path=path,
                ),
                path,
            )
            return
    sizes = [(ext, len(data)) for ext, data in sorted(raw.fields.items())]
    digest = short_digest(f"{raw.key}\0{raw.start}\0{raw.end}\0{sizes}".encode("utf-8", "surrogateescape"))
    collector.add(raw.key, b"", raw.start, raw.end - raw.start, sizes, digest)


class UnpackBudget:
    """The temporary space the unpacked copies of compressed inputs may
    take, all together: ``limit`` bytes (None: no limit), and never so much
    that less than :data:`UNPACK_RESERVE_BYTES` stays free in the folder.
    ``used``: bytes the copies before this one took."""

    def __init__(self, limit: int | None, used: int = 0):
        self.limit = limit
        self.used = used

    def taker(self, path: str, folder: str) -> Callable[[int], None]:
        """The function that counts ``n`` more bytes of input ``path``'s copy in ``folder``.

        Raises (from the function):
            SourceError: Over the limit, or the folder nearly full.
        """
        self._check_free(path, folder)
        next_check = self.used + _FREE_SPACE_CHECK_BYTES

        def take(n: int) -> None:
            nonlocal next_check
            self.used += n
            self.check(path, folder)
            if self.used >= next_check:
                self._check_free(path, folder)
                next_check = self.used + _FREE_SPACE_CHECK_BYTES

        return take

    def check(self, path: str, folder: str) -> None:
        """Raise the error naming ``path`` when the copies so far are over the limit."""
        if self.limit is not None and self.used > self.limit:
            raise self._error(path, folder, f"more than max_unpack_bytes={self.limit} ({self.limit:,} bytes)")

    def _check_free(self, path: str, folder: str) -> None:
        usage = shutil.disk_usage(folder)
        reserve = min(UNPACK_RESERVE_BYTES, usage.total // 20)
        if usage.free < reserve:
            raise self._error(
                path, folder, f"nearly all the space there: {usage.free:,} bytes are free, {reserve:,} must stay so"
            )

    def _error(self, path: str, folder: str, over: str) -> SourceError:
        return SourceError(
            f"{path}: this input is compressed whole, so it is unpacked to a temporary plain tar to be read by "
            f"byte range; with it the unpacked inputs take {self.used:,} bytes so far in {folder}, {over}. "
            "Raise max_unpack_bytes (`shardkit write --max-unpack-bytes 200GB`), write to a DEST with more room, "
            "or decompress the inputs first (plain .tar inputs are read where they are, with no copy). "
            "Nothing was written.",
            path=path,
        )


def _parse_all(parser: SampleParser, chunks: Iterator[bytes]) -> Iterator[RawSample]:
    """Every sample of a tar stream, up to its end-of-archive marker."""
    for chunk in chunks:
        yield from parser.feed(chunk)
        if parser.ended:
            break
    yield from parser.finish()


def _copied(chunks: Iterator[bytes], out: BinaryIO, take: Callable[[int], None]) -> Iterator[bytes]:
    """Pass ``chunks`` on, writing each to ``out`` first once ``take`` (which
    may refuse) has counted it."""
    for chunk in chunks:
        take(len(chunk))
        out.write(chunk)
        yield chunk


def _decompressed(chunks: Iterator[bytes], kind: Compression, path: str) -> Iterator[bytes]:
    """Decompress a compressed shard's chunks; a truncated or corrupt one is
    a :class:`~shardkit.errors.CorruptShardError` naming the compressed offset."""
    stream = ChunkDecompressor(kind, path=path)
    for chunk in chunks:
        yield from stream.pieces(chunk)  # bounded pieces, whatever the ratio
    stream.finish()
