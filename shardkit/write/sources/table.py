"""Tables as a write source: their rows scanned into spills, their URLs fetched while shards are written.

Parquet, CSV/TSV and ``datasets`` save_to_disk folders (read by
:mod:`shardkit.write.sources.table_reader`) are sources like the others, one
:class:`TableKind` per format name. Each part of a
table (a Parquet row group, a CSV/TSV byte range, an Arrow file) is a scan
partition, scanned in parallel; scanning maps every row to sample fields with
the write's :class:`~shardkit.write.fieldmap.FieldMap` (a missing column is
refused first, before anything is read or fetched) and keeps the mapped row
itself in the partition's spill (:func:`encode_row`). A shard writer so reads
its rows from the spill, in the plan's order, without reading the table again
(a shuffled shard draws from every row group).

Sizes: values held in the table (text, image bytes) are sized as any input.
A field to download (see :class:`~shardkit.write.fieldmap.UrlField`) has no
size before it is fetched: it is planned as 0 bytes, so shards of such a
table are cut by count, :data:`DEFAULT_URL_SHARD_SAMPLES` samples unless
``max_samples`` is given (``max_bytes`` still bounds the bytes held in the
table).

Writing (:func:`table_rows`): the shard's rows go through
:func:`~shardkit.write.ingest.ingest_rows` on one
:class:`~shardkit.write.download.Downloader` per writer process
(:func:`process_downloader`), results in plan order whatever finished first,
so a shard's bytes depend on the table, the seed, the options and the fetched
bytes only. A row that could not be fetched or is not an image is a skipped
input (its reason category first: ``http_404: jpg http://host/a.jpg: ...``),
or stops the write under ``on_error="raise"``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit.errors import InputFileError, SourceError, UsageError
from shardkit.format.manifest import SkippedInput
from shardkit.write.download import DownloadOptions, Downloader
from shardkit.write.extensions import IMAGE_EXTENSIONS
from shardkit.write.fieldmap import FieldMap, FileField, RowSample, UrlField, encode_record
from shardkit.write.ingest import SkippedRow, ingest_rows
from shardkit.write.resize import ImageOptions, image_format_name
from shardkit.write.sources.base import (
    IMAGE_OPTIONS,
    Listing,
    Members,
    Partition,
    ReadRange,
    Reading,
    ScanCollector,
    SourceKind,
    SourceSettings,
)
from shardkit.write.sources.files import RowFileError, read_file, row_file
from shardkit.write.sources.table_reader import (
    PartitionList,
    Table,
    TablePartition,
    open_table,
    read_rows,
    table_format,
)
from shardkit.write.spill import short_digest

logger = logging.getLogger(__name__)

#: Samples per shard of a table with fields to download, when ``max_samples``
#: is not given (img2dataset's default too).
DEFAULT_URL_SHARD_SAMPLES = 10_000

#: The format names (and partition kinds) of tables: Parquet, CSV, TSV and
#: ``datasets`` save_to_disk folders or cached datasets (``hf``).
TABLE_KINDS = ("parquet", "csv", "tsv", "hf")

#: The write's format names of tables -> :mod:`~shardkit.write.sources.table_reader`'s names.
_TABLES_FORMAT = {"parquet": "parquet", "csv": "csv", "tsv": "tsv", "hf": "arrow"}
_WRITE_FORMAT = {value: key for key, value in _TABLES_FORMAT.items()}

#: Options only table sources take: the column map and the downloads.
TABLE_OPTIONS = frozenset({
    "fields", "key_column", "download_threads", "max_connections_per_host", "connect_timeout_s", "read_timeout_s",
    "download_retries", "respect_opt_out", "user_agent_contact", "s3_anonymous", "files_root",
})  # fmt: skip

#: Folder entries a Parquet dataset folder may hold besides its files (Spark's and Hadoop's markers).
_PARQUET_EXTRAS = ("_SUCCESS", "_common_metadata", "_metadata")


@dataclass(frozen=True)
class IngestOptions:
    """How a shard writer fetches and prepares a table's fields."""

    download: DownloadOptions = field(default_factory=DownloadOptions)
    images: ImageOptions = field(default_factory=ImageOptions)

    def output_signature(self) -> str:
        """What of these options changes the stored bytes (not timeouts or
        threads): part of each row's digest, so ``--resume`` keeps a finished
        shard only when it was written with the same."""
        return repr((self.images, self.download.respect_opt_out, self.download.max_bytes))


