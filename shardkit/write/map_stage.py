"""The map stage from the driver's side: its partitions, what ``--resume``
keeps, the engine that runs its jobs, and the :class:`~shardkit.write.scan.ScanResult`
the plan takes from it (see :mod:`shardkit.write.mapping` for what a job does).

Two inputs:

- a Python sequence (:func:`map_sequence`): partitions are ranges of
  positions, :func:`~shardkit.write.sources.mapped.items_per_partition` items each;
- a scanned path source (:func:`map_scanned`): its samples in source order
  (partition by partition, each in its own order), cut the same way; a job
  carries the spill records of its samples and reads them from their inputs.

Jobs are made one at a time as the engine has room for them, so the driver
holds the items (or records) of the partitions in flight only.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import SourceError
from shardkit.format.manifest import skip_category
from shardkit.write.mapping import MapJob, MapSpec, SequenceItems, reusable_summary, stage_path, take
from shardkit.write.no_sample import EXAMPLES_NAMED, FILTERED, filtered_examples, no_sample_error
from shardkit.write.scan import ScanProgress, ScanResult, Scanner
from shardkit.write.sources import source_kind
from shardkit.write.sources.base import Partition, SourceSettings
from shardkit.write.sources.mapped import MAPPED, SEQUENCE, SEQUENCE_SOURCE, InputPart, ScannedItems, item_partitions
from shardkit.write.sources.table import TABLE_KINDS
from shardkit.write.spill import SpillFetcher, SpillReader, spill_prefix


@dataclass(frozen=True)
class StageRun:
    """How a write runs its map stage.

    Attributes:
        spill_dir: The stage's folder (``DEST/.shardkit-journal/map``).
        seed: The shuffle seed.
        on_error: ``"raise"`` or ``"skip"`` for items that fail.
        reuse: ``--resume``: keep the partitions an earlier run finished.
        workers: Processes (or Ray tasks) in flight; None: the engine's default.
        scanner: The engine that runs the jobs (see :data:`~shardkit.write.scan.Scanner`).
        progress: Told as partitions finish, counting items.
        ingest: For a table source: how its rows' fields are fetched and
            their images prepared before ``map`` sees them
            (:class:`~shardkit.write.sources.table.IngestOptions`).
        row_errors: For a table source: ``"raise"`` or ``"skip"`` for rows
            whose fields could not be fetched.
    """

    spill_dir: str
    seed: int
    on_error: str
    reuse: bool
    workers: int | None
    scanner: Scanner
    progress: Callable[[ScanProgress], None] | None = None
    ingest: Any = None
    row_errors: str = "skip"

    def job(self, part: Partition, items: Any, spec: MapSpec) -> MapJob:
        """The job of ``part``, to map ``items``."""
        signature = {"start": part.start, "end": part.end, "seed": self.seed,
                     "on_error": self.on_error, **spec.identity()}  # fmt: skip
        return MapJob(part, items, spec, self.spill_dir, self.seed, self.on_error, signature)


def map_spec(fn: Callable[[Any], Any] | None, options: Any, format: str) -> MapSpec | None:
    """The map stage a write of a ``format`` source runs, or None for none.

    A sequence always has one (without ``fn`` its items are samples). A path
    source has one for ``fn``, or for image options (``resize``,
    ``image_format``), which the stage applies to every image field; a table
    prepares its images as it downloads them, so image options alone run no
    stage there.
    """
    wanted = options.resize is not None or options.image_format is not None
    images = options.ingest_options().images if wanted and format not in TABLE_KINDS else None
    if fn is None and images is None and format != SEQUENCE:
        return None
    return MapSpec(fn, images)


def stage_info(scanned: ScanResult) -> dict:
    """What the manifest's ``source`` records of a map stage ({} without one):
    the function, the items it read and those it dropped."""
    counts = stage_counts(scanned)
    if not counts:
        return {}
    return {"map": scanned.summaries[0]["signature"]["map"], "num_items": counts["num_items"],
            "num_filtered": counts["num_filtered"]}  # fmt: skip


def stage_counts(scanned: ScanResult) -> dict[str, int]:
    """Items read, dropped by ``map`` (None) and failed, for the write's report (zeros without a stage)."""
    if not scanned.partitions or scanned.partitions[0].kind != MAPPED:
        return {}
    return {name: sum(int(s[name]) for s in scanned.summaries) for name in ("num_items", "num_filtered", "num_failed")}


