"""Tables as sources: Parquet, CSV/TSV and Hugging Face ``datasets`` folders, read as rows.

:func:`open_table` looks at a source's metadata only (Parquet footers, the
Arrow files' schema, one pass over a CSV's bytes) and returns a
:class:`Table`: its columns, its row count and its partitions, the units
the writer may scan in parallel:

``parquet``
    A ``.parquet`` file, a folder of them (searched recursively, in sorted
    order) or a brace pattern (``part-{000..009}.parquet``). One partition
    per row group. Every file must have the same columns.
``csv`` / ``tsv``
    One file, comma- or tab-separated, UTF-8, its first line the header.
    Partitions are byte ranges of about ``partition_bytes`` that start and
    end at row boundaries: CSV fields may be quoted (RFC 4180, a quoted
    field may hold newlines and ``""``), so a boundary is a newline outside
    quotes; TSV has no quoting (a ``"`` is an ordinary character, as in the
    tab-separated caption lists of CC3M/CC12M), every newline ends a row.
``arrow``
    A folder written by ``datasets``' ``Dataset.save_to_disk`` (its
    ``state.json`` lists the Arrow files): one partition per Arrow file. A
    ``DatasetDict`` folder is refused with the names of its splits. Read with
    pyarrow alone, no network and no ``datasets`` import. Image columns hold
    ``{"bytes": ..., "path": ...}`` structs; :mod:`shardkit.write.fieldmap`
    stores their bytes as they are. Or a dataset's Hub name that
    ``datasets`` cached earlier, ``NAME[:SPLIT]`` (see
    :mod:`shardkit.write.sources.hf_cache`; looked up offline, never downloaded):
    the cached Arrow files are its partitions.

:func:`read_rows` reads one partition as ``(position, row)`` pairs, where
``position`` is the row's 0-based position in the whole table (stable
whatever the partitioning: the default sample key) and ``row`` a dict of
the asked columns. Rows stream in batches; memory does not grow with the
table.

Needs pyarrow for Parquet and Arrow (``pip install 'shardkit[tables]'``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from shardkit.errors import SourceError
from shardkit.format.brace import is_pattern
from shardkit.write.sources.files import pattern_inputs, walk_files
from shardkit.write.sources.hf_cache import find_cached, looks_like_name

#: Table formats :func:`open_table` reads.
TABLE_FORMATS = ("parquet", "csv", "tsv", "arrow")

#: Default size of a CSV/TSV partition.
DEFAULT_PARTITION_BYTES = 64 << 20

#: Rows handed over at once when reading Parquet and Arrow.
_BATCH_ROWS = 1024
_SCAN_CHUNK = 4 << 20
_QUOTE_OR_NEWLINE = re.compile(rb'["\n]')


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise ImportError("reading Parquet and Arrow tables needs pyarrow: pip install 'shardkit[tables]'") from exc
    return pyarrow


@dataclass(frozen=True, slots=True)
class TablePartition:
    """A part of a table the writer may read on its own.

    Attributes:
        path: The file.
        start, end: Parquet: the row groups ``[start, end)``; CSV/TSV: the
            byte range ``[start, end)``; Arrow: ``0, 0`` (the whole file).
        first_row: Position in the table of the partition's first row.
        num_rows: Rows in the partition.
        first_line: CSV/TSV: the 1-based line number of the partition's
            first line (for messages); 0 otherwise.
    """

    path: str
    start: int
    end: int
    first_row: int
    num_rows: int
    first_line: int = 0


#: Columns of the partition array: the file's index in ``Table.files``, then
#: the fields of :class:`TablePartition` after its path.
_PART_COLUMNS = ("file", "start", "end", "first_row", "num_rows", "first_line")


class PartitionList(Sequence[TablePartition]):
    """A table's partitions, stored as one int64 array (a row per partition)
    and the file names once: a table of 10^5 row groups costs 5 MB, not 10^5
    objects. Indexing builds the :class:`TablePartition` asked for."""

    def __init__(self, files: tuple[str, ...], rows: list[tuple[int, ...]] | np.ndarray):
        self.files = files
        self.array = np.asarray(rows, dtype=np.int64).reshape(-1, len(_PART_COLUMNS))

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, index: int) -> TablePartition: ...
    @overload
    def __getitem__(self, index: slice) -> list[TablePartition]: ...
    def __getitem__(self, index: int | slice) -> TablePartition | list[TablePartition]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        file, start, end, first_row, num_rows, first_line = (int(v) for v in self.array[index])
        return TablePartition(self.files[file], start, end, first_row, num_rows, first_line)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, PartitionList) and self.files == other.files and np.array_equal(self.array, other.array)
        )


@dataclass(frozen=True, eq=False)
class Table:
    """A table source: what :func:`open_table` found. Pickles small (for
    worker processes and Ray tasks): its partitions are one array.

    Attributes:
        source: The source as given.
        format: One of :data:`TABLE_FORMATS`.
        columns: Column names, in the table's order.
        partitions: Partitions in table order (a :class:`PartitionList`).
        num_rows: Rows in the whole table.
    """

    source: str
    format: str
    columns: tuple[str, ...]
    partitions: PartitionList
    num_rows: int


def table_format(source: str) -> str | None:
    """The table format ``source`` looks like, by its name or contents, or None."""
    lower = source.lower()
    if lower.endswith(".parquet") or (("{" in source) and lower.rstrip("}").endswith("parquet")):
        return "parquet"
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith((".tsv", ".tab")):
        return "tsv"
    if os.path.isdir(source):
        if os.path.exists(os.path.join(source, "state.json")) or os.path.exists(
            os.path.join(source, "dataset_dict.json")
        ):
            return "arrow"
        if any(name.endswith(".parquet") for name in _parquet_files_in(source, limit=1)):
            return "parquet"
    return None


def open_table(source: str, *, format: str | None = None, partition_bytes: int = DEFAULT_PARTITION_BYTES) -> Table:
    """Read a table's metadata: columns, row count, partitions.

    Args:
        source: A file, folder or brace pattern (see the module docs).
        format: One of :data:`TABLE_FORMATS`, or None to tell from ``source``.
        partition_bytes: Target size of a CSV/TSV partition.

    Raises:
        SourceError: The source does not exist, is not a table, or its files
            disagree on their columns (the message names the file).
        ImportError: pyarrow is missing for Parquet/Arrow (names the extra).
    """
    kind = format or table_format(source)
    if kind is None:
        raise SourceError(
            f"{source}: not a table shardkit can read: expected a .parquet file, folder or brace pattern, "
            "a .csv or .tsv file, or a folder saved by datasets' save_to_disk",
            path=source,
        )
    if kind not in TABLE_FORMATS:
        raise SourceError(f"{source}: unknown table format {kind!r}; use one of {', '.join(TABLE_FORMATS)}", path=source)
    if kind == "parquet":
        return _open_parquet(source)
    if kind == "arrow":
        return _open_arrow(source)
    if partition_bytes < 1:
        raise SourceError(f"partition_bytes must be at least 1, got {partition_bytes}", path=source)
    return _open_delimited(source, kind, partition_bytes)


def read_rows(table: Table, partition: TablePartition, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(position, {column: value})`` for each row of ``partition``, in order.

    Only ``columns`` are read (for Parquet and Arrow, only they are loaded).

    Raises:
        SourceError: A CSV/TSV line is not UTF-8 or has the wrong number of
            fields (the message names the file and line).
    """
    if table.format in ("csv", "tsv"):
        yield from _read_delimited(table, partition, columns)
        return
    pa = _pyarrow()
    if table.format == "parquet":
        parquet = pa.parquet.ParquetFile(partition.path)
        batches = parquet.iter_batches(
            batch_size=_BATCH_ROWS, row_groups=range(partition.start, partition.end), columns=list(columns)
        )
    else:
        batches = _arrow_batches(pa, partition.path, columns)
    position = partition.first_row
    for batch in batches:
        names = batch.schema.names
        values = [batch.column(i).to_pylist() for i in range(len(names))]
        for i in range(batch.num_rows):
            yield position, {name: column[i] for name, column in zip(names, values)}
            position += 1