def ingest_options(options: Any) -> IngestOptions:
    """The :class:`IngestOptions` a :class:`~shardkit.write.parallel.WriteOptions` sets:

    ``download_threads`` (16), ``max_connections_per_host`` (4),
    ``connect_timeout_s`` (10), ``read_timeout_s`` (20), ``download_retries``
    (2: three attempts, with backoff, ``Retry-After`` honoured),
    ``respect_opt_out`` (True), ``user_agent_contact`` (None) and
    ``s3_anonymous`` (False: ``s3://`` URLs signed) make its
    :class:`~shardkit.write.download.DownloadOptions`; ``resize`` (None),
    ``resize_mode`` (``keep_ratio``), ``image_format`` (None: keep) and
    ``image_quality`` (95) its :class:`~shardkit.write.resize.ImageOptions`.

    Raises:
        UsageError: A value out of range (names the option).
    """
    if not isinstance(options.download_retries, int) or options.download_retries < 0:
        raise UsageError(f"download_retries must be 0 or more, got {options.download_retries!r}")
    download = DownloadOptions(
        num_threads=options.download_threads, max_connections_per_host=options.max_connections_per_host,
        connect_timeout_s=options.connect_timeout_s, read_timeout_s=options.read_timeout_s,
        fetch_deadline_s=max(60.0, options.read_timeout_s), max_attempts=options.download_retries + 1,
        respect_opt_out=options.respect_opt_out, user_agent_contact=options.user_agent_contact,
        s3_anonymous=options.s3_anonymous, max_ahead=max(256, 4 * options.download_threads),
    )  # fmt: skip
    images = ImageOptions(
        resize=options.resize, mode=options.resize_mode, output_format=options.image_format,
        quality=options.image_quality,
    )  # fmt: skip
    return IngestOptions(download, images)


def note_image_format(options: Any) -> None:
    """Log once when ``image_format`` stores images under a field named for
    another format (``--field jpg=URL --image-format webp``: WebP bytes in
    ``KEY.jpg`` members); the field keeps its name, as the user mapped it."""
    wanted = options.image_format
    if wanted is None:
        return
    for ext, column in options.field_map().fields:
        named = image_format_name(ext)
        if named in IMAGE_EXTENSIONS and named != wanted:
            logger.warning(
                "field %r will hold %s images (image_format=%s) in members named KEY.%s; to name them after what "
                "they hold, map the column as --field %s=%s",
                ext, wanted.upper(), wanted, ext, wanted, column,
            )  # fmt: skip


def _note_left_out(source: str, columns: Sequence[str], fields: FieldMap) -> None:
    """Log once which columns the default map (columns named after an
    extension) leaves out: a LAION-style ``url`` column would otherwise be
    dropped without a word, and the shards hold captions only."""
    read = set(fields.columns_read(columns))
    left = [c for c in columns if c not in read]
    if not left:
        return
    urls = [c for c in left if "url" in c.lower()]
    example = f"--field jpg={urls[0]} " if urls else ""
    logger.warning(
        "%s: column(s) %s left out: no --field maps them and no field is named after them (kept: %s); map them, "
        "e.g. %s--field json=* (the rest as JSON)",
        source, ", ".join(left), ", ".join(f"{ext}={column}" for ext, column in fields.fields), example,
    )  # fmt: skip


def planned_options(options: Any, scanned: Any) -> Any:
    """``options`` (a :class:`~shardkit.write.parallel.WriteOptions`) as the
    plan uses them for ``scanned``: a table with fields to download (sized only
    once fetched) is cut by count, :data:`DEFAULT_URL_SHARD_SAMPLES` samples
    per shard unless ``max_samples`` is given."""
    if scanned.has_urls and options.max_samples is None:
        return dataclasses.replace(options, max_samples=DEFAULT_URL_SHARD_SAMPLES)
    return options


def detect_table(source: str) -> str | None:
    """The write format (``parquet``, ``csv``, ``tsv``, ``hf``) ``source`` has, or None.

    A folder is a table when ``datasets`` saved it (``state.json``) or when
    it holds ``.parquet`` files and nothing else but Spark's marker files.
    """
    if os.path.isdir(source):
        if os.path.exists(os.path.join(source, "state.json")) or os.path.exists(
            os.path.join(source, "dataset_dict.json")
        ):
            return "hf"
        found = False
        for _, _, files in os.walk(source):  # stops at the first other file: an image tree costs one listing
            for name in files:
                if name.endswith(".parquet"):
                    found = True
                elif not (name.startswith(".") or name.endswith(".crc") or name in _PARQUET_EXTRAS):
                    return None
        return "parquet" if found else None
    found = table_format(source)
    return None if found is None else _WRITE_FORMAT[found]


