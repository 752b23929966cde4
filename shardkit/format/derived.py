"""Views and extensions: datasets made over other datasets' shards (issue #54).

A *view* (``shardkit view``) keeps some samples of one or more parents: a
subset, a split, a merge. An *extension* (``shardkit extend``) adds fields to
every sample of one parent; its own shards hold only the new members, one
shard per parent shard, the same samples in the same order. Neither copies a
parent's bytes: each is a revision, a ``manifest.json`` and a *rows table*,
over shards that never change.

``manifest.json`` (``"format_version": 5``, :data:`DERIVED_VERSION`)::

    {"format": "shardkit", "format_version": 5, "kind": "view",
     "parents": [{"path": "../pool", "fingerprint": "<the parent revision's>"}],
     "how": "where json.score > 0.5",
     "num_samples": 1200, "num_shards": 40, "extensions": ["jpg", "json"],
     "fingerprint": "...", "table": {"path": "rows-0123456789abcdef.table", ...}}

An extension also has ``"fields"`` (the extensions it adds) and
``"fields_dataset": "fields"``: the folder of its own shards, an ordinary
dataset of the new members alone. ``"removed"`` appears after ``shardkit
remove`` on the derived dataset, as for any dataset.

A parent's ``path`` is relative to the derived dataset's folder (``..``
allowed) or a URL; :func:`parent_location` confines it (see
``docs/hostile.md``).

The rows table is a file of ``.npy`` columns as the shard table's (see
:mod:`shardkit.format.table`), one row per shard read:

====================  =======  ============================================
column                dtype    meaning
====================  =======  ============================================
``parent``            int32    n: which parent the row's shard is from
``parent_row``        int64    n: the shard's number in that parent
``counts``            int64    n: samples the row keeps (own removals out)
``select_kind``       uint8    n: 0: the listed positions are those kept;
                               1: every position but the listed ones is kept
``select_offsets``    int64    n + 1: row r lists ``positions[o[r]:o[r+1]]``
``select_positions``  uint32   m: stored positions in the parent's shard,
                               rising within each row
``removed``           uint64   r (optional): ``row << 32 | position``
                               removed by ``shardkit remove``
====================  =======  ============================================

Positions are *stored* positions, a sample's place in its shard's tar file
(see :mod:`shardkit.format.removed`), which never change; so a takedown on a
parent names the same positions its views and extensions list, and reaches
them when they are opened (:mod:`shardkit.read.derived`). A row's listed
positions are checked (rising, inside its shard) when the row is first read,
not at open: a 2% view of 5x10^9 samples lists 10^8 of them.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import posixpath
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit.errors import ManifestError
from shardkit.format.location import open_regular, redact_url
from shardkit.format.manifest_checks import DERIVED_VERSION, FORMAT_NAME, MANIFEST_NAME, MAX_COUNT, is_count, short
from shardkit.format.npy import parse_npy_header
from shardkit.format.removed import POSITION_BITS, REMOVED_DTYPE, column_problem, unpack
from shardkit.format.table import encode_columns

KINDS = ("view", "extension")
ROWS_PREFIX = "rows-"
ROWS_SUFFIX = ".table"
#: Most parents one derived dataset names (a merge of this many sources).
MAX_PARENTS = 1024
#: Longest ``how`` text kept in a manifest.
MAX_HOW = 1000
#: Folder of an extension's own shards, inside it.
FIELDS_DATASET = "fields"
#: Select kinds (see the module docstring).
LISTS_KEPT, LISTS_DROPPED = 0, 1

_COLUMNS: tuple[tuple[str, np.dtype], ...] = (
    ("parent", np.dtype("<i4")),
    ("parent_row", np.dtype("<i8")),
    ("counts", np.dtype("<i8")),
    ("select_kind", np.dtype("u1")),
    ("select_offsets", np.dtype("<i8")),
    ("select_positions", np.dtype("<u4")),
)
_ADVICE = "the derived dataset is damaged: make it again (`shardkit view` or `shardkit extend`)"


@dataclass(frozen=True)
class ParentRef:
    """A parent as a derived manifest names it: where, and which revision."""

    path: str
    fingerprint: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "fingerprint": self.fingerprint}


class RowsTable:
    """A derived dataset's rows (see the module docstring), as read-only
    numpy columns over the file's bytes (memory-mapped when local)."""

    def __init__(
        self, columns: Mapping[str, np.ndarray], *, file: str | None = None, keep: Any = None, sha256: str | None = None
    ):
        self.columns = dict(columns)
        self.file = file
        self._keep = keep  # the mmap or bytes the columns view
        self._sha256 = sha256  # of the encoded file, when opened from one (checked then)
        self.parent = self.columns["parent"]
        self.parent_row = self.columns["parent_row"]
        self.counts = self.columns["counts"]
        self.select_kind = self.columns["select_kind"]
        self.select_offsets = self.columns["select_offsets"]
        self.select_positions = self.columns["select_positions"]
        self.removed: np.ndarray | None = self.columns.get("removed")

    @property
    def num_rows(self) -> int:
        return len(self.counts)

    def listed(self, row: int) -> np.ndarray:
        """Row ``row``'s listed positions (uint32, unchecked; see :meth:`selection`)."""
        return self.select_positions[int(self.select_offsets[row]) : int(self.select_offsets[row + 1])]

    def selection(self, row: int, stored: int) -> np.ndarray:
        """The stored positions row ``row`` selects in a parent shard of
        ``stored`` samples (int64, rising), before removals.

        Raises:
            ManifestError: The listed positions do not rise or leave the shard.
        """
        listed = self.listed(row).astype(np.int64)
        if len(listed) and ((listed[1:] <= listed[:-1]).any() or int(listed[-1]) >= stored):
            raise ManifestError(
                f"{self.file or '<rows table>'}: row {row} lists positions that do not rise or that pass the "
                f"{stored} samples of its parent shard (the kept list does not match the parent's table); {_ADVICE}",
                path=self.file,
            )
        if int(self.select_kind[row]) == LISTS_KEPT:
            return listed
        keep = np.ones(stored, dtype=bool)
        keep[listed] = False
        return np.flatnonzero(keep)

    def selected_counts(self, stored: np.ndarray) -> np.ndarray:
        """Samples each row selects (before removals), given each row's
        parent shard size ``stored``."""
        listed = np.diff(self.select_offsets)
        return np.where(self.select_kind == LISTS_KEPT, listed, stored - listed)

    def removed_in(self, row: int) -> np.ndarray:
        """Stored positions removed from row ``row`` (int64, rising)."""
        if self.removed is None:
            return np.zeros(0, dtype=np.int64)
        base = np.uint64(int(row) << POSITION_BITS)
        lo, hi = np.searchsorted(self.removed, [base, base + np.uint64(1 << POSITION_BITS)])
        return unpack(self.removed[lo:hi])[1]

    @property
    def sha256(self) -> str:
        """The SHA-256 of the table's file: known when it was opened from
        one (not hashed again: 10^8 positions are 400 MB), else of its encoding."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.encode()).hexdigest()
        return self._sha256

    def encode(self) -> bytes:
        arrays = [self.columns[name] for name, _ in _COLUMNS]
        if self.removed is not None:
            arrays.append(self.removed)
        return encode_columns(arrays)

    def __reduce__(self) -> tuple[Any, ...]:
        # Columns travel as the file's path when there is one (a 2% view of
        # 5x10^9 samples lists 10^8 positions: the receiver maps it again).
        if self.file is not None and isinstance(self._keep, mmap.mmap):
            return (_reopen_rows, (self.file, self._sha256))
        return (RowsTable, (self.columns,), None)


def build_rows(
    parent: np.ndarray,
    parent_row: np.ndarray,
    counts: np.ndarray,
    select_kind: np.ndarray,
    select_offsets: np.ndarray,
    select_positions: np.ndarray,
    removed: np.ndarray | None = None,
) -> RowsTable:
    """A rows table in memory from its columns (converted to their dtypes)."""
    values = (parent, parent_row, counts, select_kind, select_offsets, select_positions)
    columns = {name: np.ascontiguousarray(v, dtype=dtype) for (name, dtype), v in zip(_COLUMNS, values)}
    if removed is not None:
        columns["removed"] = np.ascontiguousarray(removed, dtype=REMOVED_DTYPE)
    return RowsTable(columns)


def _reopen_rows(file: str, sha256: str | None) -> RowsTable:
    """A table pickled as its file (named by its content; its SHA-256 was checked by the sender)."""
    f, size = open_regular(file, what="rows table")
    with f:
        data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
    return decode_rows(data, file=file, sha256=sha256)


def decode_rows(data: Any, *, file: str | None = None, sha256: str | None = None) -> RowsTable:
    """A rows table from its bytes, its structure checked (shapes, offsets,
    kinds, the removed column); row positions are checked when read."""
    where = file or "<rows table>"
    size = len(data)
    columns: dict[str, np.ndarray] = {}
    pos = 0
    try:
        for name, dtype in (*_COLUMNS, ("removed", REMOVED_DTYPE)):
            if name == "removed" and pos >= size:
                break
            header = parse_npy_header(bytes(data[pos : pos + 4096]))
            if header.dtype() != dtype or len(header.shape) != 1 or header.fortran_order:
                raise ValueError(f"column {name} is not a 1-d {dtype} array")
            count = header.count
            start = pos + header.offset
            end = start + count * dtype.itemsize
            if end > size:
                raise ValueError(f"column {name} runs past the end of the file (truncated)")
            columns[name] = np.frombuffer(data, dtype=dtype, count=count, offset=start)
            pos = -(-end // 64) * 64
        if pos < size:
            raise ValueError(f"{size - pos} bytes after the last column")
        _check_rows(columns)
    except ValueError as exc:
        raise ManifestError(f"{where}: damaged rows table: {exc}; {_ADVICE}", path=file) from None
    return RowsTable(columns, file=file, keep=data, sha256=sha256)


def _check_rows(columns: dict[str, np.ndarray]) -> None:
    n = len(columns["counts"])
    for name in ("parent", "parent_row", "select_kind"):
        if len(columns[name]) != n:
            raise ValueError(f"column {name} has {len(columns[name])} values, the table has {n} rows")
    offsets = columns["select_offsets"]
    if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(columns["select_positions"]):
        raise ValueError("column select_offsets does not run from 0 to the number of listed positions")
    if n and ((np.diff(offsets) < 0).any() or (columns["counts"] < 0).any() or (columns["parent_row"] < 0).any()):
        raise ValueError("a negative count, parent row or row length")
    if n and (columns["select_kind"] > LISTS_DROPPED).any():
        raise ValueError("a select_kind other than 0 or 1")
    if n and int(columns["counts"].sum()) > MAX_COUNT:
        raise ValueError("the counts add up to more than 2**62")
    removed = columns.get("removed")
    if removed is not None:
        # Own removals are among a row's selected samples: at most its listed
        # (kept) positions plus its count, which column_problem bounds.
        problem = column_problem(removed, np.full(n, (1 << POSITION_BITS) - 1, dtype=np.int64))
        if problem:
            raise ValueError(problem)


def rows_name(data: bytes) -> str:
    return f"{ROWS_PREFIX}{hashlib.sha256(data).hexdigest()[:16]}{ROWS_SUFFIX}"


@dataclass(frozen=True)
class DerivedManifest:
    """A view's or an extension's ``manifest.json`` (see the module docstring).

    Attributes:
        kind: ``"view"`` or ``"extension"``.
        parents: The parents, as named (:func:`parent_location` resolves them).
        rows: The rows table.
        extensions: The fields its samples have (a view: its parents'; an
            extension: its parent's and its own).
        fields: The fields an extension adds (empty for a view).
        how: What made it, for ``shardkit info`` (``"where json.score > 0.5"``).
        location: The folder or URL prefix it was loaded from.
        origin: The manifest file or URL, for messages.
        earlier_fingerprints: Before each ``shardkit remove`` on it.
        class_names: Its parents' class names, if they have them.
    """

    kind: str
    parents: tuple[ParentRef, ...]
    rows: RowsTable
    extensions: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    how: str = ""
    location: str | None = field(default=None, compare=False)
    origin: str | None = field(default=None, compare=False)
    earlier_fingerprints: tuple[str, ...] = ()
    class_names: tuple[str, ...] | None = None

    @property
    def num_samples(self) -> int:
        """Samples it keeps as recorded (a parent's takedowns since are
        taken out when it is opened, see :mod:`shardkit.read.derived`)."""
        return int(self.rows.counts.sum())

    @property
    def num_shards(self) -> int:
        return self.rows.num_rows

    @property
    def num_removed(self) -> int:
        return 0 if self.rows.removed is None else len(self.rows.removed)

    @property
    def fingerprint(self) -> str:
        """Its rows table and its parents' revisions, hashed."""
        digest = hashlib.sha256(f"{self.kind}\0{','.join(self.fields)}\0".encode())
        for parent in self.parents:
            digest.update(f"{parent.fingerprint}\n".encode())
        digest.update(bytes.fromhex(self.rows.sha256))
        return digest.hexdigest()

    @property
    def base(self) -> str:
        return self.location if self.location is not None else os.getcwd()

    @property
    def name(self) -> str:
        if self.origin is not None:
            return redact_url(self.origin)
        return redact_url(self.base.rstrip("/") + "/" + MANIFEST_NAME)

    @property
    def fields_location(self) -> str | None:
        """Where an extension's own shards are (a dataset folder), or None."""
        if self.kind != "extension":
            return None
        return self.base.rstrip("/") + "/" + FIELDS_DATASET if "://" in self.base else os.path.join(self.base, FIELDS_DATASET)

    def to_dict(self) -> dict[str, Any]:
        data = self.rows.encode()
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": DERIVED_VERSION,
            "kind": self.kind,
            "parents": [p.to_dict() for p in self.parents],
            "how": self.how,
            "num_samples": self.num_samples,
            "num_shards": self.num_shards,
            "extensions": list(self.extensions),
            "class_names": None if self.class_names is None else list(self.class_names),
            "fingerprint": self.fingerprint,
            "table": {"path": rows_name(data), "num_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
        }
        if self.kind == "extension":
            out["fields"] = list(self.fields)
            out["fields_dataset"] = FIELDS_DATASET
        if self.rows.removed is not None:
            out["removed"] = {"num_samples": self.num_removed, "earlier_fingerprints": list(self.earlier_fingerprints)}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    def to_files(self) -> list[tuple[str, bytes]]:
        """The rows table, then ``manifest.json`` (the commit point)."""
        data = self.rows.encode()
        return [(rows_name(data), data), (MANIFEST_NAME, self.to_json().encode("utf-8"))]

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        location: str | None = None,
        origin: str | None = None,
        open_table: Any = None,
    ) -> DerivedManifest:
        """Check a derived manifest's JSON and open its rows table.

        Raises:
            ManifestError: A field of the wrong type or range, a table whose
                size, SHA-256 or structure is not what the manifest says.
        """
        where = redact_url(origin) if origin else "<manifest>"
        try:
            manifest = cls._from_checked(data, where, location, origin, open_table)
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where}: malformed derived manifest ({short(exc)}); {_ADVICE}", path=location) from None
        stated = (data["num_samples"], data["num_shards"])
        if stated != (manifest.num_samples, manifest.num_shards):
            raise ManifestError(
                f"{where}: the manifest says {stated[0]} samples in {stated[1]} rows, its rows table holds "
                f"{manifest.num_samples} in {manifest.num_shards}; {_ADVICE}",
                path=location,
            )
        if data["fingerprint"] != manifest.fingerprint:
            raise ManifestError(f"{where}: the fingerprint is not its rows' and parents'; {_ADVICE}", path=location)
        return manifest

    @classmethod
    def _from_checked(
        cls, data: Mapping[str, Any], where: str, location: str | None, origin: str | None, open_table: Any
    ) -> DerivedManifest:
        kind = data["kind"]
        if kind not in KINDS:
            raise ValueError(f"kind {short(kind)}")
        parents = data["parents"]
        if not isinstance(parents, list) or not 1 <= len(parents) <= MAX_PARENTS or (kind == "extension" and len(parents) != 1):
            raise ValueError(f"parents must list 1 to {MAX_PARENTS} (an extension: 1), not {short(parents)}")
        refs = []
        for p in parents:
            if not isinstance(p, dict) or set(p) != {"path", "fingerprint"}:
                raise ValueError(f"parent {short(p)}")
            if not isinstance(p["path"], str) or not p["path"] or len(p["path"]) > 4096:
                raise ValueError(f"parent path {short(p['path'])}")
            if not isinstance(p["fingerprint"], str) or len(p["fingerprint"]) != 64:
                raise ValueError(f"parent fingerprint {short(p['fingerprint'])}")
            refs.append(ParentRef(p["path"], p["fingerprint"]))
        for name in ("num_samples", "num_shards"):
            if not is_count(data[name]):
                raise ValueError(f"{name} {short(data[name])}")
        strings = lambda v: isinstance(v, list) and all(isinstance(s, str) and 0 < len(s) < 256 for s in v)  # noqa: E731
        if not strings(data["extensions"]) or not strings(data.get("fields", [])):
            raise ValueError("extensions and fields must be lists of short names")
        if kind == "extension" and data.get("fields_dataset") != FIELDS_DATASET:
            raise ValueError(f"fields_dataset must be {FIELDS_DATASET!r}")
        how = data["how"]
        if not isinstance(how, str) or len(how) > MAX_HOW:
            raise ValueError("how")
        names = data.get("class_names")
        if names is not None and not strings(names):
            raise ValueError("class_names")
        removed = data.get("removed")
        earlier: tuple[str, ...] = ()
        if removed is not None:
            earlier = tuple(removed["earlier_fingerprints"])
            if not all(isinstance(e, str) and len(e) == 64 for e in earlier) or len(earlier) > 10_000:
                raise ValueError("removed.earlier_fingerprints")
        ref = data["table"]
        if not isinstance(ref, dict) or not isinstance(ref.get("path"), str) or not ref["path"].startswith(ROWS_PREFIX) \
                or "/" in ref["path"] or not is_count(ref.get("num_bytes")) or not isinstance(ref.get("sha256"), str):
            raise ValueError(f"table {short(ref)}")
        rows = _open_rows(location, ref, open_table, where)
        if (removed is None) != (rows.removed is None) or (removed is not None and removed["num_samples"] != len(rows.removed)):  # type: ignore[arg-type]
            raise ValueError("the removed count is not the rows table's")
        if len(refs) and rows.num_rows and int(rows.parent.max()) >= len(refs) or (rows.num_rows and int(rows.parent.min()) < 0):
            raise ValueError("a row names a parent the manifest does not list")
        return cls(
            kind=kind, parents=tuple(refs), rows=rows, extensions=tuple(data["extensions"]),
            fields=tuple(data.get("fields", ())), how=how, location=location, origin=origin,
            earlier_fingerprints=earlier, class_names=None if names is None else tuple(names),
        )


