"""A dataset grown by appends: its table is the table it had, then the new
shards' rows (``shardkit append``, :mod:`shardkit.revise.append`).

The old rows stay as they were, so every old shard keeps its number, its
``removed`` entries keep pointing at the same samples, and the table of the
revision before an append is this table's first rows: the manifest records
each such revision as ``{"fingerprint": ..., "num_shards": N, "source": ...}`` under
``"appended"`` (oldest first), which lets a reader state saved from it
finish its epoch over those N shards. The new table is built from the old
one's columns (no Python object per old shard), in time that grows with the
appended shards: the old shards' names are made only when the new ones do
not follow the old naming.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from shardkit.format.naming import WRITER_NAMING
from shardkit.format.path_column import strings_to_columns
from shardkit.format.table import ShardTable, build_table


@dataclass(frozen=True)
class Appended:
    """A revision of a dataset before an append, as the manifest records it.

    Attributes:
        fingerprint: That revision's fingerprint.
        num_shards: Its shards: the first rows of the table now.
        source: What was appended after it, for people and for the check
            that the same data is not appended twice: the new data's
            source and a digest of the write that staged it
            (``"new/ #1f3a..."``); empty when not recorded.
    """

    fingerprint: str
    num_shards: int
    source: str = ""

    def to_dict(self) -> dict:
        out = {"fingerprint": self.fingerprint, "num_shards": self.num_shards}
        if self.source:
            out["source"] = self.source
        return out


def appended_fingerprint(before: str, new: ShardTable) -> str:
    """The fingerprint of the revision that appends ``new``'s rows to the
    revision whose fingerprint is ``before``: a chain, sha256 of both and of
    the new rows' own fingerprint, so it costs the new rows, not the
    dataset's (the table's own hash of every row costs seconds at 10^6
    shards). Like every fingerprint, it names one revision's content."""
    return hashlib.sha256(f"shardkit append\0{before}\0{new.fingerprint()}".encode()).hexdigest()


def appended_table(old: ShardTable, new: ShardTable) -> ShardTable:
    """``old``'s rows, then ``new``'s.

    Args:
        old: The dataset's table (its ``removed`` column, if any, is kept).
        new: The appended shards' table, without removed samples; its
            token counts, if any, in the same fields and order as ``old``'s.

    Raises:
        ValueError: Token columns that differ in width, or ``new`` with
            removed samples.
    """
    if new.removed is not None:
        raise ValueError("appended shards cannot have removed samples")
    if (old.tokens is None) != (new.tokens is None) or (old.tokens is not None and old.tokens.shape[1] != new.tokens.shape[1]):  # type: ignore[union-attr]
        raise ValueError("the appended shards count tokens of other fields than the dataset's")
    n, m = old.num_shards, new.num_shards
    naming = old.naming
    if naming is not None and not all(
        new.path(j) == naming.shard.format(n + j) and new.index_path(j) == naming.index.format(n + j) for j in range(m)
    ):
        naming = None
    table = build_table(
        np.concatenate([old.counts, new.counts]),
        np.concatenate([old.num_bytes, new.num_bytes]),
        np.concatenate([old.sha256, new.sha256]),
        naming=naming or old.naming or WRITER_NAMING,  # paths replaced below when the names follow none
        tokens=None if old.tokens is None else np.concatenate([old.tokens, new.tokens]),  # type: ignore[list-item]
        removed=old.removed,
    )
    if naming is not None:
        return table
    columns = dict(table._columns)
    for (offsets, blob), (new_offsets, new_blob), prefix in zip(_columns(old), _columns(new), ("path", "index")):
        columns[f"{prefix}_offsets"] = np.concatenate([offsets, new_offsets[1:] + offsets[-1]])
        columns[f"{prefix}_bytes"] = np.concatenate([blob, new_blob])
    for array in columns.values():
        array.flags.writeable = False
    return ShardTable(columns, None)


def _columns(table: ShardTable) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A table's shard and index paths as stored columns, made from its
    naming when it has one (each name made once: O(shards))."""
    stored = table.path_columns()
    if stored is not None:
        return stored
    n = table.num_shards
    return (strings_to_columns((table.path(i) for i in range(n)), n),
            strings_to_columns((table.index_path(i) for i in range(n)), n))  # fmt: skip
