"""Reading a source dataset into a list of samples to write.

Scanning only looks at metadata (names and sizes; for tar inputs, headers):
member bytes are read later, by the process that writes the shard. Four
formats are understood, auto-detected by :func:`detect_format`:

``imagefolder``
    ``ROOT/CLASS/.../IMAGE.EXT`` (detected when every file is an image under
    a class folder): one sample per image with the image bytes as
    they are (``jpg``, ``png``...) and ``cls`` = index of the class folder in
    sorted order. Key: ``CLASS/REL/PATH`` without the extension (other dots
    become ``_`` so the key splits back correctly).
``directory``
    Any tree of files, grouped into samples by key = basename up to its first
    dot, wherever the files sit: ``imgs/a1.jpg`` + ``labels/a1.cls`` form
    sample ``a1``. Two files with the same key and extension are an error.
``jsonl``
    One JSON object per line: ``{"__key__": "a1", "jpg": "imgs/a1.jpg",
    "cls": 3, "json": {...}}``. A string value is a file path (relative to the
    JSONL file) except under a text extension (``txt``, ``json``, ``cls``...,
    see :data:`TEXT_EXTENSIONS`) where it is the value itself. Numbers are
    stored as text, objects and lists as JSON.
``tar``
    Existing shards (webdataset's or shardkit's): a ``.tar`` file, a brace
    pattern, or a directory of ``.tar`` files, to be resharded. Shards
    compressed whole (``.tar.gz``, ``.tgz``, ``.tar.zst``, recognised by
    their first bytes whatever their name) cannot be read by byte range: they
    are decompressed once while scanning, into a plain tar in ``unpack_dir``
    (see :func:`scan_source`), and read by byte range from there; memory does
    not grow with their size. Temporary space does: all the unpacked copies
    together may take at most ``max_unpack_bytes``
    (:data:`DEFAULT_MAX_UNPACK_BYTES`, 64 GiB), and never leave less than
    :data:`UNPACK_RESERVE_BYTES` (1 GiB, or a twentieth of a smaller file
    system) free where they are written; past either,
    scanning stops with a :class:`~shardkit.errors.SourceError` naming the
    input, the limit and what to do (nothing is written yet).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from braceexpand import braceexpand

from shardkit.errors import DuplicateSampleError, SourceError, UsageError
from shardkit.format.codecs import encode_value
from shardkit.format.compression import (
    SHARD_SUFFIXES,
    Compression,
    ChunkDecompressor,
    file_compression,
)
from shardkit.format.manifest import MANIFEST_NAME, SkippedInput
from shardkit.format.tar import RawSample, SampleParser, member_name_problem, split_key
from shardkit.io.atomic import remove_quietly
from shardkit.io.local import LocalFile
from shardkit.io.urls import is_local, redact_url

FORMATS = ("imagefolder", "directory", "jsonl", "tar")

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp", "gif"})

#: Extensions whose JSONL string values are content, not file paths.
TEXT_EXTENSIONS = frozenset({"txt", "text", "caption", "json", "cls", "id", "md", "html", "csv", "label"})

_TAR_SCAN_CHUNK = 4 << 20

#: Default of ``max_unpack_bytes``: most bytes the unpacked copies of input
#: shards compressed whole may take in the temporary folder, all together.
DEFAULT_MAX_UNPACK_BYTES = 64 << 30
#: Free space unpacking always leaves in the temporary folder, whatever
#: ``max_unpack_bytes`` says (it may be a RAM-backed ``/tmp``): this, or a
#: twentieth of the file system where that is less.
UNPACK_RESERVE_BYTES = 1 << 30
#: How often (in bytes unpacked) the folder's free space is looked at.
_FREE_SPACE_CHECK_BYTES = 64 << 20

#: File name endings of tar shards, plain or compressed whole.
TAR_SUFFIXES: tuple[str, ...] = (".tar", *SHARD_SUFFIXES)


@dataclass(frozen=True, slots=True)
class Field:
    """One member of a sample to write: a file on disk or bytes in hand."""

    ext: str
    size: int
    path: str | None = None
    data: bytes | None = None

    def __post_init__(self) -> None:
        # One string per extension, not one per sample: 10^7 samples hold
        # 10^7 fields, and a fresh "jpg" costs 52 bytes each.
        object.__setattr__(self, "ext", sys.intern(self.ext))


@dataclass(frozen=True, slots=True)
class InputSample:
    """One sample to write.

    Attributes:
        key: The sample key.
        fields: Members sorted by extension; their sizes are known up front.
        tar_range: For tar inputs, ``(path, start, end)`` of the sample's
            bytes in the input shard; the fields then carry sizes only.
        origin: Where it came from, for error messages: the input file (for
            JSONL rows the JSONL file, whose row the key names).
        tar_origin: When ``tar_range`` points into an unpacked copy of a
            compressed input shard, that input's path (what identifies the
            sample in the plan's fingerprint); None otherwise.
    """

    key: str
    fields: tuple[Field, ...]
    tar_range: tuple[str, int, int] | None = None
    origin: str = ""
    tar_origin: str | None = None


@dataclass
class ScannedSource:
    """What scanning found: samples in source order and what was left out."""

    format: str
    samples: list[InputSample]
    class_names: tuple[str, ...] | None = None
    skipped: list[SkippedInput] = field(default_factory=list)


def detect_format(source: str) -> str:
    """Guess a source's format from its shape (see the module docstring).

    Raises:
        SourceError: The path does not exist or nothing fits.
    """
    if "{" in source and "}" in source:
        return "tar"
    if not os.path.exists(source):
        raise SourceError(f"{source}: source does not exist", path=source)
    if os.path.isfile(source):
        if source.endswith(".jsonl"):
            return "jsonl"
        if source.endswith(TAR_SUFFIXES):
            return "tar"
        raise SourceError(
            f"{source}: cannot tell the format of this file (expected .jsonl, .tar, .tar.gz or .tar.zst); "
            "pass --format",
            path=source,
        )
    entries = [e for e in os.scandir(source) if not e.name.startswith(".")]
    if not entries:
        raise SourceError(f"{source}: source directory is empty", path=source)
    if any(e.name == MANIFEST_NAME for e in entries) or all(
        e.is_file() and e.name.endswith((*TAR_SUFFIXES, ".idx")) for e in entries
    ):
        return "tar"
    if all(e.is_dir() for e in entries) and all(
        os.path.basename(path).rpartition(".")[2].lower() in IMAGE_EXTENSIONS for path in _walk_files(source)
    ):
        return "imagefolder"
    return "directory"


def scan_source(
    source: str,
    *,
    format: str | None = None,
    on_error: str = "raise",
    unpack_dir: str | None = None,
    max_unpack_bytes: int | None = DEFAULT_MAX_UNPACK_BYTES,
) -> ScannedSource:
    """List the samples of ``source``.

    Args:
        source: Path to the input (see the module docstring for each format).
        format: One of :data:`FORMATS`, or None to detect it.
        on_error: ``"raise"`` to stop at the first unusable input,
            ``"skip"`` to leave it out and record it with the reason.
        unpack_dir: Where input shards compressed whole are decompressed
            to, one plain tar each, for the writers to read by byte range;
            it must outlive the write. Required when there are such inputs.
        max_unpack_bytes: Most bytes those copies may take, all together
            (None: no limit but the folder's free space, of which
            :data:`UNPACK_RESERVE_BYTES` is always left).

    Raises:
        UsageError: Unknown format or policy.
        SourceError: Missing or empty source, malformed input, duplicates,
            or compressed inputs that unpack past ``max_unpack_bytes`` or
            the folder's free space (whatever ``on_error`` says: it is not
            a fault of one input).
    """
    if on_error not in ("raise", "skip"):
        raise UsageError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not is_local(source):
        raise SourceError(
            f"{redact_url(source)}: `write` reads local sources only (a path or file:// URL); "
            "copy the data to a local or mounted folder first",
            path=redact_url(source),
        )
    if format is None:
        format = detect_format(source)
    if format not in FORMATS:
        raise UsageError(f"unknown source format {format!r}; choose one of {', '.join(FORMATS)}")
    if format != "tar" and not os.path.exists(source):
        raise SourceError(f"{source}: source does not exist", path=source)
    skipped: list[SkippedInput] = []

    def skip_or_raise(error: SourceError) -> None:
        if on_error == "raise":
            raise error
        skipped.append(SkippedInput(path=error.path or source, reason=str(error)))

    scanner: Callable[[str, Callable[[SourceError], None]], ScannedSource] = {
        "imagefolder": _scan_imagefolder,
        "directory": _scan_directory,
        "jsonl": _scan_jsonl,
        "tar": lambda src, skip: _scan_tars(src, skip, unpack_dir=unpack_dir, max_unpack_bytes=max_unpack_bytes),
    }[format]
    scanned = scanner(source, skip_or_raise)
    scanned.skipped = skipped + scanned.skipped
    if not scanned.samples:
        raise SourceError(f"{source}: no samples found (format {format})", path=source)
    return scanned


def _walk_files(root: str) -> Iterator[str]:
    """Regular files under ``root`` in sorted order, skipping hidden names."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield os.path.join(dirpath, name)


