"""What a previous run of ``shardkit index`` left in its folder, for a rerun.

A rerun keeps the entries of shards that have not changed (see
:mod:`shardkit.index.indexer`): :func:`load_previous` reads the folder's
manifest (refusing another dataset's), and gives its entries as
:class:`PreviousRun`, whose columns are the previous table's and versions
sidecar's, mapped, not copied. Names are matched against the previous
run's sorted names, or by their numbers when its table stores none
(:class:`~shardkit.format.naming.NumberedNames`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from shardkit.errors import DestinationError, ShardkitError
from shardkit.format.manifest import MANIFEST_NAME, Manifest
from shardkit.format.naming import NumberedNames
from shardkit.format.table import TABLE_NAME, TABLE_SUFFIX
from shardkit.format.tokens import is_npy_field
from shardkit.io.base import SourceOptions
from shardkit.io.manifest import fetch_manifest
from shardkit.io.urls import is_local, local_path, redact_url

#: ``manifest.source["format"]`` of a dataset ``shardkit index`` wrote.
INDEX_SOURCE_FORMAT = "index"
#: The ``manifest.source`` key (true) of an index whose run counted tokens,
#: whether or not it found any: one without it that lists a ``.npy`` field
#: was made before token counts existed, and its shards are read again.
TOKENS_COUNTED = "tokens_counted"
#: Suffix of the per-shard versions sidecar (replaces the table's ``.table``).
VERSIONS_SUFFIX = ".versions.npy"


def versions_name(table_file: str) -> str:
    """The versions sidecar of a table file name."""
    return table_file[: -len(TABLE_SUFFIX)] + VERSIONS_SUFFIX


@dataclass(frozen=True)
class PreviousRun:
    """The previous run's entries, sorted by name for lookups (or numbered)."""

    names: np.ndarray | NumberedNames
    counts: np.ndarray
    sizes: np.ndarray
    sha256: np.ndarray
    versions: np.ndarray
    index_names: np.ndarray | NumberedNames
    extensions: tuple[str, ...]
    #: The token fields it recorded, and each shard's totals (see :mod:`shardkit.format.tokens`).
    token_fields: tuple[str, ...] = ()
    tokens: np.ndarray | None = None

    def match(self, names: np.ndarray) -> np.ndarray:
        """Each name's row here, or -1."""
        if isinstance(self.names, NumberedNames):
            return self.names.rows_of(names)
        if len(self.names) == 0 or len(names) == 0:
            return np.full(len(names), -1, dtype=np.int64)
        width = max(self.names.dtype.itemsize, names.dtype.itemsize)
        mine, theirs = self.names.astype(f"S{width}", copy=False), names.astype(f"S{width}", copy=False)
        rows = np.minimum(np.searchsorted(mine, theirs), len(mine) - 1)
        return np.where(mine[rows] == theirs, rows, -1).astype(np.int64)

    def names_only(self) -> PreviousRun:
        """Without the columns mapped from the previous table (which is then unmapped)."""
        empty = np.zeros(0, dtype=np.int64)
        return PreviousRun(self.names, empty, empty, empty, empty, self.index_names, self.extensions, self.token_fields)