@dataclass(frozen=True)
class TableSpec:
    """A table source as its scanning workers need it (pickles small).

    Attributes:
        source: The source as given.
        format: ``parquet``, ``csv``, ``tsv`` or ``hf``.
        columns: The table's columns.
        fields: The field map, resolved against ``columns``.
        output: :meth:`IngestOptions.output_signature` of the write.
        files_base: The folder a row's local file paths are relative to (the table's).
        files_root: The folder they must stay in (``files_root``, or ``files_base``).
    """

    source: str
    format: str
    columns: tuple[str, ...]
    fields: FieldMap
    output: str = ""
    files_base: str = ""
    files_root: str = ""

    def signature(self) -> dict:
        """What a resumed run's spills must have been scanned with."""
        fields = [list(pair) for pair in self.fields.fields]
        return {"table_fields": fields, "table_key": self.fields.key_column, "table_output": self.output,
                "table_files_root": self.files_root}  # fmt: skip

    def scan_rows(self, part: Partition, scan: ScanCollector) -> None:
        """Scan one table partition: map each row and add it (the mapped row as
        the record's name) to ``scan``."""
        table = Table(self.source, _TABLES_FORMAT[self.format], self.columns, PartitionList((), []), 0)
        piece = TablePartition(part.path, part.start, part.end, part.first_row, 0, part.first_line)
        columns = self.fields.columns_read(self.columns)
        salt = self.output.encode()
        for position, row in read_rows(table, piece, columns):
            try:
                sample = self._with_files(self.fields.sample(position, row, source=self.source))
            except SourceError as exc:
                scan.skip_or_raise(exc, f"{self.source}#row={position}")
                continue
            blob = encode_row(sample)
            sizes = [(ext, _planned_size(value)) for ext, value in sample.fields]
            scan.files.update(value.path for _, value in sample.fields if isinstance(value, FileField))
            has_url = any(isinstance(value, UrlField) for _, value in sample.fields)
            if (has_url or sample.record is not None) and not any(ext == "json" for ext, _ in sizes):
                record = encode_record(sample.record) if sample.record is not None else b""
                sizes = sorted([*sizes, ("json", len(record))])
            scan.has_urls = scan.has_urls or has_url
            scan.add(sample.key, blob, position, 0, sizes, short_digest(blob + salt))

    def _with_files(self, sample: RowSample) -> RowSample:
        """``sample`` with each string that is not a URL (no ``scheme://``)
        taken as a local file's path, as a JSONL row's path is: relative to
        :attr:`files_base`, confined to :attr:`files_root`, sized now.

        Raises:
            SourceError: A path outside the files root, or no regular file
                there (names the row, the field and the file).
        """
        if not any(_is_path(value) for _, value in sample.fields):
            return sample
        fields: list[tuple[str, bytes | UrlField | FileField]] = []
        for ext, value in sample.fields:
            if _is_path(value):
                assert isinstance(value, UrlField)
                try:
                    value = FileField(*row_file(ext, value.url, self.files_base, self.files_root))
                except RowFileError as exc:
                    row = f"{self.source}#row={sample.position}"  # the path a skip record names, as for downloads
                    raise SourceError(f"{self.source}: row {sample.position}: {exc}", path=row) from exc.__cause__
            fields.append((ext, value))
        return dataclasses.replace(sample, fields=tuple(fields))


