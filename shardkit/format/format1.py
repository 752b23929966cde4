"""Format 1 manifests, which listed every shard in the JSON (before the
shard table): read into a table, as slowly as ever."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from shardkit.errors import ManifestError
from shardkit.format.table import ShardTable, build_table

_ENTRY_KEYS = frozenset(("path", "index", "num_samples", "num_bytes", "sha256"))


def table_from_list(shards: list[dict[str, Any]], where: str, location: str | None) -> tuple[ShardTable, str]:
    """A format-1 shard list as a table, and its fingerprint (from the JSON strings)."""
    for i, entry in enumerate(shards):
        if entry.keys() != _ENTRY_KEYS:
            raise ManifestError(
                f"{where}: malformed manifest (shard {i} has keys {sorted(entry)[:8]}, wants {sorted(_ENTRY_KEYS)}); "
                "rewrite it with `shardkit write`",
                path=location,
            )
    digest = hashlib.sha256()
    for entry in shards:
        digest.update(f"{entry['path']}\0{entry['sha256']}\0{entry['num_samples']}\n".encode("utf-8", "surrogatepass"))
    n = len(shards)
    try:
        table = build_table(
            np.fromiter((s["num_samples"] for s in shards), dtype=np.int64, count=n),
            np.fromiter((s["num_bytes"] for s in shards), dtype=np.int64, count=n),
            [s["sha256"].lower() for s in shards],
            paths=[s["path"] for s in shards],
            index_paths=[s["index"] for s in shards],
        )
    except ValueError as exc:
        raise ManifestError(
            f"{where}: a shard's sha256 must be 64 hex digits ({exc}); the manifest is damaged. "
            "Rewrite it with `shardkit write`.",
            path=location,
        ) from None
    return table, digest.hexdigest()


