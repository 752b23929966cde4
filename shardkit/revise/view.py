"""Views: subsets, splits and merges of datasets, without copies
(``shardkit view``, :func:`view`; the format is :mod:`shardkit.format.derived`).

Each source's samples are read once (in ``workers`` processes, a group of
shards a task), as the reader reads them: only the fields the choice needs
(keys alone for ``keys`` and ``split``). Each sample kept is one stored
position of its shard; a view's row lists them (or, where it keeps most of
a shard, those it leaves out). Nothing is copied.

- ``keys``: the samples whose key is listed.
- ``where``: one comparison, ``FIELD OP VALUE`` (:func:`parse_where`), over
  a member of each sample (``json.score``: the ``score`` of the JSON member;
  ``score.txt``: a text member read as a number) or a column of a Parquet
  or CSV table keyed by ``__key__``.
- ``split``: ``{"val": 0.02, "train": 0.98}``, one view each, by a seeded
  hash of the key (:func:`split_of`): a key's split depends on nothing but
  the key and the seed, so it stays put when its dataset gains data, and no
  key is in two.
- Several sources merge into one view (with or without a choice); a key
  in two of them is refused, naming it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import UsageError
from shardkit.format.derived import LISTS_DROPPED, LISTS_KEPT, DerivedManifest, ParentRef, build_rows
from shardkit.format.manifest import MANIFEST_NAME
from shardkit.io.base import SourceOptions
from shardkit.io.urls import is_local, local_path
from shardkit.read.catalog import open_location
from shardkit.read.derived import kept, side_fields, stored_counts
from shardkit.read.joined import reader_type
from shardkit.read.split import Piece
from shardkit.revise.derived_publish import publish_derived, refuse_occupied
from shardkit.revise.keys import read_keys
from shardkit.write.pool import group_size, in_groups, run_in_pool

#: Operators of a ``where`` expression.
OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
}
_WHERE = re.compile(r"^\s*([^\s<>=!]+)\s*(==|!=|<=|>=|<|>)\s*(.+?)\s*$")
#: The key column of a ``where`` table.
TABLE_KEY = "__key__"
_MAX_GROUP = 16


@dataclass(frozen=True)
class Where:
    """A parsed ``FIELD OP VALUE``."""

    field: str
    op: str
    value: Any

    def __str__(self) -> str:
        return f"{self.field} {self.op} {json.dumps(self.value)}"

    def test(self, found: Any) -> bool:
        try:
            return bool(OPERATORS[self.op](found, self.value))
        except TypeError:  # a string against a number: not kept
            return False


def parse_where(text: str) -> Where:
    """``'json.score > 0.5'`` as a :class:`Where`; the value is JSON (a
    number, a quoted string, true, false, null) or else a bare string.

    Raises:
        UsageError: Not ``FIELD OP VALUE``.
    """
    found = _WHERE.match(text or "")
    if not found:
        raise UsageError(
            f"--where {text!r}: expected one comparison FIELD OP VALUE, e.g. 'json.score > 0.5' "
            f"(operators {' '.join(OPERATORS)})"
        )
    field, op, raw = found.groups()
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return Where(field, op, value)


def field_value(fields: Mapping[str, bytes], name: str) -> tuple[bool, Any]:
    """The value ``name`` names in a sample's members: a member (the
    longest that ``name`` starts with), then a path into its JSON.
    Returns (found, value)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        member = ".".join(parts[:cut]).lower()
        if member in fields:
            value = _decoded(member, fields[member])
            for step in parts[cut:]:
                if not isinstance(value, dict) or step not in value:
                    return False, None
                value = value[step]
            return True, value
    return False, None


def _decoded(member: str, data: bytes) -> Any:
    if member.endswith("json"):
        try:
            return json.loads(data)
        except ValueError:
            return None
    if member.endswith("npy"):
        import io

        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError:
            return None
        return array.item() if array.size == 1 else None
    text = data.decode("utf-8", "replace").strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def split_of(key: str, seed: int, bounds: Sequence[float]) -> int:
    """The split a key falls in: its seeded hash as a fraction in [0, 1),
    against the splits' cumulative ``bounds``; -1 past the last."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8, key=str(int(seed)).encode()).digest()
    u = int.from_bytes(digest, "big") / 2**64
    for i, bound in enumerate(bounds):
        if u < bound:
            return i
    return -1


def _key_digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class _Choice:
    """What each sample is tested against; pickled to the workers."""

    keys: frozenset[str] | None = None
    where: Where | None = None
    table: Mapping[str, Any] | None = None
    splits: tuple[float, ...] | None = None
    seed: int = 0

    def outputs(self) -> int:
        return len(self.splits) if self.splits is not None else 1

    def of(self, key: str, fields: Mapping[str, bytes]) -> int:
        """Which output the sample goes to; -1: none."""
        if self.keys is not None:
            return 0 if key in self.keys else -1
        if self.splits is not None:
            return split_of(key, self.seed, self.splits)
        if self.where is not None:
            if self.table is not None:
                found, value = key in self.table, self.table.get(key)
            else:
                found, value = field_value(fields, self.where.field)
            return 0 if found and self.where.test(value) else -1
        return 0

    def fields(self) -> list[str] | None:
        """The members to read: none but the key, or the ``where`` field's."""
        if self.where is not None and self.table is None:
            return None  # resolved against the source's fields (see _read_fields)
        return []


