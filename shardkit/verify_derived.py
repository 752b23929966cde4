"""``shardkit verify`` of a view or an extension: the whole chain it stands on.

Every dataset of the chain is checked once (a parent two views share, once):

- a dataset of shards, and an extension's own shards (``fields/``): as
  :func:`~shardkit.verify.verify_dataset` checks any dataset (each shard's
  size, checksum, tar structure, count and offset index);
- a view or an extension: every row's selection against its parent (the
  positions rise, lie inside the parent's shard, and are samples the parent
  yields), and, for an extension, every sample read joined: its key the
  same in each side, in the same order.

The first fault of a derived dataset is reported, naming it; every dataset
of shards reports all its bad shards, as ``verify`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardkit.errors import ShardkitError
from shardkit.io.base import SourceOptions
from shardkit.read.catalog import open_location
from shardkit.read.derived import DerivedCatalog
from shardkit.read.joined import JoinedReader
from shardkit.read.split import Piece
from shardkit.verify import VerifyReport, verify_dataset


@dataclass
class ChainCheck:
    """One dataset of the chain.

    Attributes:
        location: Where it is.
        kind: ``"dataset"``, ``"fields of an extension"``, ``"view"`` or ``"extension"``.
        num_shards: Its shards (rows).
        error: What is wrong, or None.
        report: A dataset of shards' :class:`~shardkit.verify.VerifyReport`.
    """

    location: str
    kind: str
    num_shards: int
    error: str | None = None
    report: VerifyReport | None = None


@dataclass
class ChainReport:
    """Every dataset of a derived dataset's chain, each checked once."""

    checks: list[ChainCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.error is None for c in self.checks)


def verify_chain(
    location: str,
    *,
    options: SourceOptions | None = None,
    workers: int = 1,
    max_member_bytes: int | None = None,
    on_check: Callable[[ChainCheck], None] | None = None,
) -> ChainReport:
    """Verify the derived dataset at ``location`` and everything it stands on.

    Raises:
        ManifestError: The chain cannot be opened (a parent missing, outside
            what may be named, rewritten since, a cycle).
    """
    options = options or SourceOptions()
    report = ChainReport()
    seen: set[str] = set()

    def add(check: ChainCheck) -> None:
        report.checks.append(check)
        if on_check is not None:
            on_check(check)

    def walk(catalog: Any) -> None:
        if isinstance(catalog, DerivedCatalog):
            where = catalog.manifest.base
            if where in seen:
                return
            seen.add(where)
            for parent in catalog.parents:
                walk(parent)
            if catalog.fields is not None:
                plain(catalog.fields, "fields of an extension")
            add(_check_rows(catalog, options))
            return
        plain(catalog, "dataset")

    def plain(catalog: Any, kind: str) -> None:
        manifest = catalog.manifest
        if manifest.base in seen:
            return
        seen.add(manifest.base)
        checked = verify_dataset(manifest, options=options, workers=workers, max_member_bytes=max_member_bytes,
                                 raise_on_failure=False)  # fmt: skip
        error = None if not checked.num_failed else f"{checked.num_failed} bad shard(s): {checked.failures[0]}"
        add(ChainCheck(manifest.base, kind, manifest.num_shards, error, checked))

    walk(open_location(location, options=options))
    return report


def _check_rows(catalog: DerivedCatalog, options: SourceOptions) -> ChainCheck:
    """A derived dataset's rows against its parents, and an extension's sides read together."""
    manifest = catalog.manifest
    check = ChainCheck(manifest.base, manifest.kind, manifest.num_shards)
    try:
        for row in range(catalog.num_rows):
            for side in range(catalog.num_sides):
                catalog.kept(side, row)
        if catalog.num_sides > 1:
            joined = catalog.projected(None)
            reader = JoinedReader(joined, on_error="raise", on_skip=lambda exc: None, options=options,
                                  read_ahead_bytes=64 << 20)  # fmt: skip
            pieces = (Piece(row, 0, int(catalog.counts[row])) for row in range(catalog.num_rows) if catalog.counts[row])
            for _ in reader.read(pieces):
                pass
    except ShardkitError as exc:
        check.error = str(exc)
    return check