class TableKind(SourceKind):
    """A table of one format (``parquet``, ``csv``, ``tsv``, ``hf``): each row a sample."""

    rows_in_spill = True

    def __init__(self, name: str):
        self.name = name
        self.source_is_path = name in ("csv", "tsv")  # Parquet: a brace pattern too; hf: a cached dataset's name
        self.options = IMAGE_OPTIONS | TABLE_OPTIONS | ({"partition_bytes"} if self.source_is_path else set())

    def partitions(self, source: str, settings: SourceSettings) -> Listing:
        """The table's parts, and its spec (:class:`TableSpec`) every part's scan shares."""
        parts, spec = table_partitions(
            source, self.name, fields=settings.fields, partition_bytes=settings.partition_bytes,
            output=settings.table_output, files_root=settings.files_root,
        )  # fmt: skip
        return Listing(parts, spec=spec, signature=spec.signature())

    def scan(self, part: Partition, collector: ScanCollector, settings: SourceSettings, spec: Any) -> tuple[str, int]:
        spec.scan_rows(part, collector)
        return part.path, 0

    def load(self, part: Partition, read_path: str, key: str, name: str, rec: Any, read_range: ReadRange) -> Members:
        raise AssertionError("table rows are made from their spill records by table_rows, never loaded")

    def read_samples(
        self, part: Partition, read_path: str, rows: Sequence[tuple[str, bytes, Any]], reading: Reading
    ) -> Iterator[tuple[str, Members | None, SourceError | None]]:
        """The rows as a shard writer makes them (their files read, their
        URLs fetched, their images checked or resized as ``reading.ingest``
        says), for a user's ``map``; a row that could not be fetched is left
        out with its reason (``http_404: jpg URL: ...``) or, under
        ``reading.row_errors="raise"``, stops the write."""
        source = part.root
        ingest = reading.ingest or IngestOptions()
        samples = (_read_files(decode_row(key, rec.offset, name), source, reading.on_error) for key, name, rec in rows)
        for result in ingest_rows(samples, downloader=process_downloader(ingest.download), images=ingest.images):
            where = f"{source}#row={result.position}"
            if isinstance(result, SkippedRow):
                if reading.row_errors == "raise":
                    raise result.error(source)
                yield where, None, SourceError(result.skipped_input(source).reason, path=where)
            else:
                yield where, list(result.fields), None

    def origin(self, part: Partition, read_path: str, name: str, offset: int) -> str:
        return f"{part.root}#row={offset}"

    def count_files(self, partitions: Sequence[Partition], summaries: Sequence[dict]) -> int:
        """The table's files, each once however many parts it is cut into, and
        the local files its rows name (counted once per partition naming them)."""
        return len({part.path for part in partitions}) + super().count_files(partitions, summaries)


def _is_path(value: object) -> bool:
    """A table value that names a local file: a string with no ``scheme://``."""
    return isinstance(value, UrlField) and bool(value.url) and "://" not in value.url


def _planned_size(value: bytes | UrlField | FileField) -> int:
    """A field's bytes as the scan plans them: a URL's are not known until fetched (0)."""
    if isinstance(value, UrlField):
        return 0
    if isinstance(value, FileField):
        return value.size
    return len(value)


def table_partitions(
    source: str, format: str, *, fields: FieldMap, partition_bytes: int, output: str = "",
    files_root: str | None = None,
) -> tuple[list[Partition], TableSpec]:
    """A table source's partitions, and its spec with the field map checked
    against its columns (reads metadata only: Parquet footers, the Arrow
    schemas, one pass over a CSV's bytes).

    Raises:
        SourceError: Not a readable table, or a mapped or key column is
            missing (the message names it and the columns there are).
    """
    table = open_table(source, format=_TABLES_FORMAT[format], partition_bytes=partition_bytes)
    resolved = fields.resolve(table.columns, source=source)
    if not fields.fields:
        _note_left_out(source, table.columns, resolved)
    base = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    root = os.path.abspath(files_root) if files_root else base
    spec = TableSpec(source, format, table.columns, resolved, output, files_base=base, files_root=root)
    parts = [
        Partition(i, format, piece.path, piece.start, piece.end, root=source, first_row=piece.first_row,
                  first_line=piece.first_line)
        for i, piece in enumerate(table.partitions)
    ]  # fmt: skip
    if not parts:
        raise SourceError(f"{source}: the table has no rows", path=source)
    return parts, spec


def encode_row(sample: RowSample) -> bytes:
    """A mapped row as the spill keeps it: a JSON line (each field's extension
    and URL, byte count or ``[file path, size]``, the ``json=*`` record) and
    the fields' bytes after it."""
    head: list[Any] = []
    data = []
    for ext, value in sample.fields:
        if isinstance(value, UrlField):
            head.append([ext, value.url])
        elif isinstance(value, FileField):
            head.append([ext, [value.path, value.size]])
        else:
            head.append([ext, len(value)])
            data.append(value)
    line = json.dumps({"f": head, "r": sample.record}, separators=(",", ":")).encode()
    return b"".join([line, b"\n", *data])