# --- Parquet -------------------------------------------------------------------


def _parquet_files_in(folder: str, limit: int | None = None) -> list[str]:
    found = []
    for path in walk_files(folder):
        if path.endswith(".parquet"):
            found.append(path)
            if limit is not None and len(found) >= limit:
                break
    return found


def _parquet_paths(source: str) -> list[str]:
    if is_pattern(source):
        paths = pattern_inputs(source)
    elif os.path.isdir(source):
        paths = _parquet_files_in(source)
        if not paths:
            raise SourceError(f"{source}: the folder holds no .parquet file", path=source)
    else:
        paths = [source]
    for path in paths:
        if not os.path.isfile(path):
            raise SourceError(f"{path}: no such Parquet file", path=path)
    return paths


def _open_parquet(source: str) -> Table:
    pa = _pyarrow()
    paths = _parquet_paths(source)
    parts: list[tuple[int, ...]] = []
    columns: tuple[str, ...] | None = None
    first_path = ""
    row = 0
    for number, path in enumerate(paths):
        try:
            metadata = pa.parquet.ParquetFile(path).metadata
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"{path}: not a readable Parquet file ({exc})", path=path) from exc
        names = tuple(metadata.schema.to_arrow_schema().names)
        if columns is None:
            columns, first_path = names, path
        elif names != columns:
            raise SourceError(
                f"{path}: its columns ({', '.join(names)}) differ from those of {first_path} "
                f"({', '.join(columns)}); every file of a table must have the same columns",
                path=path,
            )
        for group in range(metadata.num_row_groups):
            count = metadata.row_group(group).num_rows
            parts.append((number, group, group + 1, row, count, 0))
            row += count
    assert columns is not None
    return Table(source, "parquet", columns, PartitionList(tuple(paths), parts), row)