def _open_rows(location: str | None, ref: Mapping[str, Any], open_table: Any, where: str) -> RowsTable:
    """The rows table a manifest names, mapped after its size and SHA-256
    are checked: the local file, or a remote one's copy in the table cache
    (``open_table.cached_file``, see :func:`shardkit.io.manifest.remote_table_opener`)."""
    base = location if location is not None else os.getcwd()
    if "://" in base:
        fetch = getattr(open_table, "cached_file", None)
        if fetch is None:
            raise ManifestError(f"{where}: a remote derived manifest is opened through the table cache", path=base)
        file = fetch(base.rstrip("/") + "/" + ref["path"], ref)
    else:
        file = os.path.join(base, ref["path"])
    try:
        f, size = open_regular(file, what="rows table")
    except FileNotFoundError:
        raise ManifestError(f"{file}: the rows table the manifest names is missing; {_ADVICE}", path=file) from None
    with f:
        if size != ref["num_bytes"]:
            raise ManifestError(f"{file}: {size} bytes, the manifest says {ref['num_bytes']}; {_ADVICE}", path=file)
        # Hashed by reads, not through the mapping: the mapping's pages are
        # touched only where rows are read.
        if hashlib.file_digest(f, "sha256").hexdigest() != ref["sha256"]:
            raise ManifestError(f"{file}: SHA-256 is not the one the manifest states (damaged or replaced); {_ADVICE}", path=file)
        data: Any = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
    return decode_rows(data, file=file, sha256=ref["sha256"])


