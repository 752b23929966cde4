"""``shardkit remove`` on a view or an extension: the samples leave it alone
(its parents, and other views of them, keep them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from shardkit.format.derived import DerivedManifest, build_rows
from shardkit.format.removed import pack
from shardkit.io.base import SourceOptions
from shardkit.read.catalog import open_location
from shardkit.revise.derived_publish import publish_derived


def remove_from_derived(
    dest: str, manifest: DerivedManifest, keys: Iterable[str], options: SourceOptions, workers: int
) -> dict[str, Any]:
    """Remove ``keys``' samples from the derived dataset at ``dest`` (held):
    a new revision whose rows table lists them. Returns a report's fields."""
    from shardkit.revise.view import _Choice, _select

    wanted = {str(k) for k in keys}
    catalog = open_location(manifest.base, options=options)
    found = _select(catalog, _Choice(keys=frozenset(wanted)), workers, dest)[0]
    rows = manifest.rows
    old = rows.removed if rows.removed is not None else np.zeros(0, dtype=np.uint64)
    hits = [(row, pos) for row, (positions, _) in found.items() for pos in positions.tolist()]
    packed = pack([r for r, _ in hits], [p for _, p in hits]) if hits else np.zeros(0, dtype=np.uint64)
    new = np.setdiff1d(packed, old, assume_unique=True)
    num_found = sum(len(positions) for positions, _ in found.values())
    report = dict(location=dest, num_keys=len(wanted), num_removed=len(new), num_already_removed=0,
                  num_missing=max(len(wanted) - num_found, 0), missing=())  # fmt: skip
    if not len(new):
        return dict(report, num_removed_total=len(old), num_samples=int(catalog.counts.sum()), fingerprint=manifest.fingerprint)
    removed = np.union1d(old, new).astype(np.uint64)
    per_row = np.bincount((new >> np.uint64(32)).astype(np.int64), minlength=rows.num_rows)
    revised_rows = build_rows(rows.parent, rows.parent_row, rows.counts - per_row, rows.select_kind,
                              rows.select_offsets, rows.select_positions, removed)
    revised = dataclasses.replace(
        manifest, rows=revised_rows,
        earlier_fingerprints=(*manifest.earlier_fingerprints, manifest.fingerprint)[-10_000:],
    )
    publish_derived(dest, revised, command="remove", held=True)
    return dict(report, num_removed_total=len(removed), num_samples=int(catalog.counts.sum()) - len(new),
                fingerprint=revised.fingerprint)
