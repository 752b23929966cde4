"""write_dataset: scan, plan, run, publish.

One straight path, whatever the engine and DEST; the engine
(:func:`~shardkit.write.engines.choose_engine`: the local process pool, or
Ray tasks, peers behind one interface) and the publisher (a local folder, or
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

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ShardkitError, SourceError
from shardkit.format.compression import compressed_extension
from shardkit.format.index import index_path_for
from shardkit.format.manifest import MANIFEST_NAME, Manifest
from shardkit.format.table import table_from_entries
from shardkit.format.tar import field_name
from shardkit.io.atomic import remove_quietly
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
from shardkit.write.engines import Engine, choose_engine
from shardkit.write.journal import (
    ShardResult,
    SkipTally,
    clear_journal,
    finished_entries,
    recorded_tokens,
    remove_stale,
    remove_temporaries,
    reusable_result,
    unpack_folder,
)
from shardkit.write.map_stage import stage_counts, stage_info
from shardkit.write.mapping import MapSpec, check_sequence, is_path
from shardkit.write.no_sample import EXAMPLES_NAMED, FILTERED, every_input, filtered_examples, no_sample_error
from shardkit.write.occupant import WriteIdentity, check_resume, record_identity, write_identity
from shardkit.write.options import ENGINES, WriteOptions
from shardkit.write.plan import Oversized, ShardTask
from shardkit.write.planning import scan_and_plan
from shardkit.write.publish import publish_manifest
from shardkit.write.publisher import ShardPublisher
from shardkit.write.scan import ScanProgress, ScanResult
from shardkit.write.shard_task import ShardJob, write_shard
from shardkit.write.sources.table import planned_options
from shardkit.write.upload import publish_report, remote_staging

__all__ = ["ENGINES", "Progress", "WriteOptions", "WriteReport", "scan_and_plan", "write_dataset", "write_shard"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteReport:
    """Summary of a :func:`write_dataset` run (also in the CLI's last lines)."""

    manifest: Manifest
    num_written: int
    num_reused: int
    seconds: float
    oversized: tuple[str, ...] = ()
    num_oversized: int = 0
    num_items: int = 0
    num_filtered: int = 0
    num_failed: int = 0


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


# ---------------------------------------------------------------- the driver

@dataclass(frozen=True)
class _Run:
    """One write: what is written, with which options, by which engine, to which publisher."""

    source: str | Sequence
    options: WriteOptions
    engine: Engine
    publisher: ShardPublisher
    progress: Callable[[Progress], None] | None
    scan_progress: Callable[[ScanProgress], None] | None = None
    map: Callable[[Any], Any] | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def dest(self) -> str:
        """The local folder written into (DEST, or the staging folder of a remote DEST)."""
        return self.publisher.folder

    def job(self) -> ShardJob:
        return ShardJob(publisher=self.publisher, arguments=self.options.shard_arguments())


def write_dataset(
    source: str | Sequence,
    dest: str,
    *,
    map: Callable[[Any], Any] | None = None,
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
            :mod:`shardkit.write.sources`. Or a Python sequence of items
            (list, tuple, ``range``, numpy array, any sequence with ``len``):
            each is given to ``map``, or, without one, is a sample dict.
        dest: Output directory, or an ``s3://`` or other fsspec URL to upload
            to (shards as they finish, the manifest last).
        map: Your function, run in the writer's processes (or Ray tasks) on
            each item, or on each sample of a path source as the reader sees
            it (``{"__key__": ..., EXT: bytes}``). It returns a sample dict, None
            (the item is dropped, counted as filtered), or a list or generator
            of sample dicts; values as :class:`~shardkit.ShardWriter` takes
            them. It must pickle (a module-level function, a
            ``functools.partial`` of one). The output depends on the items,
            ``map``, the seed and the options, never on the workers or the
            engine (see :mod:`shardkit.write.mapping`).
        options: See :class:`WriteOptions`; defaults apply when None.
        progress: Called in this process each time a shard is finished.
        scan_progress: Called in this process as the source's partitions are
            scanned, before the first shard (see :class:`~shardkit.write.scan.ScanProgress`).

    Returns:
        A :class:`WriteReport` whose ``manifest`` describes the dataset.

    Raises:
        UsageError, SourceError, DestinationError, InputFileError, RemoteError;
        MapError when ``map`` failed on an item (``on_error="raise"``).
        SourceError too when no input gave a sample, all skipped (failed
        downloads, unreadable files, images that do not decode) or dropped
        by ``map``: its message counts them by reason and names the first;
        no manifest is published.
    """
    options = options or WriteOptions()
    if not is_path(source):
        source = check_sequence(source)
    MapSpec(map).check()  # a function that cannot reach the workers is refused before anything is done
    engine = choose_engine(options)  # before scanning: no Ray, or no cluster there, fails at once
    destination = open_destination(dest)
    with engine.session:
        if destination.local_dir is not None:
            publisher = ShardPublisher(destination.local_dir)
            return _write(_Run(source, options, engine, publisher, progress, scan_progress, map))
        with remote_staging(destination, resume=options.resume, overwrite=options.overwrite) as staging:
            publisher = ShardPublisher(staging, url=destination.url)
            options = dataclasses.replace(options, overwrite=False)
            return publish_report(destination, _write(_Run(source, options, engine, publisher, progress, scan_progress, map)))


def _write(run: _Run) -> WriteReport:
    """Scan and plan into the work folder of ``run.dest``, then :func:`_write_planned`."""
    dest, options = run.dest, run.options
    if is_path(run.source):
        check_outside_source(dest, os.fspath(run.source), options.format)
    created = not os.path.exists(dest)
    if not os.path.isdir(dest):
        check_destination(dest, overwrite=options.overwrite, resume=options.resume)  # a file there: refused, nothing made
    identity = write_identity(run.source, options, MapSpec(run.map).name)
    with holding_destination(dest):
        # Refuse an unusable DEST before scanning, changing nothing there yet:
        # --resume goes on only with the write DEST's journal (or dataset) belongs to.
        if options.resume:
            check_resume(dest, identity)
        check_destination(dest, overwrite=options.overwrite, resume=options.resume)
        return _write_held(run, created, identity)


def _write_held(run: _Run, created: bool, identity: WriteIdentity) -> WriteReport:
    """:func:`_write` once DEST is held; ``created``: whether this write made
    it; ``identity``: what the journal records of it for a later ``--resume``."""
    dest, options = run.dest, run.options
    work = os.path.join(dest, JOURNAL_DIR)
    # Input shards compressed whole are unpacked into the work area once, for
    # the shard writers to read by byte range; the copies go when the write
    # ends, and those of an earlier run on DEST that was killed go now.
    with unpack_folder(work) as unpack_dir:
        try:
            if not options.resume:
                shutil.rmtree(work, ignore_errors=True)  # an earlier run's, replaced by --overwrite
            record_identity(dest, identity)
            scanned, tasks, oversized = scan_and_plan(
                run.source, options, work=work, unpack_dir=unpack_dir, scanner=run.engine.scan, progress=run.scan_progress,
                map=run.map,
            )
        except BaseException as exc:
            _discard_scan(dest, work, created=created, keep=options.resume)
            if isinstance(exc, OSError) and not isinstance(exc, ShardkitError):
                raise output_error(exc, work, resume_hint=False) from exc
            raise
        run = dataclasses.replace(run, options=planned_options(options, scanned))
        return _write_planned(run, scanned, tasks, oversized)


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
        runner = run.engine.run(todo, run.job(), options)
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
        **stage_counts(scanned),
    )


def _source_info(run: _Run, scanned: ScanResult) -> dict:
    return {"format": scanned.format, "path": scanned.source, **stage_info(scanned)}


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
    plan's shuffled order) and counts them all (see :class:`SkipTally`).
    Shards that hold no sample at all are never published: that write fails
    (see :func:`_nothing_written`)."""
    options, dest = run.options, run.dest
    if not any(r.entry.num_samples for r in ordered):
        raise _nothing_written(run, scanned, ordered, skips)
    kind = options.compress_members
    # the fields readers give (KEY.JPG is read as jpg)
    extensions = sorted({field_name(compressed_extension(ext, kind)) for ext in scanned.extensions})
    entries = tuple(r.entry for r in ordered)
    token_fields, tokens = recorded_tokens(ordered)
    manifest = Manifest(
        shards=table_from_entries(entries, tokens=tokens),
        token_fields=token_fields,
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


def _nothing_written(run: _Run, scanned: ScanResult, ordered: list[ShardResult], skips: SkipTally) -> SourceError:
    """The error of a write whose shards hold no sample (every input was
    skipped while the shards were written: failed downloads, files gone,
    images that do not decode), once its empty shards and its journal are
    removed: a ``--resume`` would only reuse the empty shards, retrying nothing."""
    dest = run.dest
    if not run.publisher.remote:
        for result in ordered:
            remove_quietly(os.path.join(dest, result.entry.path))
            remove_quietly(index_path_for(os.path.join(dest, result.entry.path)))
        left = (f"No manifest was published, and the empty shards and the write's journal were removed from {dest} "
                "(a --resume would have reused the empty shards, retrying nothing)")  # fmt: skip
    else:
        left = f"No manifest was published at {run.publisher.url}, so no reader finds the empty shards uploaded there"
    clear_journal(dest)
    counts = dict(skips.counts)
    num_filtered = stage_counts(scanned).get("num_filtered", 0)
    if num_filtered:
        counts[FILTERED] = num_filtered
    what = every_input(sum(counts.values()), "left out" if num_filtered else "skipped")
    examples = list(skips.listed()[:EXAMPLES_NAMED]) + filtered_examples(scanned.summaries)
    return no_sample_error(scanned.source, what, counts, examples, left=left)


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
