"""JSONL sources: one JSON object per line, one sample per row.

``{"__key__": "a1", "jpg": "imgs/a1.jpg", "cls": 3, "json": {...}}``. A string
value is a file path (relative to the JSONL file, and confined to
``files_root``: by default the JSONL file's folder) except under a text
extension (``txt``, ``json``, ``cls``..., in any case, see
:data:`~shardkit.write.extensions.TEXT_EXTENSIONS`) where it is the value
itself. Numbers are stored as text, objects and lists as JSON. Partitions are
byte ranges of the file. The spill keeps where the line is and, for a row
whose values are all inline, those values (the shard writer then takes them
from there while the file is unchanged); for a row with file fields the
writer parses the line again.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from shardkit.errors import DuplicateSampleError, InputFileError, SourceError
from shardkit.format.codecs import encode_parsed_json, encode_value
from shardkit.format.tar import field_name, join_members, joined_members, member_name_problem, repeated_field, split_key
from shardkit.write.extensions import TEXT_EXTENSIONS
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
from shardkit.write.sources.files import MAX_OCTAL_SIZE, RowFileError, read_file, row_file
from shardkit.write.spill import short_digest

# A field as scanned: (extension, size, file path or None, inline bytes or None).
_Field = tuple[str, int, "str | None", "bytes | None"]


class JsonlKind(SourceKind):
    """A JSONL file, cut into byte ranges."""

    name = "jsonl"
    options = IMAGE_OPTIONS | {"files_root", "partition_bytes"}
    inline_values = True

    def partitions(self, source: str, settings: SourceSettings) -> Listing:
        size = os.path.getsize(source)
        bounds = list(range(0, size, settings.partition_bytes)) + [size]
        if len(bounds) == 1:
            bounds = [0, 0]
        root = os.path.abspath(settings.files_root) if settings.files_root else ""
        ranges = enumerate(zip(bounds, bounds[1:]))
        return Listing([Partition(i, self.name, source, start, end, root=root) for i, (start, end) in ranges])

    def scan(self, part: Partition, collector: ScanCollector, settings: SourceSettings, spec: Any) -> tuple[str, int]:
        _scan_jsonl(part, collector)
        return part.path, 0

    def load(self, part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
        return self.checked_size(part, read_path, key, name, rec, _load_jsonl_row(part, key, rec, read_range))

    def origin(self, part: Partition, read_path: str, name: str, offset: int) -> str:
        return part.path

    def duplicate_error(self, key: str, first: Sequence[Any], second: Sequence[Any]) -> DuplicateSampleError:
        """Two rows with one key, named by their line numbers."""
        path = first[0].path
        return duplicate_lines_error(path, key, line_number(path, first[3]), line_number(path, second[3]))

    def count_files(self, partitions: Sequence[Partition], summaries: Sequence[dict]) -> int:
        return super().count_files(partitions, summaries) + 1  # the JSONL file itself


def _scan_jsonl(part: Partition, scan: ScanCollector) -> None:
    path = part.path
    base = os.path.dirname(os.path.abspath(path))
    root = part.root or base  # row paths must stay in it (see files_root)
    lines = _LineNumbers(path, part.start)
    with open(path, "rb") as f:
        position = _first_line_start(f, part.start)
        number = 0  # lines read in this partition
        for line in f:
            if position >= part.end:
                break
            offset, position = position, position + len(line)
            number += 1
            common = _common_row(line)
            if common is not None:  # the hot path: plain key, inline values
                key, exts, name, size = common
                scan.add_sized(key, name, offset, len(line), exts, size, short_digest(line))
                continue
            if line.isspace():
                continue
            try:
                key, fields = _jsonl_fields(line, path, base, root, lambda: lines.number(number))
            except SourceError as exc:
                scan.skip_or_raise(exc, path)
                continue
            sizes = []
            inline = True
            for ext, size, file, _ in fields:
                sizes.append((ext, size))
                if file is not None:
                    scan.files.add(file)
                    inline = False
            name = pack_inline(fields) if inline else b""
            scan.add(key, name, offset, len(line), sizes, short_digest(line))


def _common_row(line: bytes) -> tuple[str, tuple[str, ...], bytes, int] | None:
    """The key, extensions, packed values (:func:`pack_inline`) and tar size
    of a row of the common kind, or None for any other: a row that is not one
    JSON object, has a key other than plain ``[A-Za-z0-9_-]`` path parts, a
    file field, a name too long for one ustar header or an extension that
    needs checking. :func:`_jsonl_fields` then parses it again, checks it and
    names what is wrong; for a common row it gives the same."""
    try:
        text = line.decode("utf-8")
        row, end = _SCAN_ONCE(text, 0)  # what JSONDecoder.decode does, less its whitespace steps
    except (UnicodeDecodeError, StopIteration, ValueError):
        return None
    if type(row) is not dict or (end != len(text) and not text[end:].isspace()):
        return None
    key = row.get("__key__")
    if type(key) is not str or not _PLAIN_KEY.fullmatch(key):
        return None
    exts, heads, values, size = [], [], [], 0
    for ext in sorted(row):
        head = _COMMON_EXTENSIONS.get(ext)
        if head is None:
            head = _common_extension(ext)
            if head is None:
                return None
        if not head:
            continue  # "__key__" and the like
        value = row[ext]
        if type(value) is str:
            if ext not in TEXT_EXTENSIONS:
                return None  # a file path
            data = value.encode("utf-8")
        else:
            data = encode_parsed_json(value)
        n = len(data)
        if len(key) + len(ext) >= 100 or n > MAX_OCTAL_SIZE:
            return None
        size += 512 + n + (-n % 512)
        exts.append(ext)
        heads.append(b"%s%d" % (head, n))
        values.append(data)
    if not exts:
        return None
    return key, tuple(exts), b"".join([b"\0".join(heads), b"\0\0", *values]), size


#: Extensions met in common rows: ``EXT\\0`` (ASCII, no problem), or ``b""``
#: for a ``__`` field the row does not store. Bounded: past
#: :data:`_MAX_COMMON_EXTENSIONS` new ones are checked each time.
_COMMON_EXTENSIONS: dict[str, bytes] = {}
_MAX_COMMON_EXTENSIONS = 4096


def _common_extension(ext: str) -> bytes | None:
    """What :data:`_COMMON_EXTENSIONS` holds for ``ext``, or None for an
    extension that is not ASCII or needs :func:`_jsonl_fields`' checks."""
    if ext.startswith("__"):
        head = b""
    elif ext.isascii() and ext == ext.lower() and _extension_problem(ext) is None:  # others: checked in full
        head = ext.encode("ascii") + b"\0"
    else:
        return None
    if len(_COMMON_EXTENSIONS) < _MAX_COMMON_EXTENSIONS:
        _COMMON_EXTENSIONS[ext] = head
    return head


