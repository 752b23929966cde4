"""``shardkit index SOURCE [--out DIR]``: index published tar shards where they are.

Steps:

1. :func:`~shardkit.index.source.list_shards` lists SOURCE's shards
   (columnar: names, sizes, versions; a folder's listing in files).
2. Shards that a previous run of ``index`` already indexed, unchanged since
   (same size and version: a local file's ``mtime_ns``, an object's ETag; or,
   for an http(s) shard, listed without either, the same size and the same
   ETag or Last-Modified when the server sends one), keep their entries; the
   others are read once each, in parallel (a process pool here, or one Ray
   task per shard; a bounded number in flight), by
   :func:`~shardkit.index.shard.index_shard`, which writes their
   offset indexes. Shards gone from SOURCE drop out, with their indexes.
3. The shard table is written a chunk at a time from the results
   (:mod:`~shardkit.index.columns`), and published with the manifest
   (format 2; 3 with token counts, which each shard's reading takes and
   which are recorded when every shard has the same token fields, see
   :mod:`shardkit.format.tokens`) through
   :func:`~shardkit.write.publish.publish_manifest`: the table first,
   ``manifest.json`` last. A previous index that lists a ``.npy`` field but
   no token counts, and does not say it counted them (``source`` holds
   ``"tokens_counted": true`` since it does; see
   :data:`~shardkit.index.previous.TOKENS_COUNTED`), was made before they
   were counted: its shards are read again.

The driver holds no per-shard column in memory for a folder's first index:
the listing, each shard's result and the table being written live in files
in a scratch folder inside the index's folder (``.shardkit-index-*``,
removed at the end, or by the next run if this one is killed) and in a
journal that lets a killed run's rerun go on where it stopped (in the index
folder, or in one of this machine's for a remote one; see
:mod:`~shardkit.index.journal`), read and written a chunk at a time, so its memory
stays flat in the number of shards (what grows is the mapped table it
returns: page cache, shared with every reader). A list or pattern of
shards is held as one bytes array (like the list itself), and a rerun holds
the previous run's shard and index names as bytes arrays; the previous
table's other columns are mapped, not copied.

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
the reason; the others are indexed. When none can be, nothing is published:
the run fails naming the first of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import ShardkitError, SourceError, UsageError
from shardkit.format.location import resolve_inside
from shardkit.format.manifest import Manifest, SkippedInput
from shardkit.format.naming import numbered
from shardkit.format.table import ShardTable, decode_table, open_table, table_name
from shardkit.index.columns import (
    INDEXED,
    KEPT,
    RECORD,
    SKIPPED,
    TO_READ,
    ShardResults,
    count_compressed,
    index_name_for,
    published,
    token_set_of,
    write_table,
    write_versions,
)
from shardkit.index.journal import JOURNAL_DIR, IndexJournal, remote_journal_folder
from shardkit.index.previous import (
    INDEX_SOURCE_FORMAT,
    TOKENS_COUNTED,
    VERSIONS_SUFFIX,
    PreviousRun,
    load_previous,
    versions_name,
)
from shardkit.index.shard import IndexResult, IndexTask, index_shard, index_shards
from shardkit.index.source import ShardListing, list_shards
from shardkit.io.atomic import commit, remove_quietly
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_destination
from shardkit.io.urls import is_local, local_path, redact_url
from shardkit.write.destination import holding_destination
from shardkit.write.occupant import refuse_unfinished_write
from shardkit.write.pool import bounded, group_size, in_groups, run_in_pool
from shardkit.write.publish import publish_manifest
from shardkit.write.scratch import scratch_folder

logger = logging.getLogger(__name__)

ENGINES = ("local", "ray")
#: Where an index run's scratch folder starts (see :func:`_work_parent`).
WORK_PREFIX = ".shardkit-index-"
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
        num_resumed: Shards a killed run into this folder had read, kept
            from its journal (see :mod:`~shardkit.index.journal`).
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
    num_resumed: int = 0


# ------------------------------------------------------------------ running


def _run_local(
    tasks: Iterator[IndexTask], workers: int, options: SourceOptions, *, batch: int = 1
) -> Iterator[IndexResult]:
    """Run tasks in a process pool, ``batch`` shards per pool task."""
    if workers <= 1:
        for task in tasks:
            yield index_shard(task, options)
        return
    yield from run_in_pool(functools.partial(index_shards, options=options), in_groups(tasks, batch), workers)


def _run_ray(tasks: Iterator[IndexTask], options: IndexOptions) -> Iterator[IndexResult]:
    """Run tasks as Ray tasks (one shard each, retried when a worker is lost)."""
    from shardkit.write.engine_ray import connect, default_max_in_flight, require_ray

    ray = require_ray()
    connected = connect(options.ray_address)
    try:
        remote = ray.remote(index_shards).options(num_cpus=1, max_retries=2, name="shardkit_index_shard")
        yield from bounded(
            in_groups(tasks, 1),
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
            f"{redact_url(listing.base)}: remote shards are indexed where --out says: pass --out DIR, a local "
            "folder or an s3:// URL for the manifest, table and offset indexes (the shards' own URL to put "
            "them beside the shards)"
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
        DestinationError: The target already holds another dataset, or
            another index or write into the local target is running.
        SourceError: No shard could be indexed (none is published; the
            message names the first shards and why).
    """
    options = options or IndexOptions()
    started = time.perf_counter()
    with scratch_folder(WORK_PREFIX, _work_parent(source, out)) as work, contextlib.ExitStack() as held:
        return _index(source, out, options, progress, work, started, held)


