"""A Ray Data ``Datasource`` over a shardkit dataset (behind :func:`shardkit.ray.read_shards`).

The manifest says how many samples and bytes each shard holds, so every
read task's ``BlockMetadata`` is exact before anything is read. Each task
streams its shard (or a byte range of it, cut at sample boundaries taken from
the offset index) through :class:`~shardkit.format.tar.SampleParser`, which
checks every sample against its span in the index (so a damaged sample is an
error, never a partial row), and
hands Ray Arrow tables of ``__key__`` plus one binary column per extension.
Bytes are read through :func:`shardkit.io.registry.open_source`, so local
paths, ``http(s)://``, ``s3://`` and fsspec URLs all work.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from shardkit.format.manifest import Manifest
from shardkit.format.tar import SampleParser
from shardkit.io.base import SourceOptions
from shardkit.io.index import fetch_offset_index
from shardkit.io.manifest import fetch_manifest
from shardkit.io.registry import open_source
from shardkit.read.catalog import resolve_catalog

KEY_COLUMN = "__key__"
_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class ShardRange:
    """Samples ``[first, last)`` of one shard, at bytes ``[start, end)``.

    ``end`` is None for a whole shard (read to its end-of-archive marker).
    ``index_url`` is the shard's offset index, whose spans the samples are
    checked against; ``shard_samples`` is the shard's sample count it must list.
    """

    url: str
    index_url: str
    shard_bytes: int
    sha256: str
    first: int
    last: int
    start: int
    end: int | None
    shard_samples: int


def split_counts(num_samples: int, parts: int) -> list[int]:
    """Split ``num_samples`` into ``parts`` near-equal consecutive counts (none empty)."""
    parts = max(1, min(parts, num_samples))
    base, extra = divmod(num_samples, parts)
    return [base + (i < extra) for i in range(parts)]


def plan_ranges(
    manifest: Manifest, parallelism: int, *, options: SourceOptions, min_range_bytes: int = 0
) -> list[ShardRange]:
    """One range per shard, or several per shard when there are fewer shards than ``parallelism``.

    A shard is cut into no more ranges than leave each about ``min_range_bytes``
    (a read task has a fixed cost; tiny ones cost more than they overlap).
    """
    shards = np.flatnonzero(manifest.table.counts)  # by number, from the shard table
    wanted = max(1, math.ceil(parallelism / max(len(shards), 1))) if parallelism > len(shards) else 1
    ranges = []
    allowed = options.allowed_prefixes
    for number in shards.tolist():
        entry = manifest.table.entry(number)
        url = manifest.shard_url(number, allowed_prefixes=allowed)
        index_url = manifest.index_url(number, allowed_prefixes=allowed)
        per_shard = min(wanted, max(1, entry.num_bytes // min_range_bytes)) if min_range_bytes > 0 else wanted
        if per_shard == 1 or entry.num_samples == 1:
            ranges.append(
                ShardRange(url, index_url, entry.num_bytes, entry.sha256, 0, entry.num_samples, 0, None, entry.num_samples)
            )
            continue
        bounds = _bounds(index_url, options, shard_bytes=entry.num_bytes, num_samples=entry.num_samples)
        first = 0
        for count in split_counts(entry.num_samples, per_shard):
            last = first + count
            ranges.append(
                ShardRange(
                    url, index_url, entry.num_bytes, entry.sha256, first, last,
                    int(bounds[first]), int(bounds[last]), entry.num_samples,
                )  # fmt: skip
            )
            first = last
    return ranges


def _bounds(index_url: str, options: SourceOptions, *, shard_bytes: int, num_samples: int) -> np.ndarray:
    """A shard's offset index boundaries, checked before use."""
    return fetch_offset_index(index_url, num_samples=num_samples, shard_bytes=shard_bytes, options=options).bounds


def range_size(r: ShardRange) -> int:
    """Bytes a range covers (its tar bytes: a fair in-memory size for binary columns)."""
    return (r.end if r.end is not None else r.shard_bytes) - r.start


def read_range(
    r: ShardRange, extensions: tuple[str, ...], options: SourceOptions, target_block_bytes: int
) -> Iterator[pa.Table]:
    """Parse one range into Arrow tables of at most about ``target_block_bytes`` each."""
    source = open_source(r.url, options=options, expected_size=r.shard_bytes, expected_sha256=r.sha256)
    bounds = _bounds(r.index_url, options, shard_bytes=r.shard_bytes, num_samples=r.shard_samples)[r.first : r.last + 1]
    parser = SampleParser(path=r.url, base_offset=r.start, bounds=bounds)
    rows: list = []
    held = 0

    def table() -> pa.Table:
        return rows_to_table(rows, extensions)

    for chunk in source.iter_range(r.start, r.end, chunk_bytes=_CHUNK_BYTES):
        for raw in parser.feed(chunk):
            rows.append(raw)
            held += raw.end - raw.start
        if held >= target_block_bytes:
            yield table()
            rows, held = [], 0
    rows += parser.finish(expect_end_marker=r.end is None)
    if rows:
        yield table()