@dataclass(frozen=True)
class ViewReport:
    """What :func:`view` made.

    Attributes:
        location: The view's folder.
        num_samples: Samples it keeps.
        num_shards: Shards (rows) it reads.
        num_source_samples: Samples of its sources.
        manifest: Its manifest.
    """

    location: str
    num_samples: int
    num_shards: int
    num_source_samples: int
    manifest: DerivedManifest


def view(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    *,
    keys: str | os.PathLike[str] | Iterable[str] | None = None,
    key_column: str | None = None,
    where: str | None = None,
    table: str | os.PathLike[str] | None = None,
    split: Mapping[str, float] | None = None,
    seed: int = 0,
    workers: int | None = None,
    overwrite: bool = False,
    source_options: SourceOptions | None = None,
) -> ViewReport | dict[str, ViewReport]:
    """Make a view of ``sources`` in ``dest`` (see the module docstring).

    Args:
        sources: One dataset, or several to merge (folders or URLs; views
            and extensions too).
        dest: The view's folder (with ``split``: one folder per split inside it).
        keys: A keys file (one per line, or a Parquet/CSV column
            ``key_column``), or the keys themselves.
        where: ``FIELD OP VALUE``.
        table: A Parquet or CSV file keyed by ``__key__`` whose column
            ``where`` names.
        split: Split names and fractions (at most 1 in all).
        seed: The split's seed.
        workers: Processes reading the sources (default: the CPU count).
        overwrite: Replace a view already in ``dest``.
        source_options: How to read remote sources.

    Returns:
        A :class:`ViewReport`, or with ``split`` one per split name.

    Raises:
        UsageError: Bad arguments, more than one choice, a key in two sources.
        ManifestError: A source that cannot be opened.
        DestinationError: ``dest`` holds something else.
    """
    options = source_options or SourceOptions()
    names = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    if not names:
        raise UsageError("view: give at least one source")
    chosen = [c for c in (keys is not None, where is not None, split is not None) if c]
    if len(chosen) > 1:
        raise UsageError("view: give one of keys, where and split")
    if table is not None and where is None:
        raise UsageError("view: a table is read by --where 'COLUMN OP VALUE'")
    if len(names) == 1 and not chosen:
        raise UsageError("view: of one source, give keys, where or split (a merge takes several sources)")
    choice, split_names = _choice(keys, key_column, where, table, split, seed)
    dest = os.fspath(dest)
    outputs = [dest] if split_names is None else [os.path.join(dest, name) for name in split_names]
    for out in outputs:
        if not is_local(out):
            raise UsageError(f"{out}: a view is written to a local folder")
        refuse_occupied(local_path(out), overwrite=overwrite, command="view")
    parents = [open_location(n, options=options) for n in names]
    layouts = {side_fields(p) for p in parents}
    if len(layouts) > 1:
        raise UsageError(f"view: the sources' samples have different fields ({sorted(layouts)[:2]}); merge like with like")
    selected = [_select(p, choice, workers, names[i]) for i, p in enumerate(parents)]
    if len(parents) > 1:
        _refuse_collisions(selected, names)
    how = _how(choice, names, split_names, keys)
    reports = {}
    for k, out in enumerate(outputs):
        folder = local_path(out)
        manifest = _manifest(parents, names, folder, [s[k] for s in selected], how if split_names is None else f"{how}: {split_names[k]}")
        publish_derived(folder, manifest)
        reports[split_names[k] if split_names else ""] = ViewReport(
            folder, manifest.num_samples, manifest.num_shards, sum(int(np.sum(p.counts)) for p in parents), manifest
        )
    return reports[""] if split_names is None else reports


