"""Opening a view or an extension (:mod:`shardkit.format.derived`) for reading.

A derived dataset is opened with its parents, each opened the same way (a
chain of at most :data:`MAX_PARENT_DEPTH`, without cycles). What it yields is
read from *sides*: the parent's data shards (side 0) and, for an extension,
the shards of each extension on the way (one side each, the last its own).
Every side holds the same samples in the same order, so a sample is one
stored position per side; a :class:`SideCatalog` presents one side as the
catalog of ordinary shards the reader knows (:mod:`.catalog`): the shard of
each row, its count, and the positions it does not yield as its removed
ones. :class:`~.joined.JoinedReader` reads several sides side by side.

Takedowns reach every derived dataset when it is opened: the samples a
parent no longer yields (``shardkit remove`` on it, or on its own parents)
are its *takedowns*, stored positions by row; those among a row's selected
samples are taken out of the derived dataset's counts and positions too,
whatever revision of the parent it was made from. A parent whose revision
changed otherwise than by removals and appends is refused.

Memory at open: the rows table is mapped, not read; the per-row arrays held
are the effective counts and each parent's stored counts (8 bytes a row),
and the takedowns (8 bytes a removed sample).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardkit.errors import ManifestError, UsageError
from shardkit.format.derived import DerivedManifest, parent_location
from shardkit.format.manifest import Manifest
from shardkit.format.removed import POSITION_BITS, pack, unpack
from shardkit.io.base import SourceOptions

#: Longest chain of parents a derived dataset may stand on.
MAX_PARENT_DEPTH = 16
#: Rows whose selected positions are kept at hand per side (a reader works
#: through a few shards at a time).
KEPT_CACHE_ROWS = 16

Catalog = Any  # a ShardCatalog or a DerivedCatalog


def open_derived(
    manifest: DerivedManifest, *, options: SourceOptions, open_location: Any, chain: tuple[str, ...] = ()
) -> DerivedCatalog:
    """Open ``manifest`` and its parents for reading.

    Args:
        manifest: The view or extension.
        options: How to read (``allowed_prefixes`` names parents on other
            origins the caller trusts).
        open_location: Opens a parent's location, given ``options`` and ``chain``
            (:func:`~.catalog.open_location`).
        chain: The datasets opened on the way here (cycle and depth checks).

    Raises:
        ManifestError: A parent outside what may be named, a cycle, a chain
            deeper than :data:`MAX_PARENT_DEPTH`, a parent rewritten since,
            rows that do not match a parent's table.
    """
    where = manifest.name
    here = manifest.base.rstrip("/")
    if here in chain:
        raise ManifestError(f"{where}: its parents lead back to it (a cycle: {' -> '.join(chain + (here,))})", path=where)
    if len(chain) >= MAX_PARENT_DEPTH:
        raise ManifestError(
            f"{where}: stands on a chain of more than {MAX_PARENT_DEPTH} parents; make it from a dataset nearer "
            "the data (a view of a view keeps what the last one keeps)",
            path=where,
        )
    parents = []
    for ref in manifest.parents:
        location = parent_location(manifest.base, ref.path, allowed_prefixes=options.allowed_prefixes, where=where)
        parent = open_location(location, options=options, chain=chain + (here,))
        _check_revision(manifest, ref.path, ref.fingerprint, parent)
        parents.append(parent)
    fields = None
    if manifest.kind == "extension":
        fields = open_location(manifest.fields_location, options=options, chain=chain + (here,))  # type: ignore[arg-type]
        if isinstance(fields, DerivedCatalog):
            raise ManifestError(f"{where}: its fields dataset is not a dataset of shards", path=where)
    return DerivedCatalog(manifest, tuple(parents), fields)


def _check_revision(manifest: DerivedManifest, path: str, recorded: str, parent: Catalog) -> None:
    """Accept a parent at the revision recorded or one reached from it by
    removals and appends; refuse any other, naming both fingerprints."""
    if parent.fingerprint == recorded or recorded in history(parent):
        return
    again = "shardkit extend" if manifest.kind == "extension" else "shardkit view"
    raise ManifestError(
        f"{manifest.name}: made from revision {recorded[:16]} of {path}, which is now {parent.fingerprint[:16]}, "
        f"not reached from it by removals and appends alone (it was rewritten): run `{again}` again over it",
        path=manifest.name,
    )


def history(catalog: Catalog) -> frozenset[str]:
    """The revisions a dataset had before its removals and appends."""
    if isinstance(catalog, DerivedCatalog):  # and its own revision, before its parents' takedowns since
        return frozenset(catalog.manifest.earlier_fingerprints) | {catalog.manifest.fingerprint}
    manifest: Manifest | None = catalog.manifest
    if manifest is None:
        return frozenset()
    return frozenset(manifest.earlier_fingerprints) | {a.fingerprint for a in manifest.appended}


# ------------------------------------------------ any catalog, by side


def num_sides(catalog: Catalog) -> int:
    return catalog.num_sides if isinstance(catalog, DerivedCatalog) else 1


def side_fields(catalog: Catalog) -> tuple[tuple[str, ...], ...]:
    """The fields each side holds."""
    if isinstance(catalog, DerivedCatalog):
        return catalog.side_fields
    manifest = catalog.manifest
    return (tuple(manifest.extensions) if manifest is not None else (),)


def kept(catalog: Catalog, side: int, row: int) -> np.ndarray:
    """Stored positions row ``row`` yields from side ``side``'s shard, rising."""
    if isinstance(catalog, DerivedCatalog):
        return catalog.kept(side, row)
    stored = catalog.stored_count(row)
    removed = catalog.removed
    if removed is None:
        return np.arange(stored, dtype=np.int64)
    return np.setdiff1d(np.arange(stored, dtype=np.int64), removed.in_shard(row), assume_unique=True)