# --- Arrow (datasets' save_to_disk) ------------------------------------------


def _open_arrow(source: str) -> Table:
    if not os.path.isdir(source) and looks_like_name(source):
        cached = find_cached(source)
        info = os.path.join(cached.folder, "dataset_info.json")
        return _open_arrow_files(source, cached.folder, list(cached.files), info)
    if os.path.exists(os.path.join(source, "dataset_dict.json")):
        with open(os.path.join(source, "dataset_dict.json"), encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        raise SourceError(
            f"{source}: a DatasetDict with splits {', '.join(map(str, splits)) or '(none)'}; "
            f"pass one split's folder, e.g. {os.path.join(source, str(splits[0]) if splits else 'train')}",
            path=source,
        )
    state_path = os.path.join(source, "state.json")
    try:
        with open(state_path, encoding="utf-8") as f:
            files = [entry["filename"] for entry in json.load(f)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(
            f"{state_path}: not a datasets save_to_disk folder's state.json ({type(exc).__name__}: {exc})", path=source
        ) from exc
    return _open_arrow_files(source, source, files, state_path)


def _open_arrow_files(source: str, folder: str, files: list[str], listed_by: str) -> Table:
    """The table of the Arrow stream files ``files`` in ``folder`` (``listed_by`` names them)."""
    pa = _pyarrow()
    parts: list[tuple[int, ...]] = []
    columns: tuple[str, ...] | None = None
    row = 0
    for number, name in enumerate(files):
        path = os.path.join(folder, name)
        if os.path.basename(name) != name or not os.path.isfile(path):
            raise SourceError(f"{listed_by}: lists {name!r}, which is not a file in the folder", path=source)
        try:
            with pa.memory_map(path) as source_file:
                reader = pa.ipc.open_stream(source_file)
                names = tuple(reader.schema.names)
                count = sum(batch.num_rows for batch in reader)
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"{path}: not a readable Arrow stream ({exc})", path=path) from exc
        if columns is None:
            columns = names
        elif names != columns:
            raise SourceError(f"{path}: its columns differ from the first file's", path=path)
        parts.append((number, 0, 0, row, count, 0))
        row += count
    if columns is None:
        raise SourceError(f"{listed_by}: lists no data files", path=source)
    paths = tuple(os.path.join(folder, name) for name in files)
    return Table(source, "arrow", columns, PartitionList(paths, parts), row)


def _arrow_batches(pa: Any, path: str, columns: Sequence[str]) -> Iterator[Any]:
    with pa.memory_map(path) as source_file:
        for batch in pa.ipc.open_stream(source_file):
            yield batch.select(list(columns))


# --- CSV / TSV -----------------------------------------------------------------


def _dialect(kind: str) -> dict[str, Any]:
    if kind == "tsv":
        return {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
    return {"delimiter": ",", "quotechar": '"', "doublequote": True}


def _decode(data: bytes, path: str, line_before: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = line_before + data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SourceError(
            f"{path}: line {line}: byte 0x{data[exc.start]:02x} at column {column} is not UTF-8; "
            "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)",
            path=path,
            line=line,
        ) from None


def _open_delimited(path: str, kind: str, partition_bytes: int) -> Table:
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such {kind.upper()} file", path=path)
    quoted = kind == "csv"
    with open(path, "rb") as f:
        bounds = _row_bounds(f, quoted, partition_bytes)
    header_end, _, _ = bounds[0]
    with open(path, "rb") as f:
        header_bytes = f.read(header_end)
    text = _decode(header_bytes, path, 0)
    if text.startswith("\ufeff"):
        text = text[1:]
    header = next(csv.reader(io.StringIO(text, newline=""), **_dialect(kind)), [])
    if not header or not any(header):
        raise SourceError(f"{path}: line 1 should name the columns, but it is empty", path=path, line=1)
    if len(set(header)) != len(header):
        twice = sorted({name for name in header if header.count(name) > 1})
        raise SourceError(f"{path}: line 1 names column(s) {', '.join(map(repr, twice))} twice", path=path, line=1)
    parts = [
        (0, start, end, start_row, end_row - start_row, start_line + 1)
        for (start, start_row, start_line), (end, end_row, _) in zip(bounds, bounds[1:])
        if end > start
    ]
    return Table(path, kind, tuple(header), PartitionList((path,), parts), bounds[-1][1])


def _row_bounds(f: Any, quoted: bool, partition_bytes: int) -> list[tuple[int, int, int]]:
    """``(offset, rows before, lines before)`` at the header's end, at each
    partition boundary and at the end of the file; rows exclude the header.

    A boundary is the first row end (a newline outside quotes) at or past
    ``partition_bytes`` after the previous one; the header's end is the first.
    """
    bounds: list[tuple[int, int, int]] = []
    in_quotes = False
    rows = lines = 0  # row ends and newlines before the scanned position
    offset = 0  # of the chunk in the file
    need = 0  # the next boundary is the first row end at or after this offset
    last = b"\n"
    while chunk := f.read(_SCAN_CHUNK):
        if not quoted or (not in_quotes and b'"' not in chunk):
            # Every newline ends a row: count them, search only for boundaries.
            at = 0
            while (newline := chunk.find(b"\n", max(need - offset, at))) >= 0:
                count = chunk.count(b"\n", at, newline + 1)
                rows, lines, at = rows + count, lines + count, newline + 1
                bounds.append((offset + at, rows, lines))
                need = offset + at + partition_bytes
            count = chunk.count(b"\n", at)
            rows, lines = rows + count, lines + count
        else:
            for match in _QUOTE_OR_NEWLINE.finditer(chunk):
                if match.group() == b'"':
                    in_quotes = not in_quotes
                    continue
                lines += 1
                if in_quotes:
                    continue
                rows += 1
                if offset + match.start() >= need:
                    bounds.append((offset + match.end(), rows, lines))
                    need = offset + match.end() + partition_bytes
        offset += len(chunk)
        last = chunk[-1:]
    if in_quotes:
        raise SourceError(
            f"{f.name}: a quoted field is still open at the end of the file; close its quote (\"), "
            "and write a quote inside a field as \"\"",
            path=f.name,
        )
    if last != b"\n":
        rows, lines = rows + 1, lines + 1  # a last row without a newline
    if not bounds or bounds[-1][0] != offset:
        bounds.append((offset, rows, lines))
    # Positions count rows after the header: take the header's row off.
    return [(at, max(r - 1, 0), n) for at, r, n in bounds]


def _read_delimited(table: Table, partition: TablePartition, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    path = partition.path
    with open(path, "rb") as f:
        f.seek(partition.start)
        data = f.read(partition.end - partition.start)
    text = _decode(data, path, partition.first_line - 1)
    wanted = [(table.columns.index(name), name) for name in columns]
    width = len(table.columns)
    reader = csv.reader(io.StringIO(text, newline=""), **_dialect(table.format))
    position = partition.first_row
    ended_at = 0  # lines the reader had consumed after the previous row
    for fields in reader:
        line = partition.first_line + ended_at
        ended_at = reader.line_num
        if not fields:  # a blank line: still a row position
            position += 1
            continue
        if len(fields) != width:
            raise SourceError(
                f"{path}: line {line}: {len(fields)} fields where the header names {width} columns"
                + ("; a field holding a tab or newline must not appear in TSV" if table.format == "tsv" else
                   "; a field holding a comma, quote or newline must be quoted (\"...\", with \"\" for a quote)"),
                path=path,
                line=line,
            )
        yield position, {name: fields[index] for index, name in wanted}
        position += 1


__all__ = [
    "DEFAULT_PARTITION_BYTES",
    "PartitionList",
    "TABLE_FORMATS",
    "Table",
    "TablePartition",
    "open_table",
    "read_rows",
    "table_format",
]
