"""``shardkit index SOURCE [--out DIR]``: index published tar shards where they are.

Steps:

1. :func:`~shardkit.write.index_source.list_shards` lists SOURCE's shards
   (columnar: names, sizes, versions).
2. Shards that a previous run of ``index`` already indexed, unchanged since
   (same size and version: a local file's ``mtime_ns``, an object's ETag; or,
   for a remote shard listed without a version, the same size), keep their
   entries; the others are read once each, in parallel (a process pool here,
   or one Ray task per shard), by
   :func:`~shardkit.write.index_shard.index_shard`, which writes their
   offset indexes. Shards gone from SOURCE drop out, with their indexes.
3. The shard table is built from arrays, and published with the manifest
   (format 2) through :func:`~shardkit.write.publish.publish_manifest`: the
   table first, ``manifest.json`` last.

Without ``out`` the manifest, table and offset indexes go beside the shards
(SOURCE must be a local, writable folder): the folder becomes a shardkit
dataset whose shards are the published files. With ``out`` they go into
that folder and the manifest declares the shards' base location once,
``"shards_base"`` (see :mod:`shardkit.format.location`): shard paths resolve
under it, index paths under ``out``.

The per-shard versions are kept in a sidecar beside the table,
``shards-<sha16>.versions.npy`` (the table's name with another suffix, so a
sidecar never describes another table), for the next run.

Shards that cannot be indexed (truncated, not tar, vanished, unreadable) are
left out of the table and recorded in the manifest's ``skipped`` list with
the reason; the others are indexed.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import DestinationError, ShardkitError, UsageError
from shardkit.format.compression import SHARD_SUFFIXES
from shardkit.format.index import INDEX_SUFFIX
from shardkit.format.location import resolve_inside
from shardkit.format.manifest import MANIFEST_NAME, Manifest, SkippedInput
from shardkit.format.table import TABLE_NAME, TABLE_SUFFIX, Naming, build_table
from shardkit.io.atomic import atomic_write_bytes, remove_quietly
from shardkit.io.base import SourceOptions
from shardkit.io.manifest import fetch_manifest
from shardkit.io.registry import open_destination
from shardkit.io.urls import is_local, local_path, redact_url
from shardkit.write.index_shard import IndexResult, IndexTask, index_shard, index_shards
from shardkit.write.index_source import ShardListing, join, list_shards
from shardkit.write.publish import publish_manifest

logger = logging.getLogger(__name__)

#: ``manifest.source["format"]`` of a dataset ``shardkit index`` wrote.
INDEX_SOURCE_FORMAT = "index"
#: Suffix of the per-shard versions sidecar (replaces the table's ``.table``).
VERSIONS_SUFFIX = ".versions.npy"
ENGINES = ("local", "ray")
#: Tasks in flight per worker (enough that no worker waits for the driver).
_IN_FLIGHT_PER_WORKER = 4
#: Many small shards go to a worker in groups of up to this many (one
#: round trip to the pool each), so that each worker still gets at least
#: ``_BATCHES_PER_WORKER`` groups.
_MAX_BATCH = 32
_BATCHES_PER_WORKER = 16


@dataclass(frozen=True, kw_only=True)
class IndexOptions:
    """Options of :func:`index_dataset` (and ``shardkit index``).

    Attributes:
        workers: Processes reading shards (None: all cores; 1: in this
            process). With ``engine="ray"``: tasks in flight (None: two per
            cluster CPU).
        engine: ``"local"`` (a process pool here) or ``"ray"``.
        ray_address: With ``engine="ray"``: ``"auto"`` or ``HOST:PORT``.
        source: How to read remote shards and write a remote ``out``.
    """

    workers: int | None = None
    engine: str = "local"
    ray_address: str | None = None
    source: SourceOptions = SourceOptions()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise UsageError(f"workers must be a whole number of at least 1, not {self.workers!r}")


@dataclass(frozen=True)
class IndexReport:
    """What :func:`index_dataset` did.

    Attributes:
        manifest: The published manifest.
        location: Where it was published (redacted).
        num_indexed: Shards read this run.
        num_unchanged: Shards kept from the previous run without reading.
        num_removed: Shards of the previous run gone from SOURCE.
        num_compressed: Compressed shards (stream-only: no offset index).
        bytes_read: Shard bytes read this run.
        seconds: Wall time.
        skipped: Shards left out, and why (also in ``manifest.skipped``).
    """

    manifest: Manifest
    location: str
    num_indexed: int
    num_unchanged: int
    num_removed: int
    num_compressed: int
    bytes_read: int
    seconds: float
    skipped: tuple[SkippedInput, ...] = ()


def index_name_for(names: np.ndarray) -> np.ndarray:
    """Offset-index names for shard names (``a/b.tar`` -> ``a/b.idx``;
    other suffixes keep theirs: ``b.tar.gz`` -> ``b.tar.gz.idx``), as arrays."""
    if len(names) == 0:
        return names
    # np.char throughout: shardkit supports numpy 1.24 and later.
    parts = np.char.rpartition(names, b".tar")
    plain = (parts[:, 1] == b".tar") & (parts[:, 2] == b"")
    stems = np.where(plain, parts[:, 0], names)
    return np.char.add(stems, INDEX_SUFFIX.encode())


_NUMBERED = re.compile(rb"^([A-Za-z0-9_.-]*?)(\d{1,9})\.tar$")


def numbered(names: np.ndarray) -> np.ndarray | None:
    """``names`` made from their positions (``00000.tar``, ``00001.tar``...,
    img2dataset's and shardkit's naming) as a :class:`Naming`'s names, or None."""
    if len(names) == 0:
        return None
    match = _NUMBERED.match(bytes(names[0]))
    if match is None or int(match.group(2)) != 0:
        return None
    prefix, width = match.group(1), len(match.group(2))
    if len(names) > 10**width:
        return None
    digits = np.char.zfill(np.arange(len(names)).astype(f"S{width}"), width)
    expected = np.char.add(np.char.add(prefix, digits), b".tar")
    if not np.array_equal(expected.astype(names.dtype), names):
        return None
    try:
        return Naming(shard=f"{prefix.decode()}{{:0{width}d}}.tar", index=f"{prefix.decode()}{{:0{width}d}}.idx")
    except ValueError:  # a prefix a naming pattern cannot hold (a leading dot)
        return None