def base(catalog: Catalog, side: int, row: int) -> tuple[Catalog, int]:
    """The catalog of plain shards and the shard number that side ``side``
    of row ``row`` reads."""
    return catalog.base(side, row) if isinstance(catalog, DerivedCatalog) else (catalog, row)


def takedowns(catalog: Catalog) -> np.ndarray:
    """Samples a dataset's rows select that it does not yield (removed from
    it or from a parent), packed ``row << 32 | position``, rising."""
    if isinstance(catalog, DerivedCatalog):
        return catalog.takedowns
    table = catalog.manifest.table if catalog.manifest is not None else None
    if table is None or table.removed is None:
        return np.zeros(0, dtype=np.uint64)
    return table.removed


def stored_counts(catalog: Catalog) -> np.ndarray:
    """Each row's side-0 shard size (its samples yielded or not)."""
    if isinstance(catalog, DerivedCatalog):
        return catalog.stored0
    counts = np.asarray(catalog.counts, dtype=np.int64)
    gone = takedowns(catalog)
    return counts + np.bincount(unpack(gone)[0], minlength=len(counts)) if len(gone) else counts


def _is_identity(rows: np.ndarray, n: int) -> bool:
    """Whether ``rows`` is ``0, 1, ..., len(rows) - 1`` within ``n`` shards."""
    return len(rows) <= n and (not len(rows) or (int(rows[0]) == 0 and bool((np.diff(rows) == 1).all())))