def _index(
    source: str | Sequence[str],
    out: str | None,
    options: IndexOptions,
    progress: Callable[[IndexResult], None] | None,
    work: str,
    started: float,
    held: contextlib.ExitStack,
) -> IndexReport:
    """:func:`index_dataset` with its scratch folder ``work``; a local
    target folder is held (see :func:`holding_destination`) until ``held``
    closes."""
    listing: ShardListing | None = None
    versions_file: str | None = None
    try:
        skip = out if out is not None and is_local(out) else None
        listing = list_shards(source, options=options.source, skip=skip, spill=work)
        _check_base(listing.base)
        target = _target(listing, out)
        if is_local(target):  # made if missing; one index or write into it at a time
            held.enter_context(holding_destination(target, rerun="stop it and run the index again"))
            refuse_unfinished_write(local_path(target), beside_shards=out is None)
        previous = load_previous(target, listing.base, out, options.source)
        if previous is not None and len(previous.names) == 0:
            previous = None
        # The results outlive a killed run, its rerun goes on from them: in the local
        # index folder, or in one of this machine's for a remote one (held, one run at a time).
        if is_local(target):
            journal = IndexJournal(os.path.join(local_path(target), JOURNAL_DIR), listing, local_path(target))
        else:
            folder = remote_journal_folder(target, options.source)
            held.enter_context(holding_destination(folder, rerun="stop it and run the index again"))
            journal = IndexJournal(folder, listing, None)
        results, num_resumed = journal.open()
        with results:
            num_kept = _keep_unchanged(results, listing, previous, journal)
            run = _index_changed(results, listing, previous, target, options, progress, journal)
            # the fields of the entries kept from the previous run, and of those the killed run read
            reused = num_kept + run.num_unchanged + num_resumed
            kept = set(previous.extensions) if previous is not None and reused else set()
            kept |= journal.extensions
            if not any(published(records).any() for _, records in results.chunks()):
                journal.remove()  # every shard failed: a rerun reads them all again anyway
                raise _nothing_indexed(listing, run)
            if previous is not None:
                previous = previous.names_only()  # the previous table's pages go before the new table's come
            token_fields = _token_fields(results, listing, journal)
            table, versions_file = _write_table(results, listing, target, work, len(token_fields))
            manifest = Manifest.from_table(
                table,
                token_fields=token_fields,
                extensions=tuple(sorted(run.extensions | kept)),
                source={"format": INDEX_SOURCE_FORMAT, "path": redact_url(listing.base), TOKENS_COUNTED: True},
                skipped=tuple(
                    [SkippedInput(path=name, reason=reason) for name, reason in listing.left_out]
                    + [SkippedInput(path=listing.name(i), reason=run.reasons[i]) for i in sorted(run.reasons)]
                ),
                shards_base=listing.base if out is not None else None,
            )
            if manifest.skipped:  # one line, however many: manifest.json lists them all
                first = manifest.skipped[0]
                logger.warning(
                    "%d shard(s) not indexed (manifest.json's 'skipped' lists them), e.g. %s: %s",
                    len(manifest.skipped), first.path, first.reason,
                )
            num_compressed = sum(
                count_compressed(listing.names[start : start + len(records)][published(records)],
                                 records["compressed"][published(records)])
                for start, records in results.chunks()
            )
            _publish(target, manifest, versions_file, options.source)
            num_removed = _remove_dropped(target, previous, results, listing) if previous is not None else 0
        journal.remove()  # published: nothing left to go on from
    finally:
        if listing is not None:
            listing.close()
        if versions_file is not None:
            remove_quietly(versions_file)  # left only when publishing failed (else renamed or in ``work``)
    if not is_local(target):  # the table came from a temporary file: hold it in memory
        manifest = dataclasses.replace(manifest, shards=decode_table(table.encode()[:], table.naming))
    if num_compressed:
        logger.warning(
            "%d of %d shards are compressed (.tar.gz, .tar.zst): counted, but stream-only (no offset index); the "
            "reader reads the dataset whole, shard by shard. Reshard them uncompressed with `shardkit write` for "
            "sample-level splits, IndexedDataset and resume inside a shard",
            num_compressed, manifest.num_shards,
        )
    return IndexReport(
        manifest=manifest,
        location=redact_url(target),
        num_indexed=run.num_indexed,
        num_unchanged=num_kept + run.num_unchanged,
        num_resumed=num_resumed,
        num_removed=num_removed,
        num_compressed=num_compressed,
        bytes_read=run.bytes_read,
        seconds=time.perf_counter() - started,
        skipped=manifest.skipped,
    )


