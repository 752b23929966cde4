"""Which table column becomes which sample field (``--field EXT=COLUMN``, ``--key COLUMN``).

A :class:`FieldMap` is parsed from ``EXT=COLUMN`` specs, checked against a
table's columns before anything is read (:meth:`FieldMap.resolve`), and
then turns each row into a :class:`RowSample` (:meth:`FieldMap.sample`):

* ``--field jpg=URL`` stores column ``URL`` as the sample's ``jpg``; repeat
  it for more fields. ``--field json=*`` stores the columns no other field
  and not the key use, as one JSON object (``*`` works for ``json`` only).
* Without ``--field``, a column named after a known extension
  (:data:`KNOWN_EXTENSIONS`: ``jpg``, ``txt``, ``json``, ``cls``...) maps to
  itself, as the keys of JSONL rows do, and a ``__key__`` column gives keys.
* ``--key COLUMN`` takes keys from a column (they must be unique, and valid
  member names); otherwise a key is the row's position in the table,
  zero-padded to 9 digits (``000000042``), stable however the table is
  partitioned.

Values become fields like this: bytes are stored as they are, and so is
the ``bytes`` of a ``datasets`` image struct (``{"bytes": ..., "path":
...}``); a string under a text extension (``TEXT_EXTENSIONS`` of
:mod:`shardkit.write.extensions`, as for JSONL rows) is text;
a string under any other extension is a URL to fetch (``http(s)://`` or
``s3://``), a :class:`UrlField`, or, with no ``scheme://``, a local file's
path, which the table's scan turns into a :class:`FileField` (resolved and
confined as a JSONL row's path is); numbers become text, lists and dicts JSON. A
None in a text column leaves the field out; a None or an empty string
where a URL or bytes belong leaves a :class:`UrlField` with an empty URL,
which the downloader records as ``bad_url``.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import SourceError, UsageError
from shardkit.format.codecs import encode_value
from shardkit.format.tar import field_name, member_name_problem, split_key
from shardkit.write.extensions import IMAGE_EXTENSIONS, TEXT_EXTENSIONS  # text, not URLs, as in JSONL rows

#: Column names that map to themselves when no ``--field`` is given.
KNOWN_EXTENSIONS = IMAGE_EXTENSIONS | TEXT_EXTENSIONS | {"npy", "mp4", "webm", "mkv", "wav", "flac", "mp3", "ogg"}

#: The column giving keys when none is named and the table has one.
KEY_COLUMN = "__key__"

#: The field spec that gathers the unmapped columns.
REST = "*"


@dataclass(frozen=True, slots=True)
class UrlField:
    """A field whose bytes are to be fetched from ``url`` (may be empty or not a URL:
    the downloader records that as ``bad_url``)."""

    url: str


@dataclass(frozen=True, slots=True)
class FileField:
    """A field whose bytes are a local file's: ``path`` (made absolute and
    checked to stay in the files root when the row was scanned), ``size``
    bytes then. A table's string that is not a URL (no ``scheme://``) names
    one, as a JSONL row's string does."""

    path: str
    size: int


@dataclass(frozen=True, slots=True)
class RowSample:
    """One row, mapped to sample fields.

    Attributes:
        key: The sample key.
        position: The row's position in the table.
        fields: ``(ext, value)`` sorted by ext: bytes to store, a
            :class:`UrlField` to fetch, or a :class:`FileField` to read.
        record: For ``json=*``: the remaining columns (JSON-ready), to be
            stored as ``json`` once the download facts are added; else None.
    """

    key: str
    position: int
    fields: tuple[tuple[str, bytes | UrlField | FileField], ...]
    record: dict[str, Any] | None = None

    @property
    def urls(self) -> tuple[tuple[str, str], ...]:
        return tuple((ext, value.url) for ext, value in self.fields if isinstance(value, UrlField))