class DerivedCatalog:
    """A view or an extension with its parents, opened (see the module docstring).

    Attributes:
        manifest: Its manifest.
        parents: Its parents' catalogs (plain or derived).
        fields: An extension's own shards (a plain catalog), or None.
        counts: Samples each row yields now (int64).
        stored0: Each row's side-0 shard size.
        takedowns: What its rows select but do not yield (packed, rising).
    """

    def __init__(self, manifest: DerivedManifest, parents: tuple[Catalog, ...], fields: Catalog | None):
        self.manifest = manifest
        self.parents = parents
        self.fields = fields
        where = manifest.name
        sides = {num_sides(p) for p in parents}
        if len(sides) > 1:
            raise ManifestError(f"{where}: merges parents with different fields (extensions of some only)", path=where)
        self._parent_sides = sides.pop()
        self.num_sides = self._parent_sides + (fields is not None)
        layouts = {side_fields(p) for p in parents}
        if len(layouts) > 1:
            raise UsageError(f"{where}: merges parents whose samples have different fields: {sorted(layouts)[:2]}")
        self.side_fields = layouts.pop() + ((tuple(manifest.fields),) if fields is not None else ())
        self._derive()

    def _derive(self) -> None:
        """The per-row arrays, from the manifest and the parents (again in a
        process it is unpickled in: they are 8 bytes a row, and it travels small)."""
        rows = self.manifest.rows
        where = self.manifest.name
        fields = self.fields
        self.stored0 = self._stored(rows, where)
        recorded = rows.selected_counts(self.stored0) - self._own_removed_per_row()
        if not np.array_equal(recorded, rows.counts):
            bad = int(np.flatnonzero(recorded != rows.counts)[0])
            raise ManifestError(
                f"{where}: row {bad} counts {int(rows.counts[bad])} samples, its kept list selects "
                f"{int(recorded[bad])} of its parent's shard (the kept list does not match the parent's table)",
                path=where,
            )
        if fields is not None:
            own = np.asarray(fields.counts, dtype=np.int64)
            if len(own) != rows.num_rows or not np.array_equal(own, rows.selected_counts(self.stored0)):
                raise ManifestError(
                    f"{where}: its fields dataset does not hold one sample per selected sample of each row "
                    "(the extension is damaged: run `shardkit extend` again)",
                    path=where,
                )
        self.takedowns = self._takedowns(rows)
        if len(self.takedowns):
            taken = np.bincount(unpack(self.takedowns)[0], minlength=rows.num_rows)
            self.counts = np.asarray(rows.selected_counts(self.stored0) - taken, dtype=np.int64)
            self.counts.flags.writeable = False
        else:  # nothing taken down: the table's counts (checked above), a view of its file
            self.counts = rows.counts
        self._kept = functools.lru_cache(maxsize=KEPT_CACHE_ROWS)(self._kept_uncached)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_kept", "counts", "stored0", "takedowns")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derive()

    @property
    def num_rows(self) -> int:
        return self.manifest.rows.num_rows

    @property
    def fingerprint(self) -> str:
        """The manifest's fingerprint, with the parents' takedowns since it
        was made (a reader state of before them belongs to another revision)."""
        own = self.manifest.fingerprint
        propagated = np.setdiff1d(self.takedowns, self.manifest.rows.removed if self.manifest.rows.removed is not None else [])
        if not len(propagated):
            return own
        return hashlib.sha256(own.encode() + propagated.astype("<u8").tobytes()).hexdigest()

    def _stored(self, rows: Any, where: str) -> np.ndarray:
        """Each row's parent shard size; refuses a row naming a shard its
        parent does not have, or one parent shard twice."""
        every = [stored_counts(parent) for parent in self.parents]  # a plain parent's: its counts and removals, once
        if len(every) == 1 and _is_identity(rows.parent_row, len(every[0])):
            # A row per parent shard, in order (a split, an extension): its sizes as they are, no copy.
            return every[0][: rows.num_rows]
        stored = np.zeros(rows.num_rows, dtype=np.int64)
        for i, sizes in enumerate(every):
            mine = np.flatnonzero(rows.parent == i)
            prow = rows.parent_row[mine]
            if len(prow) and int(prow.max()) >= len(sizes):
                raise ManifestError(
                    f"{where}: a row names shard {int(prow.max())} of parent {self.manifest.parents[i].path}, which "
                    f"has {len(sizes)} (the kept list does not match the parent's table)",
                    path=where,
                )
            if len(np.unique(prow)) != len(prow):
                raise ManifestError(f"{where}: two rows name the same shard of parent {self.manifest.parents[i].path}", path=where)
            stored[mine] = sizes[prow]
        return stored

    def _own_removed_per_row(self) -> np.ndarray:
        removed = self.manifest.rows.removed
        n = self.manifest.rows.num_rows
        if removed is None or not len(removed):
            return np.zeros(n, dtype=np.int64)
        rows = unpack(removed)[0]
        if int(rows[-1]) >= n:
            raise ManifestError(f"{self.manifest.name}: removes from row {int(rows[-1])} of {n}", path=self.manifest.name)
        return np.bincount(rows, minlength=n)

    def _takedowns(self, rows: Any) -> np.ndarray:
        """Own removals, and each parent's takedowns among the rows' selected samples."""
        found_rows: list[np.ndarray] = []
        found_positions: list[np.ndarray] = []
        for i, parent in enumerate(self.parents):
            gone = takedowns(parent)
            if not len(gone):
                continue
            prow, position = unpack(gone)
            mine = np.flatnonzero(rows.parent == i)
            order = np.argsort(rows.parent_row[mine], kind="stable")
            sorted_prow = rows.parent_row[mine][order]
            at = np.searchsorted(sorted_prow, prow)
            hit = at < len(sorted_prow)
            hit[hit] = sorted_prow[at[hit]] == prow[hit]
            candidates = mine[order][at[hit]]
            for row, pos in zip(candidates.tolist(), position[hit].tolist()):
                listed = rows.listed(row)
                j = int(np.searchsorted(listed, pos))
                listed_here = j < len(listed) and int(listed[j]) == pos
                if listed_here == (int(rows.select_kind[row]) == 0):
                    found_rows.append(np.array([row]))
                    found_positions.append(np.array([pos]))
        own = rows.removed if rows.removed is not None else np.zeros(0, dtype=np.uint64)
        if not found_rows:
            return np.asarray(own)
        propagated = pack(np.concatenate(found_rows), np.concatenate(found_positions))
        return np.union1d(own, propagated).astype(np.uint64)

    # ------------------------------------------------------------ rows

    def takedowns_in(self, row: int) -> np.ndarray:
        base_key = np.uint64(int(row) << POSITION_BITS)
        lo, hi = np.searchsorted(self.takedowns, [base_key, base_key + np.uint64(1 << POSITION_BITS)])
        return unpack(self.takedowns[lo:hi])[1]

    def kept(self, side: int, row: int) -> np.ndarray:
        """Stored positions row ``row`` yields from side ``side``'s shard.

        Raises:
            ManifestError: The row selects samples its parent does not
                yield, or positions outside the shard.
        """
        return self._kept(int(side), int(row))

    def _kept_uncached(self, side: int, row: int) -> np.ndarray:
        rows = self.manifest.rows
        selected = rows.selection(row, int(self.stored0[row]))
        gone = self.takedowns_in(row)
        mine = np.setdiff1d(selected, gone, assume_unique=True) if len(gone) else selected
        if side == self._parent_sides:  # an extension's own shard holds every selected sample, in order
            return np.searchsorted(selected, mine).astype(np.int64)
        parent = self.parents[int(rows.parent[row])]
        prow = int(rows.parent_row[row])
        theirs = kept(parent, 0, prow)
        at = np.searchsorted(theirs, mine)
        if len(mine) and (int(at[-1]) >= len(theirs) or not np.array_equal(theirs[np.minimum(at, len(theirs) - 1)], mine)):
            raise ManifestError(
                f"{self.manifest.name}: row {row} selects samples that shard {prow} of its parent does not yield "
                "(the kept list does not match the parent's table)",
                path=self.manifest.name,
            )
        return mine if side == 0 else kept(parent, side, prow)[at]

    def base(self, side: int, row: int) -> tuple[Catalog, int]:
        if side == self._parent_sides:
            return self.fields, int(row)
        rows = self.manifest.rows
        return base(self.parents[int(rows.parent[row])], side, int(rows.parent_row[row]))

    def side(self, side: int) -> SideCatalog:
        return SideCatalog(self, side)

    def projected(self, fields: Sequence[str] | None) -> SideCatalog:
        """The catalog to read ``fields`` with (all fields: None): one side,
        or the joined sides that hold them (a :class:`SideCatalog` with
        ``sides``)."""
        wanted = list(range(self.num_sides))
        if fields is not None:
            unknown = [f for f in fields if not any(f in names for names in self.side_fields)]
            if unknown:
                have = sorted({f for names in self.side_fields for f in names})
                raise UsageError(f"{self.manifest.name}: no field {unknown[0]!r}; its samples have {have}")
            wanted = [s for s, names in enumerate(self.side_fields) if any(f in names for f in fields)]
        catalog = SideCatalog(self, wanted[0])
        if len(wanted) > 1 or fields is not None:
            catalog.sides = tuple(SideCatalog(self, s) for s in wanted)
            catalog.fields = None if fields is None else frozenset(fields)
        return catalog