def parent_location(base: str, path: str, *, allowed_prefixes: Sequence[str] = (), where: str) -> str:
    """Where a parent named ``path`` by a derived dataset at ``base`` is.

    A relative path (``..`` allowed: a view beside its pool) is resolved
    against ``base``. A local derived dataset names local parents; a remote
    one names parents on its own origin (scheme and host). Anything else,
    an absolute local path or a URL elsewhere, is refused unless it starts
    with one of ``allowed_prefixes`` (the reader's opt-in naming that origin).

    Raises:
        ManifestError: The parent is outside what may be named, naming both.
    """
    allowed = tuple(p for p in allowed_prefixes if p)
    if "\0" in path or "\\" in path:
        raise ManifestError(f"{where}: parent path {short(path)} holds a NUL or backslash", path=where)
    remote_base = "://" in base
    if "://" in path or path.startswith("/"):
        target = path
    elif remote_base:  # joined by hand: urljoin leaves s3:// and other schemes it does not know alone
        parts = urllib.parse.urlsplit(base)
        joined = posixpath.normpath(posixpath.join(parts.path or "/", path.split("?", 1)[0]))
        target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, joined, "", ""))
    else:
        target = os.path.normpath(os.path.join(base, path))
    if any(target.startswith(p) for p in allowed):
        return target
    if remote_base:
        same = urllib.parse.urlsplit(target)[:2] == urllib.parse.urlsplit(base)[:2] and "://" in target
        if same:
            return target.split("#", 1)[0]
    elif "://" not in path and not path.startswith("/") and not posixpath.isabs(path):
        return target
    raise ManifestError(
        f"{where}: names parent {redact_url(path)}, outside {'its origin' if remote_base else 'the local file system by a relative path'}; "
        f"a derived dataset may name such a parent only when the reader allows it: pass "
        f"allowed_prefixes=[{redact_url(target)!r}] (SourceOptions) if you trust it",
        path=where,
    )