def map_sequence(items: Sequence, spec: MapSpec, run: StageRun) -> ScanResult:
    """Run ``spec`` over ``items`` into stages under ``run.spill_dir``.

    Raises:
        SourceError: No items, or no item gave a sample.
        MapError: An item failed under ``on_error="raise"``.
        UsageError: Items that do not pickle.
    """
    num_items = len(items)
    if num_items == 0:
        raise SourceError(f"{SEQUENCE_SOURCE}: the sequence is empty; there is nothing to write", path=SEQUENCE_SOURCE)
    parts = source_kind(SEQUENCE).partitions(items, SourceSettings()).partitions
    # Items travel to the workers pickled: the first partition's are tried
    # here, so items that do not pickle are named before any work starts.
    SequenceItems(0, take(items, parts[0].start, parts[0].end)).digest()

    def job(part: Partition) -> MapJob:
        some = SequenceItems(part.start, take(items, part.start, part.end))
        return run.job(part, some, spec)

    summaries = _run(parts, job, num_items, run)
    return _result(SEQUENCE, SEQUENCE_SOURCE, parts, summaries, run.spill_dir, None)


def map_scanned(scanned: ScanResult, spec: MapSpec, run: StageRun) -> ScanResult:
    """Run ``spec`` over the samples of a scanned path source, in source
    order, into stages under ``run.spill_dir`` (not the scan's folder).

    Raises:
        As :func:`map_sequence`; InputFileError for an input that cannot be
        read under ``on_error="raise"``.
    """
    counts = [int(s["num_samples"]) for s in scanned.summaries]
    num_items = sum(counts)
    parts = item_partitions(num_items, scanned.source)
    inputs = _ScannedInputs(scanned, counts, run)

    def job(part: Partition) -> MapJob:
        some = inputs.items(part.start, part.end)
        return run.job(part, some, spec)

    try:
        summaries = _run(parts, job, num_items, run)
    finally:
        inputs.close()
    return _result(scanned.format, scanned.source, parts, summaries, run.spill_dir, scanned.class_names,
                   num_files=scanned.num_files, skipped=scanned.summaries)  # fmt: skip


class _ScannedInputs:
    """The scanned samples of a path source by their position in source order."""

    def __init__(self, scanned: ScanResult, counts: list[int], run: StageRun):
        self.scanned = scanned
        self.counts = counts
        self.run = run
        self.kinds = [source_kind(p.kind) for p in scanned.partitions]
        self._fetchers: dict[int, SpillFetcher] = {}
        self._readers: dict[int, SpillReader] = {}

    def items(self, start: int, end: int) -> ScannedItems:
        """The samples at positions ``[start, end)``, with the scan's records of them."""
        parts: list[InputPart] = []
        rows: list[tuple[int, bytes, bytes, tuple]] = []
        first = 0
        for index, count in enumerate(self.counts):
            lo, hi = max(start, first) - first, min(end, first + count) - first
            first += count
            if hi <= lo:
                continue
            order = np.array(self._reader(index).by_source[lo:hi])  # the slice only, not the whole order
            records, keys, names = self._fetcher(index).fetch(order)
            at = len(parts)
            parts.append(InputPart(self.scanned.partitions[index], self.scanned.summaries[index]["read_path"],
                                   self.kinds[index]))  # fmt: skip
            rows += [(at, key, name, tuple(values)) for key, name, values in zip(keys, names, records.tolist())]
        return ScannedItems(tuple(parts), tuple(rows), self.run.ingest, self.run.row_errors)

    def _reader(self, index: int) -> SpillReader:
        reader = self._readers.get(index)
        if reader is None:
            reader = self._readers[index] = self.scanned.reader(index)
        return reader

    def _fetcher(self, index: int) -> SpillFetcher:
        fetcher = self._fetchers.get(index)
        if fetcher is None:
            fetcher = self._fetchers[index] = SpillFetcher(spill_prefix(self.scanned.spill_dir, index))
        return fetcher

    def close(self) -> None:
        for fetcher in self._fetchers.values():
            fetcher.close()
        self._fetchers.clear()
        self._readers.clear()