class _NotYielded:
    """A side's positions not yielded, as :class:`~shardkit.format.removed.Removed` gives them."""

    def __init__(self, side: SideCatalog):
        self._side = side

    def __len__(self) -> int:
        return 1  # some, as far as the reader is concerned

    def in_shard(self, shard: int) -> np.ndarray:
        yielded = self._side.derived.kept(self._side.side, shard)
        return np.setdiff1d(np.arange(self._side.stored_count(shard), dtype=np.int64), yielded, assume_unique=True)

    def stored_count(self, counts: np.ndarray, shard: int) -> int:
        return self._side.stored_count(shard)


class SideCatalog:
    """One side of a derived dataset as a catalog of ordinary shards (what
    :class:`~.pieces.PieceReader` and :class:`~.indexed.IndexedDataset`
    read): row ``r`` is its side's shard, and the positions it does not
    yield are that shard's removed ones.

    ``sides`` (set by :meth:`DerivedCatalog.projected`) lists the sides a
    reader joins (see :mod:`.joined`), and ``fields`` the fields it keeps.
    """

    manifest = None
    compressed = False
    has_indexes = True
    token_fields: tuple[str, ...] = ()
    allowed_prefixes: tuple[str, ...] = ()

    def __init__(self, derived: DerivedCatalog, side: int):
        self.derived = derived
        self.side = side
        self.sides: tuple[SideCatalog, ...] | None = None
        self.fields: frozenset[str] | None = None

    @property
    def num_shards(self) -> int:
        return self.derived.num_rows

    @property
    def counts(self) -> np.ndarray:
        return self.derived.counts

    @functools.cached_property
    def starts(self) -> np.ndarray:
        starts = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=starts[1:])
        starts.flags.writeable = False
        return starts

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    @property
    def fingerprint(self) -> str:
        return self.derived.fingerprint

    @property
    def removed(self) -> _NotYielded:
        return _NotYielded(self)

    @property
    def name(self) -> str:
        return self.derived.manifest.name

    def _base(self, shard: int) -> tuple[Any, int]:
        return self.derived.base(self.side, int(shard))

    def url(self, shard: int) -> str:
        catalog, number = self._base(shard)
        return catalog.url(number)

    def index_url(self, shard: int) -> str:
        catalog, number = self._base(shard)
        return catalog.index_url(number)

    @property
    def urls(self) -> Sequence[str]:
        return [self.url(i) for i in range(self.num_shards)]

    def stored_count(self, shard: int) -> int:
        catalog, number = self._base(shard)
        return catalog.stored_count(number)

    def entry(self, shard: int) -> Any:
        """The shard's manifest entry (its size and checksum)."""
        catalog, number = self._base(shard)
        return catalog.entry(number)

    def shard_tokens(self, field: str) -> np.ndarray:
        """Views and extensions record no token counts (refused, naming what to read instead)."""
        raise UsageError(
            f"{self.name}: a view or an extension records no token counts (of {field!r}): read token blocks or "
            "budget batches from the dataset it stands on"
        )

    def document_tokens(self, shard: int, field: str, *, options: Any = None) -> np.ndarray:
        return self.shard_tokens(field)

    def shard_of(self, sample: int) -> tuple[int, int]:
        total = self.num_samples
        if not 0 <= sample < total:
            raise IndexError(f"sample {sample} out of range (the dataset has {total} samples)")
        shard = int(np.searchsorted(self.starts, sample, side="right")) - 1
        return shard, int(sample - self.starts[shard])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("starts", None)
        return state
