"""Adding fields to every sample of a dataset without touching its shards
(``shardkit extend``, :func:`extend`; the format is :mod:`shardkit.format.derived`).

``fn`` is called on each sample the parent yields, shard by shard (in
``workers`` processes, or Ray tasks), as ``{"__key__": key, FIELD: bytes,
...}`` (the members ``fields=`` names, or all), and returns a dict of new
fields (encoded as ``write --map`` encodes them) or None. Each parent shard
gets one shard of the new members, ``DEST/fields/shard-NNNNNN.tar`` with its
offset index: the same samples, in the same order, under the same keys (a
sample given None holds one empty ``shardkit-none`` member, so that every
sample keeps its place). DEST's manifest names the parent and the positions
each row covers; readers join the two (:mod:`shardkit.read.joined`).

A shard's bytes depend on its samples and ``fn`` alone, not on how many
workers ran or which finished first. A finished shard is marked done
(``DEST/.shardkit-extend/done/NNNNNN.json``, after the shard is renamed into
place), so a killed run, run again, redoes only the shards in flight. Run
over an extension whose parent has gained shards since (``shardkit
append``), it extends the new shards alone.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import DestinationError, MapError, ShardkitError, UsageError
from shardkit.format.derived import LISTS_DROPPED, LISTS_KEPT, DerivedManifest, ParentRef, build_rows
from shardkit.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.format.naming import WRITER_NAMING
from shardkit.format.table import build_table
from shardkit.io.atomic import atomic_write_bytes
from shardkit.io.base import SourceOptions
from shardkit.io.urls import is_local, local_path
from shardkit.read.catalog import open_location
from shardkit.read.derived import kept, side_fields, stored_counts
from shardkit.read.joined import NO_FIELDS, reader_type
from shardkit.read.split import Piece
from shardkit.revise.derived_publish import holding, publish_derived
from shardkit.revise.view import parent_path
from shardkit.write.encode import sample_fields
from shardkit.write.mapping import MapSpec
from shardkit.write.pool import group_size, in_groups, run_in_pool
from shardkit.write.publish import publish_manifest

WORK = ".shardkit-extend"
_MAX_GROUP = 4


@dataclass(frozen=True)
class ExtendReport:
    """What :func:`extend` did.

    Attributes:
        location: The extension's folder.
        fields: The fields it adds.
        num_samples: Samples it holds.
        num_shards: Its shards (one per parent shard).
        num_extended: Shards written by this run (the others were there).
        bytes_written: Bytes of the shards and indexes this run wrote.
        manifest: Its manifest.
    """

    location: str
    fields: tuple[str, ...]
    num_samples: int
    num_shards: int
    num_extended: int
    bytes_written: int
    manifest: DerivedManifest


def extend(
    parent: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    map: Callable[[dict[str, Any]], dict[str, Any] | None],  # noqa: A002 - the documented name
    fields: Sequence[str] | None = None,
    workers: int | None = None,
    engine: str = "local",
    overwrite: bool = False,
    source_options: SourceOptions | None = None,
) -> ExtendReport:
    """Add the fields ``map`` returns to every sample of ``parent``, in ``dest``.

    Args:
        parent: The dataset (a folder or URL; a view or an extension too).
        dest: The extension's folder (local).
        map: Called on each sample, returns a dict of new fields or None.
            Must pickle (a top-level function).
        fields: The parent's members ``map`` is given (default: all).
        workers: Processes (default: the CPU count).
        engine: ``"local"`` (a process pool) or ``"ray"`` (tasks on the
            cluster ``ray.init`` joined; ``dest`` must be shared by its nodes).
        overwrite: Replace what ``dest`` holds (another extension, another
            function's unfinished run).
        source_options: How to read a remote parent.

    Raises:
        UsageError: A field the parent already has (named), bad arguments.
        MapError: ``map`` failed on a sample (named) or returned no dict.
        DestinationError: ``dest`` holds something else.
    """
    options = source_options or SourceOptions()
    spec = MapSpec(map)
    spec.check()
    if engine not in ("local", "ray"):
        raise UsageError(f"engine must be 'local' or 'ray', not {engine!r}")
    folder = os.fspath(dest)
    if not is_local(folder):
        raise UsageError(f"{folder}: an extension is written to a local folder")
    folder = local_path(folder)
    name = os.fspath(parent)
    catalog = open_location(name, options=options)
    have = sorted({f for side in side_fields(catalog) for f in side})
    if fields is not None and (missing := [f for f in fields if f not in have]):
        raise UsageError(f"extend: {name} has no field {missing[0]!r} (its samples have {', '.join(have)})")
    identity = {"parent": parent_path(folder, name), "map": spec.identity(), "fields": None if fields is None else list(fields)}
    with holding(folder, "extend"):
        before = _previous(folder, identity, overwrite)
        work = os.path.join(folder, WORK, "done")
        os.makedirs(work, exist_ok=True)
        os.makedirs(os.path.join(folder, "fields"), exist_ok=True)
        with open(os.path.join(folder, WORK, "job.json"), "w") as f:
            json.dump(identity, f, sort_keys=True)
        n = _num_rows(catalog)
        first = 0 if before is None else before.num_shards
        todo = [r for r in range(first, n) if not os.path.exists(os.path.join(work, f"{r:06d}.json"))]
        task = _Task(catalog, spec, None if fields is None else tuple(fields), tuple(have), os.path.join(folder, "fields"), work)
        written = sum(r["bytes"] for r in _run(task, todo, workers, engine))
        done = [_done(work, r) for r in range(n)]
        manifest = _publish(folder, catalog, name, done, before, spec.name)
        shutil.rmtree(os.path.join(folder, WORK), ignore_errors=True)
    return ExtendReport(folder, manifest.fields, manifest.num_samples, manifest.num_shards, len(todo), written, manifest)


def _num_rows(catalog: Any) -> int:
    return int(catalog.num_rows if hasattr(catalog, "num_rows") else catalog.num_shards)


def _previous(folder: str, identity: dict, overwrite: bool) -> DerivedManifest | None:
    """The extension already in ``folder`` to extend further, or None;
    refuses another function's work or another dataset unless ``overwrite``."""
    job = os.path.join(folder, WORK, "job.json")
    manifest_path = os.path.join(folder, MANIFEST_NAME)
    if os.path.exists(job):
        with open(job) as f:
            theirs = json.load(f)
        if theirs != identity:
            if not overwrite:
                raise DestinationError(
                    f"{folder}: holds an unfinished extend of {theirs.get('parent')} by {theirs.get('map', {}).get('map')}, "
                    "not this one: run that command again to finish it, or pass --overwrite to start over",
                    path=folder,
                )
            shutil.rmtree(os.path.join(folder, WORK))
    if os.path.exists(manifest_path):
        current = load_manifest(folder)
        same = isinstance(current, DerivedManifest) and current.kind == "extension" and current.parents[0].path == identity["parent"]
        if overwrite:
            for entry in (MANIFEST_NAME, "fields"):
                path = os.path.join(folder, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
            return None
        if not same:
            raise DestinationError(
                f"{folder}: holds another dataset; choose another destination, or pass --overwrite to replace it",
                path=folder,
            )
        return current  # type: ignore[return-value]
    entries = [e for e in os.listdir(folder) if e not in (WORK, "fields")]
    if entries and not overwrite:
        raise DestinationError(f"{folder}: holds other files ({', '.join(sorted(entries)[:3])}); an extension is made in an empty folder", path=folder)
    return None


@dataclass(frozen=True)
class _Task:
    catalog: Any
    spec: MapSpec
    fields: tuple[str, ...] | None
    parent_fields: tuple[str, ...]
    out: str
    work: str


_task: dict[str, _Task] = {}


def _start(task: _Task) -> None:
    _task["task"] = task


def _rows(rows: list[int]) -> list[dict]:
    return [_extend_row(_task["task"], row) for row in rows]


def _run(task: _Task, todo: list[int], workers: int | None, engine: str) -> Iterable[dict]:
    workers = max(1, workers or os.cpu_count() or 1)
    groups = in_groups(todo, group_size(len(todo), workers, most=_MAX_GROUP, per_worker=4))
    if engine == "ray":
        import ray

        remote = ray.remote(_ray_rows)
        return [r for refs in ray.get([remote.remote(task, g) for g in groups]) for r in refs]
    if workers == 1 or len(todo) <= 1:
        _start(task)
        return [r for g in groups for r in _rows(g)]
    return list(run_in_pool(_rows, groups, workers, initializer=_start, initargs=(task,)))


def _ray_rows(task: _Task, rows: list[int]) -> list[dict]:
    return [_extend_row(task, row) for row in rows]


def _extend_row(task: _Task, row: int) -> dict:
    """Write the extension shard of parent row ``row``; mark it done."""
    from shardkit.write.shard import ShardFile

    catalog = task.catalog
    reading = catalog.projected(list(task.fields) if task.fields is not None else None) if hasattr(catalog, "projected") else catalog
    if task.fields is not None and not hasattr(catalog, "projected"):
        reading.fields = frozenset(task.fields)
    reader = reader_type(reading)(reading, on_error="raise", on_skip=lambda exc: None, options=SourceOptions(), read_ahead_bytes=64 << 20)
    path = os.path.join(task.out, WRITER_NAMING.shard.format(row))
    count = int(catalog.counts[row])
    added: set[str] = set()
    with ShardFile(path) as shard:
        for _, _, raw in reader.read(iter([Piece(row, 0, count)])) if count else ():
            sample = {"__key__": raw.key, **raw.fields}
            try:
                produced = task.spec.fn(sample)  # type: ignore[misc]
            except ShardkitError:
                raise
            except Exception as exc:
                raise MapError(f"extend: {task.spec.name} failed on sample {raw.key!r} (shard {row}): {type(exc).__name__}: {exc}") from exc
            if produced is None:
                shard.add(raw.key, [(NO_FIELDS, b"")])
                continue
            if not isinstance(produced, dict):
                raise MapError(f"extend: {task.spec.name} returned {type(produced).__name__} for sample {raw.key!r}; return a dict of new fields or None")
            clash = [f for f in produced if f.lower() in task.parent_fields]
            if clash:
                raise UsageError(f"extend: {task.spec.name} returned field {clash[0]!r} for sample {raw.key!r}, which the parent already has; name new fields")
            _, members = sample_fields({**produced, "__key__": raw.key})
            added.update(ext for ext, _ in members)
            shard.add(raw.key, members or [(NO_FIELDS, b"")])
        written = shard.commit()
    record = {"row": row, "count": written.num_samples, "bytes": written.num_bytes, "sha256": written.sha256, "fields": sorted(added)}
    record["bytes_total"] = written.num_bytes + os.path.getsize(written.index_path)
    atomic_write_bytes(os.path.join(task.work, f"{row:06d}.json"), json.dumps(record).encode())
    return {**record, "bytes": record["bytes_total"]}


def _done(work: str, row: int) -> dict:
    path = os.path.join(work, f"{row:06d}.json")
    if not os.path.exists(path):
        raise DestinationError(f"extend: shard {row} was not written; run the same extend again", path=path)
    with open(path) as f:
        return json.load(f)


def _publish(folder: str, catalog: Any, name: str, done: list[dict], before: DerivedManifest | None, how: str) -> DerivedManifest:
    fields_dir = os.path.join(folder, "fields")
    old = load_manifest(fields_dir) if before is not None else None
    n = len(done)
    first = 0 if old is None else old.num_shards
    counts = np.array([d["count"] for d in done], dtype=np.int64)
    sizes = np.array([d["bytes"] for d in done], dtype=np.int64)
    hashes = [d["sha256"] for d in done]
    new_fields = set().union(*(d["fields"] for d in done)) | (set(before.fields) if before is not None else set())
    if old is not None:
        counts[:first], sizes[:first] = old.table.counts, old.table.num_bytes
        hashes[:first] = [old.table.sha256_hex(i) for i in range(first)]
    table = build_table(counts, sizes, hashes, naming=WRITER_NAMING)
    own = Manifest.from_table(table, extensions=tuple(sorted(new_fields)), source={"format": "extension", "path": name})
    publish_manifest(fields_dir, own)
    sizes0 = stored_counts(catalog)
    parent, parent_row, kinds, lengths, positions = [], [], [], [], []
    for row in range(n):
        if before is not None and row < before.num_shards:
            listed = before.rows.listed(row).astype(np.int64)
            kind = int(before.rows.select_kind[row])
        else:
            keep = kept(catalog, 0, row)
            dropped = np.setdiff1d(np.arange(int(sizes0[row]), dtype=np.int64), keep, assume_unique=True)
            listed, kind = (keep, LISTS_KEPT) if len(keep) < len(dropped) else (dropped, LISTS_DROPPED)
        parent.append(0)
        parent_row.append(row)
        kinds.append(kind)
        lengths.append(len(listed))
        positions.append(listed)
    rows = build_rows(
        np.asarray(parent), np.asarray(parent_row), counts, np.asarray(kinds),
        np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))), np.concatenate(positions) if positions else np.zeros(0),
    )
    parent_fields = tuple(sorted({f for side in side_fields(catalog) for f in side}))
    manifest = DerivedManifest(
        kind="extension", parents=(ParentRef(parent_path(folder, name), catalog.fingerprint),), rows=rows,
        extensions=tuple(sorted(set(parent_fields) | new_fields)), fields=tuple(sorted(new_fields)),
        how=f"extend by {how}", class_names=getattr(catalog.manifest, "class_names", None),
    )
    publish_derived(folder, manifest, command="extend", held=True)
    return manifest