#: How many shards at fault the error of an index that indexed none names.
_NAMED = 3


def _nothing_indexed(listing: ShardListing, run: _Run) -> SourceError:
    """The error of an index run in which no shard could be indexed: an
    empty dataset is not published (a manifest already there stays as it was)."""
    failed = list(listing.left_out)
    failed += [(listing.name(i), run.reasons[i]) for i in sorted(run.reasons)[:_NAMED]]
    named = "; ".join(_described(name, reason) for name, reason in failed[:_NAMED])
    total = len(listing.left_out) + len(run.reasons)
    first = "the first: " if total > _NAMED else ""
    which = "the one shard" if total == 1 else f"all {total} shards"
    base = redact_url(listing.base)
    return SourceError(
        f"{base}: no shard could be indexed ({which} left out); {first}{named}. Nothing was published; fix or "
        "remove these shards, then run `shardkit index` again",
        path=base,
    )


def _described(name: str, reason: str) -> str:
    """``NAME: REASON``, or the reason alone where it names the shard first; no closing full stop."""
    reason = reason.rstrip(".")
    return reason if reason.partition(": ")[0].endswith(name) else f"{name}: {reason}"


def _work_parent(source: str | Sequence[str], out: str | None) -> str | None:
    """Where the scratch folder for the listing and the results goes: in
    the index's folder (a local ``out``, made here, or the shards' folder
    when indexing in place) when it can be written, else the system's
    temporary folder (None). A killed run's is removed by the next run there."""
    if out is not None:
        folder = local_path(out) if is_local(out) else None
        if folder is not None:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError:
                folder = None  # refused later, naming the folder
    else:
        folder = local_path(source) if isinstance(source, str) and is_local(source) else None
    if folder is not None and os.path.isdir(folder) and os.access(folder, os.W_OK):
        return folder
    return None


def _keep_unchanged(
    results: ShardResults, listing: ShardListing, previous: PreviousRun | None, journal: IndexJournal
) -> int:
    """Mark the shards the previous run indexed and that have not changed
    since (same size, version and index name) as kept, with its token
    counts; returns how many."""
    if previous is None:
        return 0
    kept = 0
    for start, records in results.chunks():
        stop = start + len(records)
        names, sizes, versions = listing.names[start:stop], listing.sizes[start:stop], listing.versions[start:stop]
        rows = previous.match(names)
        same = (rows >= 0) & (previous.sizes[rows] == sizes) & (previous.versions[rows] == versions) & (versions >= 0)
        same &= previous.index_names[rows] == index_name_for(names)
        same &= records["state"] == TO_READ  # not one a killed run finished (see journal)
        if same.any():
            records = records.copy()
            records["count"][same] = previous.counts[rows[same]]
            records["size"][same] = sizes[same]
            records["version"][same] = versions[same]
            records["sha256"][same] = previous.sha256[rows[same]]
            _previous_tokens(records, same, rows[same], previous, journal)
            records["state"][same] = KEPT
            results.put(start, records)
            kept += int(same.sum())
    return kept