@dataclass(frozen=True)
class FieldMap:
    """Columns to fields, and where keys come from.

    Attributes:
        fields: ``(ext, column)`` pairs, sorted by ext; ``column`` is
            :data:`REST` for ``json=*``.
        key_column: The key column, or None for row positions.
    """

    fields: tuple[tuple[str, str], ...] = ()
    key_column: str | None = None

    @classmethod
    def parse(cls, specs: Sequence[str], *, key_column: str | None = None) -> FieldMap:
        """From ``EXT=COLUMN`` strings (``--field``, repeatable).

        Raises:
            UsageError: A spec without ``=``, an extension given twice, an
                extension that cannot end a member name, or ``*`` for another
                extension than ``json``.
        """
        pairs: dict[str, str] = {}
        for spec in specs:
            ext, eq, column = spec.partition("=")
            ext, column = ext.strip(), column.strip()
            if not eq or not ext or not column:
                raise UsageError(f"--field {spec!r}: write EXT=COLUMN, e.g. --field jpg=URL or --field json=*")
            same = next((e for e in pairs if field_name(e) == field_name(ext)), None)  # read as one field
            if same is not None:
                raise UsageError(f"--field: extension {ext!r} is given twice ({pairs[same]!r} and {column!r})")
            if split_key(f"k.{ext}") != ("k", ext) or member_name_problem(f"k.{ext}") is not None or "/" in ext:
                raise UsageError(f"--field {spec!r}: {ext!r} cannot be a member's extension")
            if column == REST and ext != "json":
                raise UsageError(f"--field {spec!r}: '*' (the remaining columns as JSON) only goes with json=*")
            pairs[ext] = column
        return cls(tuple(sorted(pairs.items())), key_column)

    def resolve(self, columns: Sequence[str], *, source: str) -> FieldMap:
        """This map checked against a table's columns, the default filled in.

        Raises:
            SourceError: A mapped or key column does not exist (names it and
                the columns that do), or nothing maps to a field.
        """
        present = set(columns)
        listing = ", ".join(columns)
        for ext, column in self.fields:
            if column != REST and column not in present:
                raise SourceError(
                    f"{source}: --field {ext}={column}: no column {column!r}; the columns are: {listing}", path=source
                )
        key_column = self.key_column
        if key_column is not None and key_column not in present:
            raise SourceError(f"{source}: --key {key_column}: no such column; the columns are: {listing}", path=source)
        fields = self.fields
        if not fields:
            fields = tuple(sorted((c, c) for c in columns if c in KNOWN_EXTENSIONS and c != key_column))
            if key_column is None and KEY_COLUMN in present:
                key_column = KEY_COLUMN
        if not fields:
            raise SourceError(
                f"{source}: no column is named after a field extension ({listing}); map them with "
                "--field EXT=COLUMN, e.g. --field jpg=URL --field txt=TEXT --field json=*",
                path=source,
            )
        return FieldMap(fields, key_column)

    def columns_read(self, columns: Sequence[str]) -> tuple[str, ...]:
        """The table columns a resolved map reads, in table order."""
        if any(column == REST for _, column in self.fields):
            return tuple(columns)
        used = {column for _, column in self.fields} | ({self.key_column} if self.key_column else set())
        return tuple(c for c in columns if c in used)

    def sample(self, position: int, row: dict[str, Any], *, source: str) -> RowSample:
        """One row (as :func:`~shardkit.write.sources.table_reader.read_rows` gives it) as a sample.

        Raises:
            SourceError: The key column's value is missing or cannot be a key.
        """
        if self.key_column is not None:
            value = row.get(self.key_column)
            key = value if isinstance(value, str) else ("" if value is None else str(value))
            problem = _key_problem(key)
            if problem:
                raise SourceError(f"{source}: row {position}: key {key!r} from column {self.key_column!r} {problem}",
                                  path=source)
        else:
            key = f"{position:09d}"
        fields: list[tuple[str, bytes | UrlField]] = []
        record = None
        mapped = {column for _, column in self.fields} | {self.key_column}
        for ext, column in self.fields:
            if column == REST:
                record = {name: _json_ready(value) for name, value in row.items() if name not in mapped}
                continue
            value = _field_value(ext, row.get(column))
            if value is not None:
                fields.append((ext, value))
        return RowSample(key, position, tuple(fields), record)


def _key_problem(key: str) -> str | None:
    if not key:
        return "is empty"
    name = f"{key}.ext"
    if split_key(name) != (key, "ext"):
        return "may not hold a dot in its last path part"
    return member_name_problem(name)


def _field_value(ext: str, value: Any) -> bytes | UrlField | None:
    if isinstance(value, dict) and "bytes" in value:  # a datasets Image/Audio struct
        data = value.get("bytes")
        if data is not None:
            return bytes(data)
        value = value.get("path")
    if ext.lower() in TEXT_EXTENSIONS:
        return None if value is None else encode_value(_json_ready(value) if not isinstance(value, str) else value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if value is None or isinstance(value, str):
        return UrlField((value or "").strip())
    return encode_value(_json_ready(value))


def _json_ready(value: Any) -> Any:
    """A table value as JSON can hold it: bytes as base64, dates as ISO text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):  # NaN and infinities are not JSON
        return None
    return value


def encode_record(record: dict[str, Any]) -> bytes:
    """A sample's ``json`` member: sorted keys, compact, UTF-8."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


__all__ = ["FieldMap", "FileField", "KEY_COLUMN", "KNOWN_EXTENSIONS", "REST", "RowSample", "UrlField", "encode_record"]