def naming_names(naming: Naming, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The shard and index names a :class:`Naming` gives ``n`` shards, as arrays."""
    out = []
    for pattern in (naming.shard, naming.index):
        head, rest = pattern.split("{:0", 1)
        width, tail = int(rest[0]), rest.split("}", 1)[1]
        digits = np.char.zfill(np.arange(n).astype(f"S{max(width, len(str(max(n - 1, 0))))}"), width)
        out.append(np.char.add(np.char.add(head.encode(), digits), tail.encode()))
    return out[0], out[1]


def versions_name(table_file: str) -> str:
    """The versions sidecar of a table file name."""
    return table_file[: -len(TABLE_SUFFIX)] + VERSIONS_SUFFIX


# ------------------------------------------------------------- previous run


@dataclass(frozen=True)
class _Previous:
    """The previous run's entries, sorted by name for lookups."""

    names: np.ndarray
    counts: np.ndarray
    sizes: np.ndarray
    sha256: np.ndarray
    versions: np.ndarray
    index_names: np.ndarray
    extensions: tuple[str, ...]

    def match(self, names: np.ndarray) -> np.ndarray:
        """Each name's row here, or -1."""
        if len(self.names) == 0 or len(names) == 0:
            return np.full(len(names), -1, dtype=np.int64)
        width = max(self.names.dtype.itemsize, names.dtype.itemsize)
        mine, theirs = self.names.astype(f"S{width}"), names.astype(f"S{width}")
        rows = np.minimum(np.searchsorted(mine, theirs), len(mine) - 1)
        return np.where(mine[rows] == theirs, rows, -1).astype(np.int64)


def _names_of(offsets: np.ndarray, blob: np.ndarray) -> np.ndarray:
    """A table's path column as a fixed-width bytes array (one copy, no Python string per path)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    width = max(int(lengths.max()) if n else 1, 1)
    cells = np.zeros((n, width), dtype=np.uint8)
    columns = np.arange(width)[None, :]
    mask = columns < lengths[:, None]
    cells[mask] = blob
    return cells.view(f"S{width}").reshape(n)


def _same_dataset(manifest: Manifest, base: str, out: str | None) -> bool:
    if manifest.source.get("format") != INDEX_SOURCE_FORMAT:
        return False
    if out is None:
        return manifest.shards_base is None
    return manifest.shards_base is not None and manifest.shards_base.rstrip("/") == base.rstrip("/")


def _previous(target: str, base: str, out: str | None, options: SourceOptions) -> _Previous | None:
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
    if not _same_dataset(manifest, base, out):
        if manifest.source.get("format") == INDEX_SOURCE_FORMAT:
            what = f"an index of {redact_url(str(manifest.shards_base or manifest.source.get('path')))}"
        else:
            what = "a dataset written by `shardkit write`"
        raise DestinationError(
            f"{where}: already holds another dataset's manifest and shard table ({what}); "
            "pass an empty --out folder (or that dataset's own SOURCE)",
            path=where,
        )
    table = manifest.table
    if table.naming is not None:
        names, index_names = naming_names(table.naming, table.num_shards)
    else:
        names = _names_of(table._columns["path_offsets"], table._columns["path_bytes"])
        index_names = _names_of(table._columns["index_offsets"], table._columns["index_bytes"])
    versions = np.full(table.num_shards, -1, dtype=np.int64)
    if local is not None and table.file is not None:
        try:
            stored = np.load(os.path.join(local, versions_name(os.path.basename(table.file))), allow_pickle=False)
            if stored.shape == versions.shape and stored.dtype == versions.dtype:
                versions = stored
        except (OSError, ValueError):
            pass  # no sidecar: every shard is read again
    order = np.argsort(names, kind="stable")
    return _Previous(
        names=names[order],
        counts=np.asarray(table.counts)[order],
        sizes=np.asarray(table.num_bytes)[order],
        sha256=np.asarray(table.sha256)[order],
        versions=versions[order],
        index_names=index_names[order],
        extensions=tuple(manifest.extensions),
    )


# ------------------------------------------------------------------ running


def _bounded(
    groups: Iterator[list[IndexTask]],
    submit: Callable[[list[IndexTask]], Any],
    finished: Callable[[list[Any]], tuple[list[Any], list[Any]]],
    collect: Callable[[Any], list[IndexResult]],
    limit: int,
) -> Iterator[IndexResult]:
    """Keep at most ``limit`` groups of tasks submitted; yield results as groups finish.

    ``submit`` starts a group and returns its handle, ``finished`` splits
    handles into (done, still running) once at least one is done, and
    ``collect`` gives a done handle's results. Tasks are drawn from
    ``groups`` only as room frees up, so nothing per shard waits in a queue.
    """
    running: list[Any] = []
    for group in itertools.chain(groups, [None]):  # type: ignore[list-item]
        if group is not None:
            running.append(submit(group))
        while running and (len(running) >= limit or group is None):
            done, running = finished(running)
            for handle in done:
                yield from collect(handle)


def _groups(tasks: Iterator[IndexTask], size: int) -> Iterator[list[IndexTask]]:
    while group := list(itertools.islice(tasks, size)):
        yield group


def _run_local(
    tasks: Iterator[IndexTask], workers: int, options: SourceOptions, *, batch: int = 1
) -> Iterator[IndexResult]:
    """Run tasks in a process pool, ``batch`` shards per pool task."""
    if workers <= 1:
        for task in tasks:
            yield index_shard(task, options)
        return
    from shardkit.write.parallel import _pool_context

    def finished(running: list[Future[list[IndexResult]]]) -> tuple[list[Any], list[Any]]:
        done, rest = wait(running, return_when=FIRST_COMPLETED)
        return list(done), list(rest)

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context())
    try:
        yield from _bounded(
            _groups(tasks, batch),
            lambda group: pool.submit(index_shards, group, options),
            finished,
            lambda future: future.result(),
            workers * _IN_FLIGHT_PER_WORKER,
        )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(tasks: Iterator[IndexTask], options: IndexOptions) -> Iterator[IndexResult]:
    """Run tasks as Ray tasks (one shard each, retried when a worker is lost)."""
    from shardkit.write.engine_ray import connect, default_max_in_flight, require_ray

    ray = require_ray()
    connected = connect(options.ray_address)
    try:
        remote = ray.remote(index_shards).options(num_cpus=1, max_retries=2, name="shardkit_index_shard")
        yield from _bounded(
            _groups(tasks, 1),
            lambda group: remote.remote(group, options.source),
            lambda running: ray.wait(running, num_returns=1),
            ray.get,
            options.workers or default_max_in_flight(ray),
        )
    finally:
        if connected:
            ray.shutdown()


# ------------------------------------------------------------------- driver


def _target(listing: ShardListing, out: str | None) -> str:
    if out is not None:
        return os.path.abspath(local_path(out)) if is_local(out) else out.rstrip("/")
    if not listing.is_local:
        raise UsageError(
            f"{redact_url(listing.base)}: remote shards cannot be indexed in place; pass --out DIR, a local "
            "folder (or s3:// URL) for the manifest, table and offset indexes"
        )
    if not os.access(listing.base, os.W_OK):
        raise UsageError(f"{listing.base}: the shards' folder is read-only; pass --out DIR for the index")
    return listing.base


def _check_base(base: str) -> None:
    if not is_local(base) and ("@" in base.split("://", 1)[-1].split("/", 1)[0] or "?" in base):
        raise UsageError(
            f"{redact_url(base)}: SOURCE has credentials or a query in its URL, which the manifest would keep; "
            "give the shards' plain URL and the credentials the usual way (AWS config, a netrc)"
        )


def index_dataset(
    source: str | Sequence[str],
    *,
    out: str | None = None,
    options: IndexOptions | None = None,
    progress: Callable[[IndexResult], None] | None = None,
) -> IndexReport:
    """Index published tar shards in place (or into ``out``); see the module docstring.

    Args:
        source: A folder of shards (local, ``s3://``, fsspec URL ending in
            ``/``), a brace pattern, one shard, or a list of shards.
        out: Folder for the manifest, table and offset indexes (required
            for remote or read-only shards); None: beside the shards.
        options: Workers, engine, remote options.
        progress: Called with each shard's result as it finishes.

    Returns:
        An :class:`IndexReport`; ``report.skipped`` lists shards left out.

    Raises:
        UsageError: Nothing to index, remote or read-only shards without
            ``out``, credentials in SOURCE's URL.
        DestinationError: The target already holds another dataset.
    """
    options = options or IndexOptions()
    started = time.perf_counter()
    listing = list_shards(source, options=options.source, skip=out if out is not None and is_local(out) else None)
    _check_base(listing.base)
    target = _target(listing, out)
    if is_local(target):
        os.makedirs(target, exist_ok=True)
    previous = _previous(target, listing.base, out, options.source)
    n = listing.num_shards
    index_names = index_name_for(listing.names)
    counts = np.zeros(n, dtype=np.int64)
    sizes = listing.sizes.copy()
    versions = listing.versions.copy()
    sha256 = np.zeros((n, 32), dtype=np.uint8)
    state = np.zeros(n, dtype=np.int8)  # 0 to read, 1 kept, 2 indexed, 3 skipped
    compressed = np.zeros(n, dtype=bool)
    if previous is not None and len(previous.names) == 0:
        previous = None
    rows = np.full(n, -1, dtype=np.int64)
    known = np.full(n, -1, dtype=np.int64)  # a remote shard's size last time, when its listing gave none
    if previous is not None:
        rows = previous.match(listing.names)
        found = rows >= 0
        same = found & (previous.sizes[rows] == sizes) & (previous.versions[rows] == versions) & (versions >= 0)
        same &= previous.index_names[rows] == index_names
        keep = np.flatnonzero(same)
        counts[keep] = previous.counts[rows[keep]]
        sha256[keep] = previous.sha256[rows[keep]]
        state[keep] = 1
        remote_unknown = found & (listing.sizes < 0)
        known[remote_unknown] = previous.sizes[rows[remote_unknown]]
    todo = np.flatnonzero(state == 0)

    def tasks() -> Iterator[IndexTask]:
        for i in todo:  # numpy scalars one at a time (no list of 10^5 ints)
            yield IndexTask(
                number=int(i),
                url=listing.url(i),
                index_name=bytes(index_names[i]).decode("utf-8", "surrogateescape"),
                index_dest=target,
                known_size=int(known[i]),
            )

    workers = options.workers or os.cpu_count() or 1
    workers = max(1, min(workers, len(todo)))
    batch = max(1, min(_MAX_BATCH, len(todo) // (workers * _BATCHES_PER_WORKER)))
    if options.engine == "ray":
        results = _run_ray(tasks(), options)
    else:
        results = _run_local(tasks(), workers, options.source, batch=batch)
    extensions: set[str] = set()
    reasons: dict[int, str] = {}
    bytes_read = 0
    for result in results:
        i = result.number
        if result.reason is not None:
            state[i] = 3
            reasons[i] = result.reason
        elif result.unchanged:
            r = rows[i]
            counts[i], sizes[i], sha256[i], state[i] = previous.counts[r], previous.sizes[r], previous.sha256[r], 1  # type: ignore[union-attr]
        else:
            counts[i], sizes[i] = result.num_samples, result.num_bytes
            if result.version >= 0:  # the file read; else the listing's (an object's ETag)
                versions[i] = result.version
            sha256[i] = np.frombuffer(result.sha256, dtype=np.uint8)
            compressed[i] = result.compressed
            state[i] = 2
            bytes_read += result.num_bytes
            extensions.update(result.extensions)
        if progress is not None:
            progress(result)
    if previous is not None and (state == 1).any():
        extensions.update(previous.extensions)
    ok = (state == 1) | (state == 2)
    skipped = tuple(
        [SkippedInput(path=name, reason=reason) for name, reason in listing.left_out]
        + [SkippedInput(path=listing.name(i), reason=reasons[i]) for i in sorted(reasons)]
    )
    for item in skipped:
        logger.warning("%s: not indexed: %s", item.path, item.reason)
    num_compressed = _count_compressed(listing.names[ok], compressed[ok])
    naming = numbered(listing.names[ok])  # then the table stores no path strings
    if naming is not None:
        table = build_table(counts[ok], sizes[ok], sha256[ok], naming=naming)
    else:
        table = build_table(
            counts[ok], sizes[ok], sha256[ok], paths=listing.names[ok], index_paths=index_names[ok], naming=None
        )
    manifest = Manifest.from_table(
        table,
        extensions=tuple(sorted(extensions)),
        source={"format": INDEX_SOURCE_FORMAT, "path": redact_url(listing.base)},
        skipped=skipped,
        shards_base=listing.base if out is not None else None,
    )
    _publish(target, manifest, versions[ok], options.source)
    num_removed = _remove_dropped(target, previous, index_names[ok]) if previous is not None else 0
    if num_compressed:
        logger.warning(
            "%d of %d shards are compressed (.tar.gz, .tar.zst): counted, but stream-only (no offset index); the "
            "reader reads the dataset whole, shard by shard. Reshard them uncompressed with `shardkit write` for "
            "sample-level splits, IndexedDataset and resume inside a shard",
            num_compressed, int(ok.sum()),
        )
    return IndexReport(
        manifest=manifest,
        location=redact_url(target),
        num_indexed=int((state == 2).sum()),
        num_unchanged=int((state == 1).sum()),
        num_removed=num_removed,
        num_compressed=num_compressed,
        bytes_read=bytes_read,
        seconds=time.perf_counter() - started,
        skipped=skipped,
    )


def _count_compressed(names: np.ndarray, compressed: np.ndarray) -> int:
    """Compressed shards: found so this run, or named so (kept from a previous run)."""
    if len(names) == 0:
        return 0
    lower = np.char.lower(names)
    named = np.zeros(len(names), dtype=bool)
    for suffix in SHARD_SUFFIXES:
        named |= np.char.endswith(lower, suffix.encode())
    return int((compressed | named).sum())


def _publish(target: str, manifest: Manifest, versions: np.ndarray, options: SourceOptions) -> None:
    """The versions sidecar, then (after one sync of the offset indexes) the table and manifest."""
    table_file = manifest.table_file()[0]
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(versions, dtype=np.int64), allow_pickle=False)
    if is_local(target):
        os.sync()  # the offset indexes, written without fsync, reach the disk before the manifest names them
        atomic_write_bytes(os.path.join(target, versions_name(table_file)), buffer.getvalue())
        publish_manifest(target, manifest)
        for name in os.listdir(target):
            if name.endswith(VERSIONS_SUFFIX) and name != versions_name(table_file):
                remove_quietly(os.path.join(target, name))
    else:
        destination = open_destination(target, options=options)
        destination.put_bytes(versions_name(table_file), buffer.getvalue())
        publish_manifest(destination, manifest)


def _remove_dropped(target: str, previous: _Previous, kept: np.ndarray) -> int:
    """Remove the offset indexes of shards gone since the previous run (locally); return how many went."""
    width = max(previous.index_names.dtype.itemsize, kept.dtype.itemsize if len(kept) else 1)
    gone = ~np.isin(previous.index_names.astype(f"S{width}"), kept.astype(f"S{width}"))
    if is_local(target):
        for raw in previous.index_names[gone].tolist():
            try:  # names from the folder's previous manifest: only files inside the folder
                remove_quietly(resolve_inside(target, raw.decode("utf-8", "surrogateescape"), what="offset index"))
            except ShardkitError:
                pass
    return int(gone.sum())