def _choice(keys: Any, key_column: str | None, where: str | None, table: Any, split: Mapping[str, float] | None, seed: int) -> tuple[_Choice, list[str] | None]:
    if keys is not None:
        listed = read_keys(os.fspath(keys), column=key_column) if isinstance(keys, (str, os.PathLike)) else [str(k) for k in keys]
        return _Choice(keys=frozenset(listed)), None
    if split is not None:
        if not split:
            raise UsageError("--split: name at least one split, e.g. val=0.02 train=0.98")
        for name, fraction in split.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (".", ".."):
                raise UsageError(f"--split: {name!r} is not a plain folder name")
            if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1 or math.isnan(fraction):
                raise UsageError(f"--split {name}={fraction}: a fraction is in (0, 1]")
        total = sum(split.values())
        if total > 1 + 1e-9:
            raise UsageError(f"--split: the fractions add up to {total:g}, more than 1")
        bounds = tuple(float(b) for b in np.cumsum(list(split.values())))
        return _Choice(splits=bounds, seed=int(seed)), list(split)
    if where is not None:
        parsed = parse_where(where)
        return _Choice(where=parsed, table=None if table is None else _read_table(os.fspath(table), parsed.field)), None
    return _Choice(), None


def _read_table(path: str, column: str) -> dict[str, Any]:
    """``__key__`` -> ``column`` of a Parquet or CSV table."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such table")
    if path.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        have = pq.read_schema(path).names
        if TABLE_KEY not in have or column not in have:
            raise UsageError(f"{path}: needs columns {TABLE_KEY!r} and {column!r} (it has {', '.join(have)})")
        data = pq.read_table(path, columns=[TABLE_KEY, column])
        return dict(zip(map(str, data.column(TABLE_KEY).to_pylist()), data.column(column).to_pylist()))
    if path.lower().endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            have = reader.fieldnames or []
            if TABLE_KEY not in have or column not in have:
                raise UsageError(f"{path}: needs columns {TABLE_KEY!r} and {column!r} (it has {', '.join(have)})")
            return {row[TABLE_KEY]: _decoded("txt", row[column].encode()) for row in reader}
    raise UsageError(f"{path}: a --table is a .parquet or .csv file keyed by {TABLE_KEY!r}")


def _how(choice: _Choice, names: list[str], split_names: list[str] | None, keys: Any) -> str:
    if choice.keys is not None:
        what = f"keys {os.fspath(keys)}" if isinstance(keys, (str, os.PathLike)) else "keys given"
        return f"{what} ({len(choice.keys):,} keys)"
    if choice.splits is not None:
        fractions = np.diff((0.0,) + choice.splits)
        return "split " + " ".join(f"{n}={f:g}" for n, f in zip(split_names or (), fractions)) + f", seed {choice.seed}"
    if choice.where is not None:
        return f"where {choice.where}" + (" (table)" if choice.table is not None else "")
    return f"merge of {len(names)} datasets"


# -------------------------------------------------------------- selection


def _select(catalog: Any, choice: _Choice, workers: int | None, name: str) -> list[dict[int, tuple[np.ndarray, np.ndarray]]]:
    """For each output: row -> (stored positions selected, key digests)."""
    fields = choice.fields()
    if fields is None:
        fields = _read_fields(catalog, choice.where.field, name)  # type: ignore[union-attr]
    n = int(catalog.num_shards) if hasattr(catalog, "num_shards") else catalog.num_rows
    rows = [r for r in range(n) if int(catalog.counts[r])]
    workers = max(1, workers or os.cpu_count() or 1)
    outs: list[dict[int, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(choice.outputs())]
    groups = in_groups(rows, group_size(len(rows), workers, most=_MAX_GROUP, per_worker=4))
    if workers == 1 or len(rows) <= 1:
        _start(catalog, choice, fields)
        results: Iterable[Any] = (r for g in groups for r in _select_rows(g))
    else:
        results = run_in_pool(_select_rows, groups, workers, initializer=_start, initargs=(catalog, choice, fields))
    for row, per_output in results:
        for k, (positions, digests) in enumerate(per_output):
            if len(positions):
                outs[k][row] = (positions, digests)
    return outs


def _read_fields(catalog: Any, field: str, name: str) -> list[str]:
    have = sorted({f for names in side_fields(catalog) for f in names})
    parts = field.split(".")
    for cut in range(len(parts), 0, -1):
        member = ".".join(parts[:cut]).lower()
        if member in have:
            return [member]
    raise UsageError(f"--where {field}: {name} has no such member (its samples have {', '.join(have)})")


_worker: dict[str, Any] = {}


def _start(catalog: Any, choice: _Choice, fields: list[str]) -> None:
    _worker.update(catalog=catalog, choice=choice, fields=fields)


def _select_rows(rows: list[int]) -> list[tuple[int, list[tuple[np.ndarray, np.ndarray]]]]:
    catalog, choice, fields = _worker["catalog"], _worker["choice"], _worker["fields"]
    reading = _projected(catalog, fields)
    reader = reader_type(reading)(
        reading, on_error="raise", on_skip=lambda exc: None, options=SourceOptions(), read_ahead_bytes=64 << 20
    )
    out = []
    for row in rows:
        chosen: list[list[int]] = [[] for _ in range(choice.outputs())]
        digests: list[list[int]] = [[] for _ in range(choice.outputs())]
        for _, position, raw in reader.read(iter([Piece(row, 0, int(catalog.counts[row]))])):
            k = choice.of(raw.key, raw.fields)
            if k >= 0:
                chosen[k].append(position)
                digests[k].append(_key_digest(raw.key))
        stored = kept(catalog, 0, row)
        out.append((row, [(stored[np.asarray(c, dtype=np.int64)], np.asarray(d, dtype=np.uint64)) for c, d in zip(chosen, digests)]))
    return out


def _projected(catalog: Any, fields: list[str]) -> Any:
    """The catalog to read ``fields`` of (the key alone: the first side)."""
    if hasattr(catalog, "projected"):
        if not fields:
            return catalog.side(0)
        return catalog.projected(fields)
    return catalog


def _refuse_collisions(selected: list[list[dict[int, tuple[np.ndarray, np.ndarray]]]], names: list[str]) -> None:
    for k in range(len(selected[0])):
        digests = [np.concatenate([d for _, d in s[k].values()] or [np.zeros(0, np.uint64)]) for s in selected]
        owner = np.concatenate([np.full(len(d), i) for i, d in enumerate(digests)])
        joined = np.concatenate(digests)
        order = np.argsort(joined, kind="stable")
        same = np.flatnonzero(joined[order][1:] == joined[order][:-1])
        if len(same):
            a, b = owner[order][same[0]], owner[order][same[0] + 1]
            raise UsageError(
                f"view: {names[a]} and {names[b]} hold a sample of the same key (key digest "
                f"{int(joined[order][same[0]]):016x}); a merged view needs distinct keys: remove one "
                "(`shardkit remove`) or view the sources apart"
            )


# ------------------------------------------------------------- the manifest


def _manifest(parents: list[Any], names: list[str], folder: str, selected: list[dict[int, tuple[np.ndarray, np.ndarray]]], how: str) -> DerivedManifest:
    parent, parent_row, counts, kinds, lengths, positions = [], [], [], [], [], []
    for i, chosen in enumerate(selected):
        sizes = stored_counts(parents[i])
        for row in sorted(chosen):
            keep = chosen[row][0]
            stored = int(sizes[row])
            dropped = np.setdiff1d(np.arange(stored, dtype=np.int64), keep, assume_unique=True)
            listed, kind = (keep, LISTS_KEPT) if len(keep) <= len(dropped) else (dropped, LISTS_DROPPED)
            parent.append(i)
            parent_row.append(row)
            counts.append(len(keep))
            kinds.append(kind)
            lengths.append(len(listed))
            positions.append(listed)
    offsets = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    rows = build_rows(
        np.asarray(parent), np.asarray(parent_row), np.asarray(counts), np.asarray(kinds), offsets,
        np.concatenate(positions) if positions else np.zeros(0),
    )
    refs = tuple(ParentRef(parent_path(folder, n), p.fingerprint) for n, p in zip(names, parents))
    first = parents[0]
    return DerivedManifest(
        kind="view", parents=refs, rows=rows, extensions=tuple(sorted({f for names_ in side_fields(first) for f in names_})),
        how=how[:1000], class_names=_class_names(first),
    )


def _class_names(catalog: Any) -> tuple[str, ...] | None:
    manifest = catalog.manifest
    names = getattr(manifest, "class_names", None)
    return None if names is None else tuple(names)


def parent_path(folder: str, source: str) -> str:
    """How the view at ``folder`` names ``source``: a relative path, or the URL."""
    if not is_local(source):
        return source.rstrip("/")
    target = local_path(source)
    if target.endswith(MANIFEST_NAME):
        target = os.path.dirname(target)
    return os.path.relpath(os.path.abspath(target), os.path.abspath(folder))