@dataclass
class _Run:
    """What reading the changed shards found."""

    num_indexed: int = 0
    num_unchanged: int = 0
    bytes_read: int = 0
    extensions: set[str] = dataclasses.field(default_factory=set)
    reasons: dict[int, str] = dataclasses.field(default_factory=dict)  # skipped shards only


def _tasks(
    results: ShardResults, listing: ShardListing, previous: PreviousRun | None, target: str
) -> Iterator[IndexTask]:
    """A task per shard still to read, drawn from the results file a chunk at a time."""
    for start, records in results.chunks():
        todo = np.flatnonzero(records["state"] == TO_READ) + start
        if len(todo) == 0:
            continue
        index_names = index_name_for(listing.names[todo])
        # a remote shard's size and version last time, when its listing gave no size
        known = np.full((len(todo), 2), -1, dtype=np.int64)
        if previous is not None:
            rows = previous.match(listing.names[todo])
            unknown = (rows >= 0) & (listing.sizes[todo] < 0)
            known[unknown, 0] = previous.sizes[rows[unknown]]
            known[unknown, 1] = previous.versions[rows[unknown]]
        for j, i in enumerate(todo):  # numpy scalars one at a time (no list of 10^5 ints)
            yield IndexTask(
                number=int(i),
                url=listing.url(i),
                index_name=bytes(index_names[j]).decode("utf-8", "surrogateescape"),
                index_dest=target,
                known_size=int(known[j, 0]),
                known_version=int(known[j, 1]),
            )


def _index_changed(
    results: ShardResults,
    listing: ShardListing,
    previous: PreviousRun | None,
    target: str,
    options: IndexOptions,
    progress: Callable[[IndexResult], None] | None,
    journal: IndexJournal,
) -> _Run:
    """Read the shards still to read, in parallel; each result goes into its row of ``results``."""
    num_todo = sum(int((records["state"] == TO_READ).sum()) for _, records in results.chunks())
    run = _Run()
    if num_todo == 0:
        return run
    workers = max(1, min(options.workers or os.cpu_count() or 1, num_todo))
    if options.engine == "ray":
        done = _run_ray(_tasks(results, listing, previous, target), options)
    else:
        batch = group_size(num_todo, workers, most=_MAX_BATCH, per_worker=_BATCHES_PER_WORKER)
        done = _run_local(_tasks(results, listing, previous, target), workers, options.source, batch=batch)
    record = np.zeros(1, dtype=RECORD)
    for result in done:
        i = result.number
        record[0] = np.zeros((), dtype=RECORD)
        if result.reason is not None:
            record["state"] = SKIPPED
            run.reasons[i] = result.reason
        elif result.unchanged:
            assert previous is not None
            r = int(previous.match(listing.names[i : i + 1])[0])
            record["count"], record["size"] = previous.counts[r], previous.sizes[r]
            record["sha256"] = previous.sha256[r]
            _previous_tokens(record, np.ones(1, dtype=bool), np.array([r]), previous, journal)
            record["version"] = result.version if result.version >= 0 else listing.versions[i]
            record["state"] = KEPT
            run.num_unchanged += 1
        else:
            record["count"], record["size"] = result.num_samples, result.num_bytes
            # the file's mtime as read, an http object's ETag; else the listing's version (an S3 ETag)
            record["version"] = result.version if result.version >= 0 else listing.versions[i]
            record["sha256"] = np.frombuffer(result.sha256, dtype=np.uint8)
            record["compressed"], record["state"] = result.compressed, INDEXED
            record["token_set"] = journal.token_set(result.token_fields)
            record["tokens"][0, : len(result.token_totals)] = result.token_totals
            run.num_indexed += 1
            run.bytes_read += result.num_bytes
            run.extensions.update(result.extensions)
            journal.note_extensions(set(result.extensions))
        results.put(i, record)
        if progress is not None:
            progress(dataclasses.replace(result, num_to_read=num_todo))
    return run


