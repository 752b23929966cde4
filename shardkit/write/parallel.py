"""write_dataset: scan, plan, run, publish.

One straight path, whatever the engine and DEST; the engine (:data:`ENGINES`:
the local process pool, or Ray tasks) and the publisher (a local folder, or
``s3://``/fsspec through a staging folder) are chosen once, in
:func:`write_dataset`. Steps, each a separate unit:

1. :func:`~shardkit.write.scan.scan_dataset` cuts the source into partitions
   that the engine's workers (local processes, or Ray tasks) scan in
   parallel, each into a spill file (metadata only); the driver keeps one
   summary per partition.
2. :func:`~shardkit.write.plan.plan_shards` orders the samples (a seeded hash
   sort done bucket by bucket, or source order) and cuts shards by arithmetic.
3. The engine runs :func:`~shardkit.write.shard_task.run_shard` per shard: it
   writes the shard (:func:`~shardkit.write.shard_task.write_shard`) and
   publishes it with its index (:class:`~shardkit.write.publisher.ShardPublisher`).
   Tasks and results are plain picklable dataclasses that name rows of the
   plan's files, so another executor (a batch system) can run the same plan
   shard by shard.
4. The manifest is written last, atomically (uploaded last for a remote DEST).

The work folder ``DEST/.shardkit-journal/`` holds the scan's spills
(``scan/``), the plan (``plan/``) and one record per finished shard with its
task fingerprint and checksum, so ``resume=True`` reuses the spills of
unchanged partitions, keeps the shards that match the plan and writes only
the rest; it is removed once the manifest is in place. Nothing in it grows
the driver's memory with the number of samples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ShardkitError, UsageError
from shardkit.format.compression import COMPRESSIONS, Compression, compressed_extension
from shardkit.format.manifest import MANIFEST_NAME, Manifest
from shardkit.format.tar import field_name
from shardkit.io.registry import open_destination
from shardkit.write.destination import (
    JOURNAL_DIR,
    check_destination,
    check_free_space,
    check_outside_source,
    holding_destination,
    output_error,
    prepare_destination,
)
from shardkit.write.fieldmap import FieldMap
from shardkit.write.journal import (
    ShardResult,
    SkipTally,
    clear_journal,
    finished_entries,
    note_unpack_folder,
    remove_stale,
    remove_temporaries,
    reusable_result,
    unpack_folder,
)
from shardkit.write.limits import DEFAULT_MAX_BYTES, ShardLimits
from shardkit.write.plan import Oversized, ShardTask, plan_shards
from shardkit.write.pool import pool_context, process_pool
from shardkit.write.publish import publish_manifest
from shardkit.write.publisher import ShardPublisher
from shardkit.write.scan import ScanProgress, ScanResult, Scanner, resolve_format, scan_dataset, scan_locally
from shardkit.write.shard_task import ShardJob, init_worker, run_shard, run_shard_in_worker, write_shard
from shardkit.write.sources import check_options
from shardkit.write.sources.base import DEFAULT_MAX_UNPACK_BYTES, PARTITION_BYTES, SourceSettings
from shardkit.write.sources.table import (
    IngestOptions,
    close_process_downloader,
    ingest_options,
    note_image_format,
    planned_options,
)
from shardkit.write.upload import publish_report, remote_staging

__all__ = ["ENGINES", "Progress", "WriteOptions", "WriteReport", "scan_and_plan", "write_dataset", "write_shard"]

log = logging.getLogger(__name__)

ON_ERROR_POLICIES = ("raise", "skip")
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class WriteReport:
    """Summary of a :func:`write_dataset` run (also in the CLI's last lines)."""

    manifest: Manifest
    num_written: int
    num_reused: int
    seconds: float
    oversized: tuple[str, ...] = ()
    num_oversized: int = 0


@dataclass(frozen=True)
class Progress:
    """One progress event: a shard finished (written or reused).

    ``total_samples`` is what the whole plan holds, for a progress bar total;
    ``num_skipped`` the inputs the shard left out (failed downloads...);
    ``elapsed_s`` the seconds since the shards began to be written (the
    plan done), the clock for rates: the first event comes only once the
    first shard is finished.
    """

    shard: str
    num_samples: int
    num_bytes: int
    reused: bool
    total_samples: int = 0
    num_skipped: int = 0
    elapsed_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    """Options of :func:`write_dataset` (and of ``shardkit write``).

    An option only some source kinds use (``max_unpack_bytes``,
    ``partition_bytes``, ``files_root``, the table options) set for a source
    of another kind is refused before scanning, naming it (see
    :func:`~shardkit.write.sources.check_options`).

    Attributes:
        format: Source format, or None to detect it.
        max_samples: Most samples per shard.
        max_bytes: Most bytes per shard file (real tar size).
        shuffle: Globally shuffle samples before cutting shards.
        seed: Shuffle seed.
        workers: Scanning and writer processes; None means all cores. With
            ``engine="ray"``: scan tasks, then shard tasks, in flight at once
            (None: two per CPU of the cluster). Output does not depend on it.
        on_error: ``"raise"`` or ``"skip"`` for unusable inputs; None (the
            default) raises for unreadable inputs and skips rows of a table
            whose fields could not be downloaded or are not images (recorded
            in the manifest with their reason, as img2dataset does).
        resume: Keep finished shards of an interrupted run and write the rest.
        overwrite: Replace an earlier output in ``dest``.
        compress_members: ``"gzip"`` or ``"zstd"`` to compress the members
            whose extension compresses well (text, JSON, ``npy``...; see
            :data:`~shardkit.format.compression.COMPRESSIBLE_EXTENSIONS`;
            never images or other compressed media), stored as ``KEY.txt.gz``
            / ``KEY.txt.zst`` (webdataset's convention) with a fixed level
            and no timestamps, so shards stay byte-reproducible; None (the
            default) stores members as they are. ``max_bytes`` is planned
            with the uncompressed sizes, so such shards come out smaller.
        engine: ``"local"`` (a process pool on this machine) or ``"ray"``
            (one Ray task per partition to scan, then one per shard, on a
            Ray cluster whose nodes all see the source by the same path;
            needs ``pip install 'shardkit[ray]'``). The output does not
            depend on it. See :mod:`shardkit.write.scan_ray` and
            :mod:`shardkit.write.engine_ray`.
        ray_address: With ``engine="ray"``: ``"auto"`` (the running
            cluster), ``HOST:PORT`` of its head, or None for Ray's default
            (``RAY_ADDRESS``, a running cluster, else a local one).
        ray_max_retries: With ``engine="ray"``: how often a failed shard
            task is run again (a lost worker or node, or an error) before
            the write stops.
        max_unpack_bytes: Most temporary bytes the plain copies of input
            shards compressed whole (``.tar.gz``, ``.tar.zst``) may take, all
            together, in the system's temporary folder (``TMPDIR``): 64 GiB
            by default (:data:`~shardkit.write.sources.base.DEFAULT_MAX_UNPACK_BYTES`),
            None for no limit but the folder's free space. Past it the write
            stops before writing anything, naming the input and the limit.
            The copies go when the write ends; those of a write that was
            killed go when the next write on the same DEST starts.
        partition_bytes: Length of one JSONL partition, the unit a scanning
            worker takes (64 MiB by default). The output does not depend on it.
        files_root: The folder a JSONL source's rows may name files in
            (None: the JSONL file's own). A row naming a file outside it,
            by an absolute path or ``..``, is refused, so a JSONL from
            elsewhere cannot copy ``~/.ssh`` into a dataset you publish.
        fields, key_column, resize, resize_mode, image_format, image_quality,
        download_threads, max_connections_per_host, connect_timeout_s,
        read_timeout_s, download_retries, respect_opt_out, user_agent_contact,
        s3_anonymous:
            Table sources only: columns to fields, images, downloads (see
            :class:`~shardkit.write.sources.table.IngestOptions`, which they make).
    """

    format: str | None = None
    max_samples: int | None = None
    max_bytes: int | None = DEFAULT_MAX_BYTES
    shuffle: bool = True
    seed: int = 0
    workers: int | None = None
    on_error: str | None = None
    resume: bool = False
    overwrite: bool = False
    compress_members: Compression | None = None
    engine: str = "local"
    ray_address: str | None = None
    ray_max_retries: int = 3
    max_unpack_bytes: int | None = DEFAULT_MAX_UNPACK_BYTES
    partition_bytes: int = PARTITION_BYTES
    files_root: str | None = None
    fields: tuple[str, ...] = ()
    key_column: str | None = None
    resize: int | None = None
    resize_mode: str = "keep_ratio"
    image_format: str | None = None
    image_quality: int = 95
    download_threads: int = 16
    max_connections_per_host: int = 4
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0
    download_retries: int = 2
    respect_opt_out: bool = True
    user_agent_contact: str | None = None
    s3_anonymous: bool = False

    def __post_init__(self) -> None:
        if type(self.partition_bytes) is not int or self.partition_bytes < 1:
            raise UsageError(f"partition_bytes must be a positive integer, got {self.partition_bytes!r}")
        if self.max_unpack_bytes is not None and (type(self.max_unpack_bytes) is not int or self.max_unpack_bytes < 1):
            raise UsageError(f"max_unpack_bytes must be a positive integer or None, got {self.max_unpack_bytes!r}")
        if self.engine not in ENGINES:
            raise UsageError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError("ray_address is only used with engine='ray'; pass --engine ray")
        if not isinstance(self.ray_max_retries, int) or self.ray_max_retries < 0:
            raise UsageError(f"ray_max_retries must be a non-negative integer, got {self.ray_max_retries!r}")
        if self.compress_members is not None and self.compress_members not in COMPRESSIONS:
            raise UsageError(
                f"compress_members must be one of {COMPRESSIONS} or None, got {self.compress_members!r}"
            )
        if self.on_error is not None and self.on_error not in ON_ERROR_POLICIES:
            raise UsageError(f"on_error must be one of {ON_ERROR_POLICIES}, got {self.on_error!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise UsageError(f"workers must be a positive integer, got {self.workers!r}")
        if not isinstance(self.seed, int):
            raise UsageError(f"seed must be an integer, got {self.seed!r}")
        if self.resume and self.overwrite:
            raise UsageError("resume and overwrite exclude each other")
        ShardLimits(max_samples=self.max_samples, max_bytes=self.max_bytes)  # validates
        self.field_map()
        self.ingest_options()

    @property
    def input_errors(self) -> str:
        """The policy for unreadable inputs (``on_error``, default raise)."""
        return self.on_error or "raise"

    @property
    def download_errors(self) -> str:
        """The policy for table rows that could not be fetched (``on_error``, default skip)."""
        return self.on_error or "skip"

    def shard_arguments(self) -> dict[str, Any]:
        """The keyword arguments of :func:`write_shard` these options set."""
        return {
            "on_error": self.input_errors,
            "compress_members": self.compress_members,
            "ingest": self.ingest_options(),
            "download_errors": self.download_errors,
        }

    def field_map(self) -> FieldMap:
        """The table column mapping (``fields`` and ``key_column``)."""
        return FieldMap.parse(self.fields, key_column=self.key_column)

    def ingest_options(self) -> IngestOptions:
        """How shard writers fetch and prepare table fields."""
        return ingest_options(self)

    def recorded(self) -> dict:
        """The options that shape the output, as stored in the manifest."""
        recorded = {
            "max_samples": self.max_samples,
            "max_bytes": self.max_bytes,
            "shuffle": self.shuffle,
            "on_error": self.input_errors,
        }
        if self.fields or self.key_column is not None:  # table sources only: absent otherwise
            recorded.update(fields=list(self.fields), key_column=self.key_column)
        if self.resize is not None or self.image_format is not None:
            recorded.update(resize=self.resize, resize_mode=self.resize_mode, image_format=self.image_format,
                            image_quality=self.image_quality)  # fmt: skip
        if self.compress_members is not None:  # absent otherwise: older manifests stay as they were
            recorded["compress_members"] = self.compress_members
        return recorded


# ---------------------------------------------------------------- the driver

#: An engine: runs shard tasks, yielding their results as they finish (any order).
Engine = Callable[[list[ShardTask], ShardJob, WriteOptions], Iterator[ShardResult]]


@dataclass(frozen=True)
class _Run:
    """One write: what is written, with which options, by which engine, to which publisher."""

    source: str
    options: WriteOptions
    engine: Engine
    scanner: Scanner
    publisher: ShardPublisher
    progress: Callable[[Progress], None] | None
    scan_progress: Callable[[ScanProgress], None] | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def dest(self) -> str:
        """The local folder written into (DEST, or the staging folder of a remote DEST)."""
        return self.publisher.folder

    def job(self) -> ShardJob:
        return ShardJob(publisher=self.publisher, arguments=self.options.shard_arguments())


def write_dataset(
    source: str,
    dest: str,
    *,
    options: WriteOptions | None = None,
    progress: Callable[[Progress], None] | None = None,
    scan_progress: Callable[[ScanProgress], None] | None = None,
) -> WriteReport:
    """Pack ``source`` into shards under ``dest`` and write ``manifest.json``.

    Scan, plan, run, publish: the engine (:data:`ENGINES`) and the publisher
    (a local folder, or ``s3://``/fsspec through a staging folder; see
    :class:`~shardkit.write.publisher.ShardPublisher`) are chosen here, once.

    Args:
        source: Input dataset (ImageFolder tree, directory, JSONL file, tar
            shards), or a table (Parquet, CSV/TSV, datasets folder); see
            :mod:`shardkit.write.sources`.
        dest: Output directory, or an ``s3://`` or other fsspec URL to upload
            to (shards as they finish, the manifest last).
        options: See :class:`WriteOptions`; defaults apply when None.
        progress: Called in this process each time a shard is finished.
        scan_progress: Called in this process as the source's partitions are
            scanned, before the first shard (see :class:`~shardkit.write.scan.ScanProgress`).

    Returns:
        A :class:`WriteReport` whose ``manifest`` describes the dataset.

    Raises:
        UsageError, SourceError, DestinationError, InputFileError, RemoteError.
    """
    options = options or WriteOptions()
    engine, scanner, session = _choose_engine(options)  # before scanning: no Ray, or no cluster there, fails at once
    destination = open_destination(dest)
    with session:
        if destination.local_dir is not None:
            publisher = ShardPublisher(destination.local_dir)
            return _write(_Run(source, options, engine, scanner, publisher, progress, scan_progress))
        with remote_staging(destination, resume=options.resume, overwrite=options.overwrite) as staging:
            publisher = ShardPublisher(staging, url=destination.url)
            options = dataclasses.replace(options, overwrite=False)
            run = _Run(source, options, engine, scanner, publisher, progress, scan_progress)
            return publish_report(destination, _write(run))


def _choose_engine(options: WriteOptions) -> tuple[Engine, Scanner, contextlib.AbstractContextManager]:
    """The engine's shard runner, its scanner, and the connection a write holds (Ray's) for both."""
    if options.engine == "ray":
        from shardkit.write.engine_ray import preflight, run_tasks_on_ray, session
        from shardkit.write.scan_ray import scan_on_ray

        preflight(options.ray_address)
        scanner = functools.partial(scan_on_ray, max_retries=options.ray_max_retries)
        return run_tasks_on_ray, scanner, session(options.ray_address)
    return _run_tasks, scan_locally, contextlib.nullcontext()


def _write(run: _Run) -> WriteReport:
    """Scan and plan into the work folder of ``run.dest``, then :func:`_write_planned`."""
    dest, options = run.dest, run.options
    check_outside_source(dest, run.source, options.format)
    created = not os.path.exists(dest)
    if not os.path.isdir(dest):
        check_destination(dest, overwrite=options.overwrite, resume=options.resume)  # a file there: refused, nothing made
    with holding_destination(dest):
        # Refuse an unusable DEST before scanning, changing nothing there yet.
        check_destination(dest, overwrite=options.overwrite, resume=options.resume)
        return _write_held(run, created)


def _write_held(run: _Run, created: bool) -> WriteReport:
    """:func:`_write` once DEST is held; ``created``: whether this write made it."""
    dest, options = run.dest, run.options
    work = os.path.join(dest, JOURNAL_DIR)
    # Input shards compressed whole are unpacked here once, for the shard
    # writers to read by byte range; the copies go when the write ends, and
    # those of an earlier run on DEST that was killed go now.
    with unpack_folder(work) as unpack_dir:
        try:
            if not options.resume:
                shutil.rmtree(work, ignore_errors=True)  # an earlier run's, replaced by --overwrite
            note_unpack_folder(work, unpack_dir)
            scanned, tasks, oversized = scan_and_plan(
                run.source, options, work=work, unpack_dir=unpack_dir, scanner=run.scanner, progress=run.scan_progress
            )
        except BaseException as exc:
            _discard_scan(dest, work, created=created, keep=options.resume)
            if isinstance(exc, OSError) and not isinstance(exc, ShardkitError):
                raise output_error(exc, work, resume_hint=False) from exc
            raise
        run = dataclasses.replace(run, options=planned_options(options, scanned))
        return _write_planned(run, scanned, tasks, oversized)


def scan_and_plan(
    source: str,
    options: WriteOptions,
    *,
    work: str,
    unpack_dir: str,
    scanner: Scanner = scan_locally,
    progress: Callable[[ScanProgress], None] | None = None,
) -> tuple[ScanResult, list[ShardTask], Oversized]:
    """Scan ``source`` into ``work/scan`` and plan it into ``work/plan`` as a
    write with ``options`` does (its dry run too, with the local scanner);
    ``progress`` follows the scan (see :func:`~shardkit.write.scan.scan_dataset`).

    Returns:
        The scan, the shard tasks, and the samples over ``max_bytes``.
    """
    format = resolve_format(source, options.format)
    check_options(options, format, source)  # an option this kind does not use is refused, not ignored
    note_image_format(options)
    spill_dir, plan_dir = os.path.join(work, "scan"), os.path.join(work, "plan")
    os.makedirs(spill_dir, exist_ok=True)
    shutil.rmtree(plan_dir, ignore_errors=True)
    os.makedirs(plan_dir)
    settings = SourceSettings(
        partition_bytes=options.partition_bytes, files_root=options.files_root, fields=options.field_map(),
        table_output=options.ingest_options().output_signature(), unpack_dir=unpack_dir,
        max_unpack_bytes=options.max_unpack_bytes,
    )  # fmt: skip
    scanned = scan_dataset(
        source, spill_dir=spill_dir, format=format, on_error=options.input_errors, seed=options.seed,
        workers=options.workers, settings=settings, reuse=options.resume, scanner=scanner, progress=progress,
    )
    options = planned_options(options, scanned)
    limits = ShardLimits(max_samples=options.max_samples, max_bytes=options.max_bytes)
    tasks, oversized = plan_shards(scanned, limits=limits, shuffle=options.shuffle, plan_dir=plan_dir)
    return scanned, tasks, oversized


def _discard_scan(dest: str, work: str, *, created: bool, keep: bool) -> None:
    """After a failed scan or plan: drop the work folder (a resumed run keeps
    the complete spills), and ``dest`` itself when this run created it."""
    if keep:
        remove_temporaries(dest)
    else:
        shutil.rmtree(work, ignore_errors=True)
    if created:
        try:
            os.rmdir(dest)
        except OSError:
            pass


def _write_planned(run: _Run, scanned: ScanResult, tasks: list[ShardTask], oversized: Oversized) -> WriteReport:
    """The rest of :func:`_write`, once the source is scanned and planned:
    run the tasks not done yet on the engine, then write the manifest."""
    dest, options = run.dest, run.options
    since = time.perf_counter()  # the clock of progress events' elapsed_s
    prepare_destination(dest, overwrite=options.overwrite, resume=options.resume, keep=JOURNAL_DIR)
    if oversized.count:
        log.warning("%s", oversized.warning(options.max_bytes))
    results: dict[int, ShardResult] = {}
    skips = SkipTally()
    skips.add(scanned.skipped)
    try:
        todo = _reuse_finished(run, scanned, tasks, results, skips, since) if options.resume else tasks
        if not run.publisher.remote:  # a remote DEST stages a few shards at a time
            check_free_space(dest, _planned_file_sizes(todo))
        runner = run.engine(todo, run.job(), options)
        try:
            for result in runner:
                _report(run.progress, result, scanned.num_samples, since)
                _collect(result, results, skips)
        finally:
            runner.close()  # stops the pool at once when the loop ends early
        ordered = [results[t.index] for t in tasks]
        manifest = _publish_manifest(run, scanned, ordered, skips)
    except BaseException as exc:
        remove_temporaries(dest)
        if not options.resume and not any(not r.reused for r in results.values()):
            clear_journal(dest)  # refused before any shard was written: nothing to resume
        if isinstance(exc, OSError) and not isinstance(exc, ShardkitError):
            raise output_error(exc, dest) from exc
        raise
    return WriteReport(
        manifest=manifest,
        num_written=sum(not r.reused for r in ordered),
        num_reused=sum(r.reused for r in ordered),
        seconds=time.perf_counter() - run.started,
        oversized=oversized.examples,
        num_oversized=oversized.count,
    )


def _source_info(run: _Run, scanned: ScanResult) -> dict:
    return {"format": scanned.format, "path": run.source}


def _collect(result: ShardResult, results: dict[int, ShardResult], skips: SkipTally) -> None:
    """Keep ``result`` in ``results`` without its skipped inputs, which
    ``skips`` counts instead: the driver holds no list per shard."""
    skips.add(result.skipped)
    results[result.index] = dataclasses.replace(result, skipped=()) if result.skipped else result


def _reuse_finished(
    run: _Run, scanned: ScanResult, tasks: list[ShardTask], results: dict[int, ShardResult], skips: SkipTally,
    since: float,
) -> list[ShardTask]:
    """``--resume``: put the finished shards that match the plan into
    ``results`` (see :func:`_collect`), remove stale files, and return the tasks left to run."""
    dest = run.dest
    finished = finished_entries(dest, _source_info(run, scanned), run.options)
    todo = []
    for task in tasks:
        reused = reusable_result(dest, task, finished)
        if reused is None:
            todo.append(task)
        else:
            _report(run.progress, reused, scanned.num_samples, since)
            _collect(reused, results, skips)
    remove_stale(dest, keep={t.name for t in tasks})
    if os.path.exists(os.path.join(dest, MANIFEST_NAME)) and todo:
        os.unlink(os.path.join(dest, MANIFEST_NAME))
    return todo


def _publish_manifest(run: _Run, scanned: ScanResult, ordered: list[ShardResult], skips: SkipTally) -> Manifest:
    """Write the manifest into ``run.dest`` (atomically, last) and drop the
    work folder. It lists the first skipped inputs in source order (not the
    plan's shuffled order) and counts them all (see :class:`SkipTally`)."""
    options, dest = run.options, run.dest
    kind = options.compress_members
    # the fields readers give (KEY.JPG is read as jpg)
    extensions = sorted({field_name(compressed_extension(ext, kind)) for ext in scanned.extensions})
    manifest = Manifest(
        shards=tuple(r.entry for r in ordered),
        extensions=tuple(extensions),
        class_names=scanned.class_names,
        source=_source_info(run, scanned),
        options=options.recorded(),
        seed=options.seed if options.shuffle else None,
        skipped=skips.listed(),
        skipped_counts=skips.counts_if_partial(),
        location=os.path.abspath(dest),
        member_compression=kind,
    )
    try:
        publish_manifest(dest, manifest)
    except OSError as exc:
        raise output_error(exc, os.path.join(dest, MANIFEST_NAME)) from exc
    clear_journal(dest)
    return manifest


def _planned_file_sizes(tasks: list[ShardTask]) -> list[int]:
    """Sizes of the files writing ``tasks`` creates: shards, indexes, journal
    records, and a generous allowance for the manifest."""
    sizes = [_MANIFEST_ALLOWANCE_BYTES + _MANIFEST_BYTES_PER_SHARD * len(tasks)]
    for task in tasks:
        sizes += [task.planned_bytes, _INDEX_HEADER_BYTES + 8 * (task.num_samples + 1), _JOURNAL_RECORD_BYTES]
    return sizes


# Upper bounds for the small files the writer adds beside the shards.
_INDEX_HEADER_BYTES = 128
_JOURNAL_RECORD_BYTES = 1024
_MANIFEST_ALLOWANCE_BYTES = 64 << 10
_MANIFEST_BYTES_PER_SHARD = 512


def _report(progress: Callable[[Progress], None] | None, result: ShardResult, total: int, since: float) -> None:
    """Tell ``progress`` that a shard is done; ``since``: when writing began (``perf_counter``)."""
    if progress is not None:
        entry = result.entry
        elapsed = time.perf_counter() - since
        progress(Progress(entry.path, entry.num_samples, entry.num_bytes, result.reused, total, len(result.skipped), elapsed))


def _run_tasks(tasks: list[ShardTask], job: ShardJob, options: WriteOptions) -> Iterator[ShardResult]:
    """The local engine: run shard tasks in a process pool, yielding results
    as they finish (any order).

    When the caller stops early (a task failed, or the consumer raised), the
    pool is stopped: queued tasks are cancelled and running ones give up
    between samples, removing their temporary files.
    """
    workers = min(options.workers or os.cpu_count() or 1, max(len(tasks), 1))
    stop: Any
    if workers <= 1:
        # One process, two threads taking turns (see write_shard's ``turn``):
        # one shard's fsync, rename and upload overlap the next one's samples,
        # and the two do not fight over the GIL at every input file (which
        # cost an ImageFolder write a third more CPU).
        stop, turn = threading.Event(), threading.Lock()
        pool: Executor = ThreadPoolExecutor(max_workers=2)
        futures = [pool.submit(run_shard, task, job, stop=stop, turn=turn) for task in tasks]
    else:
        stop = pool_context().Event()
        pool = process_pool(workers, init_worker, (stop,))
        futures = [pool.submit(run_shard_in_worker, task, job) for task in tasks]
    try:
        for future in as_completed(futures):
            yield future.result()
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        if workers <= 1:
            close_process_downloader()  # its threads, made in this process for table rows