def _run(parts: list[Partition], make_job: Callable[[Partition], MapJob], num_items: int, run: StageRun) -> list[dict]:
    """Run the jobs of ``parts`` that ``run.reuse`` does not keep; every partition's summary, in order."""
    os.makedirs(run.spill_dir, exist_ok=True)
    summaries: list[dict | None] = [None] * len(parts)
    tally = _Tally(len(parts), num_items, run.progress)

    def todo() -> Iterator[MapJob]:
        for part in parts:
            job = make_job(part)
            kept = reusable_summary(run.spill_dir, part.index, job.full_signature()) if run.reuse else None
            if kept is None:
                yield job
            else:
                summaries[part.index] = kept
                tally.done(kept)

    tally.report()
    results = iter(run.scanner(todo(), run.workers))
    try:
        for summary in results:
            summaries[summary["partition"]] = summary
            tally.done(summary)
    finally:
        getattr(results, "close", lambda: None)()  # a local pool stops at once if this ends early
    done = [s for s in summaries if s is not None]
    assert len(done) == len(parts)
    for part, summary in zip(parts, done):
        summary["read_path"] = stage_path(run.spill_dir, part.index)  # a Ray task staged it elsewhere first
    return done


class _Tally:
    """Progress events of the map stage, counted in partitions and items."""

    def __init__(self, num_partitions: int, num_items: int, progress: Callable[[ScanProgress], None] | None):
        self.num_partitions, self.num_items, self.progress = num_partitions, num_items, progress
        self.partitions = self.items = self.samples = 0

    def done(self, summary: dict) -> None:
        self.partitions += 1
        self.items += int(summary["num_items"])
        self.samples += int(summary["num_samples"])
        self.report()

    def report(self) -> None:
        if self.progress is not None:
            self.progress(ScanProgress(self.partitions, self.num_partitions, self.samples, self.items, self.num_items))


def _result(
    format: str,
    source: str,
    parts: list[Partition],
    summaries: list[dict],
    spill_dir: str,
    class_names: tuple[str, ...] | None,
    *,
    num_files: int = 0,
    skipped: Sequence[dict] = (),
) -> ScanResult:
    """The stage as the plan takes it; an error when no item gave a sample."""
    scan_skips = [entry for s in skipped for entry in s["skipped"]]  # inputs the scan left out
    if scan_skips:
        summaries[0] = {**summaries[0], "skipped": scan_skips + list(summaries[0]["skipped"])}
    result = ScanResult(format, source, parts, summaries, spill_dir, class_names, input_files=num_files)
    if result.num_samples == 0:
        counts = stage_counts(result)
        failures = result.skipped  # the scan's, then the stage's
        by_reason = collections.Counter(skip_category(item.reason) for item in failures)
        by_reason[FILTERED] = counts["num_filtered"]
        raise no_sample_error(
            source, f"of {counts['num_items']} items, map dropped {counts['num_filtered']} (returned None) and "
            f"{counts['num_failed']} failed", by_reason, failures[:EXAMPLES_NAMED] + filtered_examples(summaries),
        )  # fmt: skip
    return result