def _previous_tokens(
    records: np.ndarray, rows: np.ndarray, previous_rows: np.ndarray, previous: PreviousRun, journal: IndexJournal
) -> None:
    """Give ``records[rows]`` the token counts of the previous run's rows ``previous_rows``."""
    records["token_set"][rows] = journal.token_set(previous.token_fields)
    if previous.tokens is not None:
        records["tokens"][rows, : previous.tokens.shape[1]] = previous.tokens[previous_rows]


def _token_fields(results: ShardResults, listing: ShardListing, journal: IndexJournal) -> tuple[str, ...]:
    """The token fields the index records: those of every published shard
    holding samples, or none when they differ (logged; see
    :mod:`shardkit.format.tokens`)."""
    found, differs = token_set_of(results, listing.names)
    if differs is None:
        return journal.token_sets[found]
    logger.warning(
        "%s has other token fields than the shards before it: the index records no token counts (a field counts "
        "where it is a 1-D integer .npy array in every sample that has it, in every shard). Make the field the "
        "same in every sample, then run `shardkit index` again",
        differs,
    )
    return ()


def _write_table(
    results: ShardResults, listing: ShardListing, target: str, work: str, num_token_fields: int = 0
) -> tuple[ShardTable, str]:
    """Write the table (to its final name in a local ``target``, else into
    ``work``) and the versions sidecar (a temporary file beside the table);
    returns the table, mapped from its file, and the sidecar's path."""
    naming = numbered(
        listing.names[start : start + len(records)][published(records)] for start, records in results.chunks()
    )
    folder = target if is_local(target) else work  # the temporaries are renamed within their folder
    table_part, (sha256, size) = _write_part(
        folder, lambda f: write_table(f, results, listing.names, naming, num_token_fields)
    )
    versions_part, _ = _write_part(folder, lambda f: write_versions(f, results))
    path = table_part
    if is_local(target):
        path = os.path.join(target, table_name(sha256))
        commit(table_part, path)
    return open_table(path, naming=naming, expected_size=size, expected_sha256=sha256), versions_part


def _write_part(folder: str, write: Callable[[Any], Any]) -> tuple[str, Any]:
    """A temporary file in ``folder`` filled by ``write(f)`` and synced; returns its path and what ``write`` returned."""
    fd, part = tempfile.mkstemp(prefix=".shardkit-index-", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            written = write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        remove_quietly(part)
        raise
    return part, written


def _publish(target: str, manifest: Manifest, versions_file: str, options: SourceOptions) -> None:
    """The versions sidecar, then (after one sync of the offset indexes) the
    table (a remote one; a local one is in place already) and manifest."""
    table_file = manifest.table_file()[0]
    if is_local(target):
        os.sync()  # the offset indexes, written without fsync, reach the disk before the manifest names them
        commit(versions_file, os.path.join(target, versions_name(table_file)))
        publish_manifest(target, manifest, table_in_place=True)
        with os.scandir(target) as entries:  # one name at a time: the folder holds an offset index per shard
            keep = versions_name(table_file)
            stale = [e.path for e in entries if e.name.endswith(VERSIONS_SUFFIX) and e.name != keep]
        for path in stale:
            remove_quietly(path)
    else:
        destination = open_destination(target, options=options)
        destination.put_file(versions_file, versions_name(table_file))
        destination.put_file(manifest.table.file, table_file)
        publish_manifest(destination, manifest, table_in_place=True)


def _remove_dropped(target: str, previous: PreviousRun, results: ShardResults, listing: ShardListing) -> int:
    """Remove the offset indexes of the previous run's shards that are not
    in the table now, under the same index name (locally); return how many went."""
    here = np.zeros(len(previous.names), dtype=bool)
    for start, records in results.chunks():
        names = listing.names[start : start + len(records)][published(records)]
        rows = previous.match(names)
        found = rows >= 0
        found &= previous.index_names[rows] == index_name_for(names)
        here[rows[found]] = True
    if is_local(target):
        for raw in previous.index_names[~here].tolist():
            try:  # names from the folder's previous manifest: only files inside the folder
                remove_quietly(resolve_inside(target, raw.decode("utf-8", "surrogateescape"), what="offset index"))
            except ShardkitError:
                pass
    return int((~here).sum())