def pack_inline(fields: list[_Field]) -> bytes:
    """A JSONL row's inline values as its spill name: the members joined
    (:func:`~shardkit.format.tar.join_members`)."""
    return join_members((ext.encode("utf-8"), data) for ext, _, _, data in fields)  # type: ignore[misc]


def unpack_inline(packed: bytes) -> list[tuple[str, bytes]]:
    """The ``(extension, bytes)`` members of :func:`pack_inline`'s output."""
    return joined_members(packed)


def duplicate_lines_error(path: str, key: str, first: int, second: int) -> DuplicateSampleError:
    return DuplicateSampleError(
        f"{path}: lines {first} and {second} both have __key__ {key!r}; give each row its own key",
        first=f"{path}:{first}",
        second=f"{path}:{second}",
    )


#: The byte order mark some editors (Notepad, Excel) put before UTF-8 text.
UTF8_BOM = b"\xef\xbb\xbf"


def _first_line_start(f: BinaryIO, start: int) -> int:
    """Seek ``f`` to the first line that begins at or after ``start``; return
    its offset. A UTF-8 byte order mark that opens the file is stepped over,
    as ``utf-8-sig`` and JSON readers do: it is no part of the first row."""
    if start == 0:
        f.seek(0)
        if f.read(len(UTF8_BOM)) == UTF8_BOM:
            return len(UTF8_BOM)
        f.seek(0)
        return 0
    f.seek(start - 1)
    if f.read(1) == b"\n":
        return start
    return start + len(f.readline())


class _LineNumbers:
    """Absolute line numbers of a partition's lines, counted from the file's
    start only when one is needed (for an error message)."""

    def __init__(self, path: str, start: int):
        self.path = path
        self.start = start
        self._base: int | None = None

    def number(self, nth: int) -> int:
        if self._base is None:
            self._base = line_number(self.path, _first_line_offset(self.path, self.start)) - 1
        return self._base + nth


def _first_line_offset(path: str, start: int) -> int:
    with open(path, "rb") as f:
        return _first_line_start(f, start)


def line_number(path: str, offset: int) -> int:
    """The number (from 1) of the line of ``path`` that begins at byte ``offset``."""
    count, done = 0, 0
    with open(path, "rb") as f:
        while done < offset:
            chunk = f.read(min(4 << 20, offset - done))
            if not chunk:
                break
            count += chunk.count(b"\n")
            done += len(chunk)
    return count + 1