def rows_to_table(raws: list, extensions: tuple[str, ...]) -> pa.Table:
    """Arrow table of parsed samples: ``__key__`` and one binary column per extension."""
    columns = {KEY_COLUMN: pa.array([raw.key for raw in raws], type=pa.string())}
    for ext in extensions:
        columns[ext] = binary_column([raw.fields.get(ext) for raw in raws])
    return pa.table(columns)


def binary_column(values: list[bytes | None]) -> pa.Array:
    """An Arrow binary array built from one joined buffer and its offsets
    (several times faster than ``pa.array`` on large values); nulls go the
    slow way. Large (64-bit offsets) when the bytes pass 2 GiB."""
    if any(v is None for v in values):
        return pa.array(values, type=pa.binary())
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = offsets[-1] >= 2**31
    kind = pa.large_binary() if large else pa.binary()
    buffers = [None, pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(kind, len(values), buffers)


def schema_for(extensions: tuple[str, ...]) -> pa.Schema:
    return pa.schema([(KEY_COLUMN, pa.string())] + [(ext, pa.binary()) for ext in extensions])


class ShardkitDatasource(Datasource):
    """Ray ``Datasource`` reading a shardkit dataset by its manifest.

    Args:
        source: Dataset folder or ``manifest.json`` (path or URL).
        source_options: How shards are read.
        target_block_bytes: Bytes per block handed to Ray.
        min_range_bytes: Smallest sample range worth a read task of its own
            (0: cut shards into as many ranges as Ray asks for).
    """

    def __init__(
        self, source: str, *, source_options: SourceOptions, target_block_bytes: int, min_range_bytes: int
    ):
        super().__init__()
        self._min_range_bytes = min_range_bytes
        self._manifest = fetch_manifest(source, options=source_options)
        self._options = source_options
        self._target_block_bytes = target_block_bytes
        self._extensions = tuple(self._manifest.extensions)
        # A view, an extension, or a dataset samples were removed from: read
        # through the reader's catalog (kept samples, joined sides), a task a shard.
        derived = not hasattr(self._manifest, "table")
        self._catalog = resolve_catalog(source, options=source_options) if derived or self._manifest.num_removed else None

    def get_name(self) -> str:
        return "ShardkitShards"

    def estimate_inmemory_data_size(self) -> int | None:
        return getattr(self._manifest, "num_bytes", None)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None) -> list:
        extensions, options, block_bytes = self._extensions, self._options, self._target_block_bytes
        schema = schema_for(extensions)
        if self._catalog is not None:
            return kept_tasks(self._catalog, extensions, options, block_bytes, schema, per_task_row_limit)
        tasks = []
        for r in plan_ranges(self._manifest, parallelism, options=options, min_range_bytes=self._min_range_bytes):
            metadata = BlockMetadata(
                num_rows=r.last - r.first, size_bytes=range_size(r), input_files=[r.url], exec_stats=None
            )
            tasks.append(
                ReadTask(
                    lambda r=r: read_range(r, extensions, options, block_bytes),
                    metadata,
                    schema=schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def kept_tasks(
    catalog: Any, extensions: tuple[str, ...], options: SourceOptions, block_bytes: int, schema: pa.Schema,
    per_task_row_limit: int | None,
) -> list:
    """A read task per shard (row) of a catalog that leaves samples out or
    joins sides, reading its kept samples as the streaming reader does."""
    tasks = []
    for shard in range(catalog.num_shards):
        count = int(catalog.counts[shard])
        if not count:
            continue
        metadata = BlockMetadata(num_rows=count, size_bytes=None, input_files=[catalog.url(shard)], exec_stats=None)
        tasks.append(ReadTask(lambda shard=shard, count=count: read_kept(catalog, shard, count, extensions, options, block_bytes),
                              metadata, schema=schema, per_task_row_limit=per_task_row_limit))  # fmt: skip
    return tasks


def read_kept(
    catalog: Any, shard: int, count: int, extensions: tuple[str, ...], options: SourceOptions, block_bytes: int
) -> Iterator[pa.Table]:
    """The kept samples of one shard (row) as Arrow tables."""
    from shardkit.read.joined import reader_type
    from shardkit.read.split import Piece

    reader = reader_type(catalog)(catalog, on_error="raise", on_skip=lambda exc: None, options=options,
                                  read_ahead_bytes=64 << 20)  # fmt: skip
    rows: list = []
    held = 0
    for _, _, raw in reader.read(iter([Piece(shard, 0, count)])):
        rows.append(raw)
        held += sum(len(v) for v in raw.fields.values())
        if held >= block_bytes:
            yield rows_to_table(rows, extensions)
            rows, held = [], 0
    if rows:
        yield rows_to_table(rows, extensions)
