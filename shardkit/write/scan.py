"""Scanning a whole source: partitions scanned in parallel, each into its spill.

:func:`scan_dataset` lists the source's partitions, has a scanner run one
:class:`ScanJob` per partition (:func:`~shardkit.write.sources.scan_partition`)
and keeps one summary per partition: the driver's memory grows with the
number of partitions, never with the number of samples. The scanner is the
write's engine: a pool of local processes (:func:`scan_locally`, the
default), or Ray tasks (:func:`~shardkit.write.scan_ray.scan_on_ray`). With
``reuse`` (``--resume``) a partition whose spill is complete and whose input
is unchanged is not scanned again.

Errors are those of the first failing partition in source order, whatever
order the workers finish in, so a run fails the same way with any number of
workers.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterable, Iterator, Sized
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ShardkitError, SourceError, UsageError
from shardkit.format.manifest import SkippedInput, skip_category
from shardkit.io.urls import is_local, redact_url
from shardkit.write.no_sample import every_input, no_sample_error
from shardkit.write.pool import IN_FLIGHT_PER_WORKER, process_pool
from shardkit.write.sources import (
    Partition,
    SourceSettings,
    detect_source,
    list_partitions,
    scan_partition,
    source_kind,
)
from shardkit.write.sources.tar import UnpackBudget
from shardkit.write.spill import SpillReader, load_summary, spill_intact, spill_prefix


@dataclass(frozen=True)
class ScanProgress:
    """One scanning event: a partition of the source is scanned (or, with
    ``--resume``, found already scanned).

    The map stage (:mod:`shardkit.write.map_stage`) reports the same way,
    counting its items too.

    Attributes:
        done: Partitions scanned (or mapped) so far.
        num_partitions: Partitions the source is cut into.
        num_samples: Samples found (or returned by ``map``) so far.
        num_items: Items mapped so far (0 for a scan).
        total_items: Items to map (0 for a scan: then the bar counts partitions).
    """

    done: int
    num_partitions: int
    num_samples: int
    num_items: int = 0
    total_items: int = 0


@dataclass
class ScanResult:
    """What scanning found: one summary per partition and where the spills are.

    Attributes:
        format: The source format.
        source: The source as given.
        partitions: In source order.
        summaries: One per partition (see :func:`~shardkit.write.sources.scan_partition`).
        spill_dir: The folder of the partitions' spills.
        class_names: An ImageFolder's classes, else None.
        input_files: The input files behind the samples, where the
            partitions do not tell (the map stage's, whose partitions are
            ranges of items); None: counted by the source's kind.
    """

    format: str
    source: str
    partitions: list[Partition]
    summaries: list[dict]
    spill_dir: str
    class_names: tuple[str, ...] | None = None
    input_files: int | None = None

    @property
    def has_urls(self) -> bool:
        """Some table rows have fields to download (sized only once fetched)."""
        return any(s.get("has_urls") for s in self.summaries)

    @property
    def num_samples(self) -> int:
        return sum(s["num_samples"] for s in self.summaries)

    @property
    def num_files(self) -> int:
        """Input files the samples are read from (a file that rows of two
        JSONL partitions both name counts twice; the JSONL file once, and a
        table file cut into partitions by row groups or lines once)."""
        if self.input_files is not None:
            return self.input_files
        return source_kind(self.format).count_files(self.partitions, self.summaries)

    @property
    def skipped(self) -> list[SkippedInput]:
        return [SkippedInput(path=path, reason=reason) for s in self.summaries for path, reason in s["skipped"]]

    @property
    def extensions(self) -> list[str]:
        return sorted({ext for s in self.summaries for ext in s["extensions"]})

    def reader(self, index: int) -> SpillReader:
        return SpillReader(spill_prefix(self.spill_dir, index))


@dataclass(frozen=True)
class ScanJob:
    """One partition to scan, with everything its scan needs (picklable).

    Attributes:
        part: The partition.
        spill_dir: The folder its spill goes into.
        seed, on_error, signature, settings, spec: As
            :func:`~shardkit.write.sources.scan_partition` takes them.
    """

    part: Partition
    spill_dir: str
    seed: int
    on_error: str
    signature: dict
    settings: SourceSettings
    spec: Any = None

    #: The files :meth:`run` leaves (see :mod:`shardkit.write.spill`), the
    #: summary last: the order a Ray task streams them back in.
    files = (".rec.npy", ".src.npy", ".str", ".json")

    @property
    def unpacks(self) -> bool:
        """Scanning it writes a plain copy of a compressed input into the unpack folder."""
        return source_kind(self.part.kind).unpacks(self.part)

    def run(self, spill_dir: str | None = None) -> dict:
        """Scan the partition into ``spill_dir`` (default: :attr:`spill_dir`);
        return its summary. An unexpected OS error names its input."""
        part = self.part
        try:
            return scan_partition(
                part, spill_prefix(spill_dir or self.spill_dir, part.index), seed=self.seed, on_error=self.on_error,
                signature=self.signature, settings=self.settings, spec=self.spec,
            )
        except ShardkitError:
            raise
        except OSError as exc:
            raise SourceError(f"{part.path}: scanning it failed ({exc.strerror or exc})", path=part.path) from exc


#: Runs scan jobs (or the map stage's) with at most ``workers`` at a time (None: the engine's
#: default) and gives their summaries in job order (a list, or an iterator
#: that yields each as it is ready); when jobs fail, the error of the first
#: failing one in job order is raised.
Scanner = Callable[[Iterable[Any], int | None], Iterable[dict]]


def resolve_format(source: str, format: str | None) -> str:
    """The format a write reads ``source`` as: ``format``, or the one
    :func:`~shardkit.write.sources.detect_source` tells from its shape.

    Raises:
        UsageError: Unknown format.
        SourceError: Not a local source, a missing source, or a shape that
            fits no format or more than one.
    """
    if not is_local(source):
        raise SourceError(
            f"{redact_url(source)}: `write` reads local sources only (a path or file:// URL); "
            "copy the data to a local or mounted folder first",
            path=redact_url(source),
        )
    if format is None:
        format = detect_source(source)
    if source_kind(format).source_is_path and not os.path.exists(source):
        raise SourceError(f"{source}: source does not exist", path=source)
    return format


def scan_dataset(
    source: str,
    *,
    spill_dir: str,
    format: str | None = None,
    on_error: str = "raise",
    seed: int = 0,
    workers: int | None = None,
    settings: SourceSettings | None = None,
    reuse: bool = False,
    scanner: Scanner | None = None,
    progress: Callable[[ScanProgress], None] | None = None,
) -> ScanResult:
    """Scan ``source`` partition by partition into spills under ``spill_dir``.

    Args:
        source: Path to the input (see :mod:`shardkit.write.sources`).
        spill_dir: An existing folder for the spills.
        format: One of :data:`~shardkit.write.sources.FORMATS`, or None to detect it.
        on_error: ``"raise"`` or ``"skip"`` for unusable inputs.
        seed: Shuffle seed (the spills are sorted by the seeded key hash).
        workers: Scanning processes (None: all cores); the result does not depend on it.
        settings: What the sources read of the write's options: partition
            length, JSONL ``files_root``, a table's field map, the unpack
            folder and its limit (defaults when None; see
            :class:`~shardkit.write.sources.base.SourceSettings`).
        reuse: Keep the complete spills of partitions whose input is unchanged.
        scanner: Runs the partitions' scans (default :func:`scan_locally`);
            the result does not depend on it.
        progress: Called in this process once the partitions are listed (and
            those to reuse found), then as each partition is scanned.

    Raises:
        UsageError: Unknown format or policy.
        SourceError: Missing or empty source, malformed input, duplicates
            inside a partition, compressed inputs past ``max_unpack_bytes``.
        DestinationError: The spill folder is full or not writable.
    """
    if on_error not in ("raise", "skip"):
        raise UsageError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    format = resolve_format(source, format)
    settings = settings or SourceSettings()
    listing = list_partitions(source, format, settings)
    partitions = listing.partitions
    signatures = [{**p.signature(), "seed": seed, "on_error": on_error, **listing.signature} for p in partitions]
    summaries: list[dict | None] = [None] * len(partitions)
    if reuse:
        for part, signature in zip(partitions, signatures):
            summaries[part.index] = _reusable(spill_prefix(spill_dir, part.index), part, signature)
    todo = [p for p in partitions if summaries[p.index] is None]

    jobs = [ScanJob(p, spill_dir, seed, on_error, signatures[p.index], settings, listing.spec) for p in todo]
    done_count = len(partitions) - len(todo)
    found = sum(s["num_samples"] for s in summaries if s is not None)
    if progress is not None:
        progress(ScanProgress(done_count, len(partitions), found))
    results = iter((scanner or scan_locally)(jobs, workers))
    try:
        for part, summary in zip(todo, results):
            summaries[part.index] = summary
            done_count, found = done_count + 1, found + summary["num_samples"]
            if progress is not None:
                progress(ScanProgress(done_count, len(partitions), found))
    finally:
        getattr(results, "close", lambda: None)()  # a local pool stops at once if this ends early
    done = [s for s in summaries if s is not None]
    assert len(done) == len(partitions)
    _check_unpacked(partitions, done, settings.unpack_dir, settings.max_unpack_bytes)
    result = ScanResult(format, source, partitions, done, spill_dir, listing.class_names)
    if result.num_samples == 0:
        skipped = result.skipped
        if skipped:  # every input was found, and left out
            counts = collections.Counter(skip_category(item.reason) for item in skipped)
            raise no_sample_error(source, every_input(len(skipped)), counts, skipped)
        raise SourceError(f"{source}: no samples found (format {format})", path=source)
    return result


def _reusable(prefix: str, part: Partition, signature: dict) -> dict | None:
    summary = load_summary(prefix)
    if summary is None or summary.get("signature") != signature:
        return None
    if summary.get("read_path") != part.path:  # an unpacked copy: gone with the earlier run's temporary folder
        return None
    if not spill_intact(prefix, summary):  # torn by a power loss, or from an older shardkit: scan it again
        return None
    return summary


def _check_unpacked(partitions: list[Partition], summaries: list[dict], unpack_dir: str | None, limit: int | None) -> None:
    """The unpacked copies of compressed inputs, all together, stay under ``limit``
    (each worker checked its own copy alone): the first input, in source order,
    whose copy takes the total past it is named."""
    budget = UnpackBudget(limit)
    for part, summary in zip(partitions, summaries):
        if summary["unpacked_bytes"]:
            budget.used += summary["unpacked_bytes"]
            budget.check(part.path, unpack_dir or "")


def _run_job(job: ScanJob) -> dict:
    return job.run()


def scan_locally(jobs: Iterable[Any], workers: int | None) -> Iterator[dict]:
    """The local :data:`Scanner`: a pool of ``workers`` processes (None: all
    cores; in this process for one worker or one job); results in order, each
    as soon as it and those before it are done, the first failure in order
    raised. ``jobs`` (anything with ``run()``: :class:`ScanJob`, the map
    stage's jobs) is drawn as the pool has room, a few per worker ahead, so
    jobs that carry their items are not all held at once."""
    workers = workers or os.cpu_count() or 1
    if isinstance(jobs, Sized):
        workers = min(workers, len(jobs))
    if workers <= 1:
        for job in jobs:
            yield job.run()
        return
    window: collections.deque[Future] = collections.deque()
    with process_pool(workers) as pool:
        try:
            for job in jobs:
                window.append(pool.submit(_run_job, job))
                if len(window) >= workers * IN_FLIGHT_PER_WORKER:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for future in window:
                future.cancel()
