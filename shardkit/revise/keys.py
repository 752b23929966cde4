"""Keys files: the keys ``remove`` and ``view --keys`` are given."""

from __future__ import annotations

import csv
import os

from shardkit.errors import UsageError

#: Column of a Parquet or CSV keys file read when none is named.
DEFAULT_KEY_COLUMN = "key"


def read_keys(path: str, *, column: str | None = None) -> list[str]:
    """The keys a file lists: one per line (blank lines and surrounding
    spaces ignored), or a column of a ``.parquet`` or ``.csv`` file
    (``column``, default :data:`DEFAULT_KEY_COLUMN`).

    Raises:
        UsageError: The file is missing, or has no such column.
    """
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such keys file")
    lower = path.lower()
    if lower.endswith(".parquet"):
        import pyarrow.parquet as pq

        name = column or DEFAULT_KEY_COLUMN
        schema = pq.read_schema(path)
        if name not in schema.names:
            raise UsageError(f"{path}: no column {name!r} (it has {', '.join(schema.names)}); name one with --column")
        return [str(k) for k in pq.read_table(path, columns=[name]).column(name).to_pylist() if k is not None]
    if lower.endswith(".csv"):
        name = column or DEFAULT_KEY_COLUMN
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or name not in reader.fieldnames:
                have = ", ".join(reader.fieldnames or ()) or "none"
                raise UsageError(f"{path}: no column {name!r} (it has {have}); name one with --column")
            return [row[name].strip() for row in reader if row[name] and row[name].strip()]
    if column is not None:
        raise UsageError(f"{path}: --column needs a .parquet or .csv file; a text file lists one key per line")
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return [line.strip() for line in f if line.strip()]