def _file_size(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read input file ({exc.strerror or exc})", path=path) from exc
    if not os.path.isfile(path):
        raise SourceError(f"{path}: input is not a regular file", path=path)
    return st.st_size


def _scan_imagefolder(root: str, skip_or_raise: Callable[[SourceError], None]) -> ScannedSource:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise SourceError(f"{root}: no class folders found for an ImageFolder source", path=root)
    samples = []
    seen: dict[str, str] = {}
    for label, name in enumerate(classes):
        label_field = Field("cls", len(str(label)), data=str(label).encode("ascii"))
        for path in _walk_files(os.path.join(root, name)):
            stem, dot, ext = os.path.basename(path).rpartition(".")
            if not dot or ext.lower() not in IMAGE_EXTENSIONS:
                continue  # not an image: ImageFolder ignores it too
            rel_dir = os.path.relpath(os.path.dirname(path), root)
            key = os.path.join(rel_dir, stem.replace(".", "_")).replace(os.sep, "/")
            if key in seen:
                raise DuplicateSampleError(
                    f"{seen[key]} and {path} both map to sample key {key!r}; rename one of them",
                    first=seen[key],
                    second=path,
                )
            try:
                size = _file_size(path)
            except SourceError as exc:
                skip_or_raise(exc)
                continue
            seen[key] = path
            samples.append(InputSample(key, (Field(ext.lower(), size, path=path), label_field), origin=path))
    return ScannedSource("imagefolder", samples, class_names=tuple(classes))


def _scan_directory(root: str, skip_or_raise: Callable[[SourceError], None]) -> ScannedSource:
    groups: dict[str, dict[str, Field]] = {}
    for path in _walk_files(root):
        parts = split_key(os.path.basename(path))
        if parts is None:
            skip_or_raise(SourceError(f"{path}: file name has no KEY.EXT form, so it fits no sample", path=path))
            continue
        problem = member_name_problem(os.path.basename(path))
        if problem is not None:
            skip_or_raise(SourceError(f"{path!r}: file name refused as a member name: {problem}", path=path))
            continue
        key, ext = parts
        fields = groups.setdefault(key, {})
        if ext in fields:
            raise DuplicateSampleError(
                f"{fields[ext].path} and {path} both map to sample {key!r} extension {ext!r}; "
                "rename one of them or write the folders separately",
                first=fields[ext].path or "",
                second=path,
            )
        try:
            fields[ext] = Field(ext, _file_size(path), path=path)
        except SourceError as exc:
            skip_or_raise(exc)
    samples = [
        InputSample(key, tuple(f for _, f in sorted(fields.items())), origin=next(iter(fields.values())).path or "")
        for key, fields in sorted(groups.items())
        if fields
    ]
    return ScannedSource("directory", samples)


def _scan_jsonl(path: str, skip_or_raise: Callable[[SourceError], None]) -> ScannedSource:
    base = os.path.dirname(os.path.abspath(path))
    samples = []
    seen: set[str] = set()  # a set, not key -> line: the first line is looked up only on a duplicate
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                sample = _jsonl_row(line, where=where, base=base, path=path, number=number)
            except DuplicateSampleError:
                raise
            except SourceError as exc:
                skip_or_raise(exc)
                continue
            if sample.key in seen:
                first = _first_line_with_key(path, sample.key)
                raise DuplicateSampleError(
                    f"{path}: lines {first} and {number} both have __key__ {sample.key!r}",
                    first=f"{path}:{first}",
                    second=where,
                )
            seen.add(sample.key)
            samples.append(sample)
    return ScannedSource("jsonl", samples)


def _first_line_with_key(path: str, key: str) -> int:
    """The number of the first line of a JSONL file whose ``__key__`` is ``key``."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and row.get("__key__") == key:
                return number
    raise AssertionError(f"{path}: key {key!r} was seen but is not found again")


def _jsonl_row(line: str, *, where: str, base: str, path: str, number: int) -> InputSample:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: line {number} is not valid JSON ({exc.msg})", path=path, line=number) from exc
    if not isinstance(row, dict):
        raise SourceError(f"{where}: line {number} is not a JSON object", path=path, line=number)
    key = row.get("__key__")
    if not isinstance(key, str) or not key:
        raise SourceError(f"{where}: line {number} has no string \"__key__\"", path=path, line=number)
    fields = []
    for ext in sorted(row):
        if ext.startswith("__"):
            continue
        if split_key(f"{key}.{ext}") != (key, ext) or member_name_problem(f"{key}.{ext}") is not None:
            raise SourceError(
                f"{where}: line {number}: key {key!r} with extension {ext!r} does not form a valid member name "
                f"({member_name_problem(f'{key}.{ext}') or 'the key may not have a dot in its last path part'})",
                path=path,
                line=number,
            )
        value = row[ext]
        if isinstance(value, str) and ext not in TEXT_EXTENSIONS:
            file = os.path.join(base, value)
            try:
                size = _file_size(file)
            except SourceError as exc:
                raise SourceError(
                    f"{where}: line {number}: field {ext!r} refers to {file}: {exc}", path=path, line=number
                ) from exc
            fields.append(Field(ext, size, path=file))
        else:
            data = encode_value(value)
            fields.append(Field(ext, len(data), data=data))
    if not fields:
        raise SourceError(f"{where}: line {number} has no fields besides __key__", path=path, line=number)
    # The origin is the JSONL file itself, one string shared by every row (the
    # key names the row): a "path:line" string per row would be ~100 bytes each.
    return InputSample(key, tuple(fields), origin=path)


def _tar_paths(source: str) -> list[str]:
    if "{" in source and "}" in source:
        return list(braceexpand(source))
    if os.path.isdir(source):
        return sorted(os.path.join(source, n) for n in os.listdir(source) if n.endswith(TAR_SUFFIXES))
    return [source]


def _scan_tars(
    source: str,
    skip_or_raise: Callable[[SourceError], None],
    *,
    unpack_dir: str | None = None,
    max_unpack_bytes: int | None = DEFAULT_MAX_UNPACK_BYTES,
) -> ScannedSource:
    paths = _tar_paths(source)
    budget = _UnpackBudget(max_unpack_bytes)
    if not paths:
        raise SourceError(f"{source}: no .tar files found", path=source)
    samples = []
    seen: dict[str, str] = {}
    for number, path in enumerate(paths):
        if not os.path.isfile(path):
            raise SourceError(f"{path}: input shard does not exist", path=path)
        kind = file_compression(path)
        parser = SampleParser(path=path, offset_name="uncompressed byte" if kind else "byte")
        chunks = LocalFile(path).iter_range(0, None, chunk_bytes=_TAR_SCAN_CHUNK)
        if kind is None:
            for raw in _parse_all(parser, chunks):
                _add_tar_sample(samples, skip_or_raise, raw, path, seen)
            continue
        if unpack_dir is None:
            raise UsageError(f"{path} is compressed ({kind}): scanning it needs an unpack_dir to decompress into")
        unpacked = os.path.join(unpack_dir, f"input-{number:06d}.tar")
        try:
            with open(unpacked, "wb") as out:
                copied = _copied(_decompressed(chunks, kind, path), out, budget.taker(path, unpack_dir))
                for raw in _parse_all(parser, copied):
                    _add_tar_sample(samples, skip_or_raise, raw, unpacked, seen, tar_origin=path)
        except BaseException:
            remove_quietly(unpacked)  # no partial copy left behind, whoever owns the folder
            raise
    return ScannedSource("tar", samples)


class _UnpackBudget:
    """The temporary space the unpacked copies of compressed inputs may
    take, all together: ``limit`` bytes (None: no limit), and never so much
    that less than :data:`UNPACK_RESERVE_BYTES` stays free in the folder."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.used = 0

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
            if self.limit is not None and self.used > self.limit:
                raise self._error(path, folder, f"more than max_unpack_bytes={self.limit} ({self.limit:,} bytes)")
            if self.used >= next_check:
                self._check_free(path, folder)
                next_check = self.used + _FREE_SPACE_CHECK_BYTES

        return take

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
            "Raise max_unpack_bytes (`shardkit write --max-unpack-bytes 200GB`), set TMPDIR to a folder with "
            "more room, or decompress the inputs first (plain .tar inputs are read where they are, with no copy). "
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


def _add_tar_sample(
    samples: list[InputSample],
    skip_or_raise: Callable[[SourceError], None],
    raw: RawSample,
    path: str,
    seen: dict[str, str],
    *,
    tar_origin: str | None = None,
) -> None:
    """Add a tar input's sample, unless a member name is one a shard must not
    carry (``..``, absolute, NUL or control characters): that sample is
    refused (``--on-error skip`` records it)."""
    for ext in raw.fields:
        name = f"{raw.key}.{ext}"
        problem = member_name_problem(name)
        if problem is not None:
            named = tar_origin or path
            skip_or_raise(
                SourceError(
                    f"{named}: member {name!r} at {'uncompressed ' if tar_origin else ''}byte {raw.start}: "
                    f"name refused ({problem}); rename it or rerun with --on-error skip",
                    path=named,
                )
            )
            return
    samples.append(_tar_sample(raw, path, seen, tar_origin=tar_origin))


def _tar_sample(raw: RawSample, path: str, seen: dict[str, str], *, tar_origin: str | None = None) -> InputSample:
    """A tar input's sample, read later from ``path`` by byte range
    (``tar_origin``: the compressed input that ``path`` unpacks)."""
    named = tar_origin or path
    if raw.key in seen:
        raise DuplicateSampleError(
            f"sample key {raw.key!r} appears in both {seen[raw.key]} and {named}",
            first=seen[raw.key],
            second=named,
        )
    seen[raw.key] = named
    fields = tuple(Field(ext, len(data)) for ext, data in sorted(raw.fields.items()))
    where = f"{named}@{raw.start}" + (" (uncompressed)" if tar_origin else "")
    return InputSample(raw.key, fields, tar_range=(path, raw.start, raw.end), origin=where, tar_origin=tar_origin)