def names_of(offsets: np.ndarray, blob: np.ndarray) -> np.ndarray:
    """A table's path column as a fixed-width bytes array (one copy, no Python string per path)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    width = max(int(lengths.max()) if n else 1, 1)
    cells = np.zeros((n, width), dtype=np.uint8)
    columns = np.arange(width)[None, :]
    mask = columns < lengths[:, None]
    cells[mask] = blob
    return cells.view(f"S{width}").reshape(n)


def same_dataset(manifest: Manifest, base: str, out: str | None) -> bool:
    if manifest.source.get("format") != INDEX_SOURCE_FORMAT:
        return False
    if out is None:
        return manifest.shards_base is None
    return manifest.shards_base is not None and manifest.shards_base.rstrip("/") == base.rstrip("/")


def load_previous(target: str, base: str, out: str | None, options: SourceOptions) -> PreviousRun | None:
    """The previous index in ``target``, or None; refuses another dataset's."""
    where = redact_url(target)
    local = local_path(target) if is_local(target) else None
    if local is not None and not os.path.exists(os.path.join(local, MANIFEST_NAME)):
        stray = [n for n in os.listdir(local) if TABLE_NAME.match(n)] if os.path.isdir(local) else []
        if stray:
            raise DestinationError(
                f"{where}: holds a shard table ({stray[0]}) but no manifest.json; it is another dataset's or a "
                "broken one. Index into an empty --out folder, or remove it",
                path=where,
            )
        return None
    try:
        manifest = fetch_manifest(target, options=options)
    except ShardkitError:
        if local is not None:
            raise DestinationError(
                f"{where}: holds a manifest.json that is not a valid shardkit manifest; index into an empty --out "
                "folder, or remove it",
                path=where,
            ) from None
        return None  # a remote folder without a manifest
    if not same_dataset(manifest, base, out):
        if manifest.source.get("format") == INDEX_SOURCE_FORMAT:
            what = f"an index of {redact_url(str(manifest.shards_base or manifest.source.get('path')))}"
        else:
            what = "a dataset written by `shardkit write`"
        raise DestinationError(
            f"{where}: already holds another dataset's manifest and shard table ({what}); "
            "pass an empty --out folder (or that dataset's own SOURCE)",
            path=where,
        )
    if manifest.num_removed:
        raise DestinationError(
            f"{where}: {manifest.num_removed:,} samples were removed from this index (`shardkit remove`), and "
            "indexing the shards again would count them back in. Index into a new --out folder, then remove "
            "the same keys there (`shardkit remove NEW --keys FILE`)",
            path=where,
        )
    table = manifest.table
    names: np.ndarray | NumberedNames
    index_names: np.ndarray | NumberedNames
    if table.naming is not None:  # names made for the rows looked up, from their numbers
        names = NumberedNames(table.naming.shard, table.num_shards)
        index_names = NumberedNames(table.naming.index, table.num_shards)
    else:
        names = names_of(table._columns["path_offsets"], table._columns["path_bytes"])
        index_names = names_of(table._columns["index_offsets"], table._columns["index_bytes"])
    versions = np.full(table.num_shards, -1, dtype=np.int64)
    if local is not None and table.file is not None:
        try:
            stored = np.load(os.path.join(local, versions_name(os.path.basename(table.file))), mmap_mode="r",
                             allow_pickle=False)
            if stored.shape == versions.shape and stored.dtype == versions.dtype:
                versions = stored
        except (OSError, ValueError):
            pass  # no sidecar: every shard is read again
    counted = manifest.token_fields or manifest.source.get(TOKENS_COUNTED) is True
    if not counted and any(is_npy_field(e) for e in manifest.extensions):
        # Indexed before token counts were recorded: each shard is read again to count them. (An index that
        # counted and found none, .npy fields of floats or fields that differ between shards, says so.)
        versions = np.full(table.num_shards, -1, dtype=np.int64)
    columns = (names, np.asarray(table.counts), np.asarray(table.num_bytes), np.asarray(table.sha256), versions,
               index_names) + ((np.asarray(table.tokens),) if table.tokens is not None else ())
    if isinstance(names, np.ndarray) and len(names) > 1 and not (names[1:] >= names[:-1]).all():
        # a list's order: sorted copies for lookups
        order = np.argsort(names, kind="stable")
        columns = tuple(column[order] for column in columns)
    # else (a folder's order, numbered names) the table's and the sidecar's mapped columns as they are
    tokens = columns[6] if len(columns) > 6 else None
    return PreviousRun(*columns[:6], extensions=tuple(manifest.extensions), token_fields=manifest.token_fields,
                       tokens=tokens)