def decode_row(key: str, position: int, blob: bytes) -> RowSample:
    """The :class:`RowSample` :func:`encode_row` gave ``blob`` for."""
    end = blob.index(b"\n")
    head = json.loads(blob[:end])
    at = end + 1
    fields: list[tuple[str, bytes | UrlField | FileField]] = []
    for ext, value in head["f"]:
        if isinstance(value, str):
            fields.append((ext, UrlField(value)))
        elif isinstance(value, list):
            fields.append((ext, FileField(value[0], value[1])))
        else:
            fields.append((ext, blob[at : at + value]))
            at += value
    return RowSample(key, position, tuple(fields), head["r"])


# ---------------------------------------------------------------- writing side

_local = threading.Lock()
_downloader: tuple[int, DownloadOptions, Downloader] | None = None


def process_downloader(options: DownloadOptions) -> Downloader:
    """This process's :class:`Downloader` for ``options``, made on first use
    (after a fork, a new one: threads do not cross it)."""
    global _downloader
    with _local:
        if _downloader is not None and _downloader[0] == os.getpid() and _downloader[1] == options:
            return _downloader[2]
        if _downloader is not None and _downloader[0] == os.getpid():
            _downloader[2].close()
        made = Downloader(options)
        _downloader = (os.getpid(), options, made)
        return made


def close_process_downloader() -> None:
    """Close this process's downloader, if it made one (its threads end)."""
    global _downloader
    with _local:
        if _downloader is not None and _downloader[0] == os.getpid():
            _downloader[2].close()
        _downloader = None


def table_rows(
    plan: Any, task: Any, *, ingest: IngestOptions | None, on_error: str, input_errors: str = "raise"
) -> Iterator[tuple[str, list[tuple[str, bytes]]] | SkippedInput]:
    """A shard task's table rows ready to store, ``(key, fields)``, or their
    skip records, in plan order.

    Args:
        plan: The task's :class:`~shardkit.write.plan.PlanReader`.
        task: The :class:`~shardkit.write.plan.ShardTask`.
        ingest: Download and image options (defaults when None).
        on_error: ``"raise"``: the first row that cannot be stored raises.
        input_errors: ``"raise"``: a row's local file that vanished or
            changed since the scan raises; ``"skip"``: the row is recorded.

    Raises:
        SourceError: Under ``on_error="raise"``, for the first row left out:
            names the table, the row, the field, the reason and the URL
            (redacted).
    """
    ingest = ingest or IngestOptions()
    source = plan.partitions[0].root if plan.partitions else ""

    def samples() -> Iterator[RowSample | SkippedRow]:
        for _, key, name, rec in plan.samples(task):
            yield _read_files(decode_row(key, rec.offset, name), source, input_errors)

    downloader = process_downloader(ingest.download)
    for result in ingest_rows(samples(), downloader=downloader, images=ingest.images):
        if isinstance(result, SkippedRow):
            if on_error == "raise":
                raise result.error(source)
            yield result.skipped_input(source)
        else:
            yield result.key, list(result.fields)


def _read_files(sample: RowSample, source: str, on_error: str) -> RowSample | SkippedRow:
    """``sample`` with its local files read (on the writer's thread, in plan
    order), or the row left out when one cannot be read as scanned.

    Raises:
        InputFileError: Under ``on_error="raise"``, naming the table, the row and the file.
    """
    if not any(isinstance(value, FileField) for _, value in sample.fields):
        return sample
    fields: list[tuple[str, bytes | UrlField | FileField]] = []
    for ext, value in sample.fields:
        if isinstance(value, FileField):
            try:
                data = read_file(value.path, value.size)
                if len(data) != value.size:
                    raise InputFileError(
                        f"{value.path}: input changed size since it was scanned; rerun the write", path=value.path
                    )
            except InputFileError as exc:
                if on_error == "raise":
                    raise InputFileError(
                        f"{source}: row {sample.position} (key {sample.key}): field {ext!r}: {exc}", path=value.path
                    ) from exc
                return SkippedRow(sample.key, sample.position, ext, "", None, "input", str(exc))
            value = data
        fields.append((ext, value))
    return dataclasses.replace(sample, fields=tuple(fields))


__all__ = [
    "DEFAULT_URL_SHARD_SAMPLES",
    "IngestOptions",
    "TABLE_KINDS",
    "TABLE_OPTIONS",
    "TableKind",
    "TableSpec",
    "close_process_downloader",
    "decode_row",
    "detect_table",
    "encode_row",
    "ingest_options",
    "planned_options",
    "process_downloader",
    "table_partitions",
    "table_rows",
]