def _jsonl_fields(line: bytes, path: str, base: str, root: str, number: Callable[[], int]) -> tuple[str, list[_Field]]:
    """A JSONL row's key and fields (sizes, and a path or inline bytes each);
    file paths are relative to ``base`` and must stay in ``root``;
    ``number()`` gives the line's number for an error message."""
    try:
        row = _JSON_DECODER.decode(line.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        n = number()
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise SourceError(f"{path}:{n}: line {n} is not valid JSON ({reason})", path=path, line=n) from exc
    if type(row) is not dict:
        n = number()
        raise SourceError(f"{path}:{n}: line {n} is not a JSON object", path=path, line=n)
    key = row.get("__key__")
    if type(key) is not str or not key:
        n = number()
        raise SourceError(f"{path}:{n}: line {n} has no string \"__key__\"", path=path, line=n)
    fields: list[_Field] = []
    key_ok = _stem_problem(key) is None
    for ext in sorted(row):
        if ext.startswith("__"):
            continue
        if not key_ok or _extension_problem(ext) is not None:
            n = number()
            raise SourceError(
                f"{path}:{n}: line {n}: key {key!r} with extension {ext!r} does not form a valid member name "
                f"({member_name_problem(f'{key}.{ext}') or 'the key may not have a dot in its last path part'})",
                path=path,
                line=n,
            )
        value = row[ext]
        if type(value) is str and ext.lower() not in TEXT_EXTENSIONS:
            try:
                file, size = row_file(ext, value, base, root)
            except RowFileError as exc:
                n = number()
                raise SourceError(f"{path}:{n}: line {n}: {exc}", path=path, line=n) from exc.__cause__
            fields.append((ext, size, file, None))
        else:
            data = encode_value(value)
            fields.append((ext, len(data), None, data))
    if not fields:
        n = number()
        raise SourceError(f"{path}:{n}: line {n} has no fields besides __key__", path=path, line=n)
    clash = repeated_field(ext for ext, *_ in fields)
    if clash is not None:
        n = number()
        raise SourceError(
            f"{path}:{n}: line {n}: fields {clash[0]!r} and {clash[1]!r} would both be read as field "
            f"{field_name(clash[1])!r} (readers lower-case extensions); rename one of them",
            path=path,
            line=n,
        )
    return key, fields


_JSON_DECODER = json.JSONDecoder()
_SCAN_ONCE = _JSON_DECODER.scan_once
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]+(?:/[A-Za-z0-9_\-]+)*")


def _stem_problem(key: str) -> str | None:
    """Why ``key`` cannot start member names (checked with a stand-in extension), or None."""
    if _PLAIN_KEY.fullmatch(key):
        return None  # no dot, no control character, no empty or leading path part: nothing to refuse
    name = f"{key}.x"
    if split_key(name) != (key, "x"):
        return "the key may not have a dot in its last path part"
    return member_name_problem(name)


@functools.lru_cache(maxsize=4096)
def _extension_problem(ext: str) -> str | None:
    """Why ``ext`` cannot end member names (checked with a stand-in key), or
    None. With a key that passes :func:`_stem_problem` (and so has no dot in
    its last path part) and an extension without ``/`` that passes this, the
    member name ``KEY.EXT`` passes both checks too."""
    name = f"k.{ext}"
    if "/" in ext or split_key(name) != ("k", ext):
        return "not a valid extension"
    return member_name_problem(name)

# ------------------------------------------------------------------ writing side


def _load_jsonl_row(part: Partition, key: str, rec: Any, read_range: ReadRange) -> Members:
    path = part.path
    try:
        line = read_range(path, rec.offset, rec.length)
    except OSError as exc:
        raise InputFileError(
            f"{path}: cannot read the JSONL file ({exc.strerror or exc}); "
            "restore it, or pass --on-error skip to leave its rows out",
            path=path,
        ) from exc
    if short_digest(line) != rec.digest.to_bytes(8, "little"):
        raise InputFileError(
            f"{path}: changed since it was scanned (the row of key {key!r} at byte {rec.offset} differs); "
            "rerun the write without --resume, or restore the file",
            path=path,
        )
    # The line is the one scanned (its digest matches), so it was checked then:
    # only its members are built here.
    row = _JSON_DECODER.decode(line.decode("utf-8"))
    members = []
    for ext in sorted(row):
        if ext.startswith("__"):
            continue
        value = row[ext]
        if type(value) is str and ext.lower() not in TEXT_EXTENSIONS:
            members.append((ext, read_file(os.path.join(_folder_of(path), value))))
        else:
            members.append((ext, encode_value(value)))
    return members


@functools.lru_cache(maxsize=64)
def _folder_of(path: str) -> str:
    """The folder JSONL rows' file paths are relative to (once per file, not per row)."""
    return os.path.dirname(os.path.abspath(path))
