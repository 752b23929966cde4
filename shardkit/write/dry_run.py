"""A write's cost before it is paid: scan and plan, write nothing (``shardkit write --dry-run``).

:func:`plan_dataset` runs the first two steps of
:func:`~shardkit.write.parallel.write_dataset` (scan the source, plan the
shards) with the same options, so its figures are the ones a write with those
options gives: samples, shards, shard bytes and the inputs left out under
``on_error="skip"``. It never touches the destination. Its spills, its plan
and the unpacked copies of input shards compressed whole live in a scratch
folder under the temporary directory (``TMPDIR``), gone when it returns. A dry
run that is killed (``SIGKILL``, ``SIGTERM``) cannot remove its own, so each
scratch folder holds a lock for its owner's lifetime, and the next dry run
removes the folders whose lock nobody holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardkit.format.manifest import SkippedInput
from shardkit.write.map_stage import map_spec
from shardkit.write.options import WriteOptions
from shardkit.write.planning import scan_and_plan
from shardkit.write.scan import ScanProgress
from shardkit.write.scratch import scratch_folder

#: Where a dry run's scratch folders start (under the temporary directory).
SCRATCH_PREFIX = "shardkit-dry-run-"


@dataclass(frozen=True)
class WritePlanSummary:
    """What writing a source would give, found by scanning and planning only.

    Attributes:
        format: The source format scanned (``"imagefolder"``, ``"jsonl"``...).
        num_inputs: Input files the shards would be read from (a JSONL
            file and the files its rows name; the images of an ImageFolder;
            the input shards); a file named by rows of two JSONL partitions
            counts twice.
        num_samples: Samples planned; a write's manifest holds as many
            (fewer only when an input vanishes before it is read and
            ``on_error="skip"`` leaves it out).
        num_shards: Shards planned.
        num_bytes: Bytes of all shard files (tar size), exact unless
            ``compress_members`` is set: then planned with the uncompressed
            member sizes, so the shards come out smaller.
        skipped: Inputs left out while scanning, with the reason.
        oversized: The first samples (``"origin (sample 'key')"``) that
            alone exceed ``max_bytes`` and would get a shard of their own.
        num_oversized: How many such samples there are in all.
        seconds: Time the scan and the plan took.
        has_urls: Table rows have fields to download: ``num_bytes`` counts
            only the bytes held in the table.
        map_not_run: The write would run a map stage (``map``, or image
            options on a file source), which a dry run does not: the samples
            and bytes are the inputs', before it.
    """

    format: str
    num_inputs: int
    num_samples: int
    num_shards: int
    num_bytes: int
    skipped: tuple[SkippedInput, ...]
    oversized: tuple[str, ...]
    seconds: float
    has_urls: bool = False
    num_oversized: int = 0
    map_not_run: bool = False


def plan_dataset(
    source: str,
    *,
    options: WriteOptions | None = None,
    scan_progress: Callable[[ScanProgress], None] | None = None,
    map: Callable[[Any], Any] | None = None,
) -> WritePlanSummary:
    """Scan ``source`` and plan its shards as :func:`write_dataset` would; write nothing.

    Args:
        source: Input dataset, as for :func:`~shardkit.write.parallel.write_dataset`.
        options: The write's options; the engine, the number of workers and
            resume/overwrite do not change the plan. With ``engine="ray"``
            the plan is made here, as a Ray write's driver makes it, and no
            cluster is contacted.
        scan_progress: As for :func:`~shardkit.write.parallel.write_dataset`.
        map: The write's function: not called (see :attr:`WritePlanSummary.map_not_run`).

    Returns:
        The plan's figures (see :class:`WritePlanSummary`).

    Raises:
        UsageError, SourceError: as ``write_dataset`` raises them while scanning.
    """
    options = options or WriteOptions()
    started = time.perf_counter()
    with scratch_folder(SCRATCH_PREFIX) as scratch:
        work, unpack_dir = os.path.join(scratch, "plan"), os.path.join(scratch, "unpack")
        os.mkdir(work)
        os.mkdir(unpack_dir)
        scanned, tasks, oversized = scan_and_plan(
            source, options, work=work, unpack_dir=unpack_dir, progress=scan_progress, run_map=False
        )
    return WritePlanSummary(
        format=scanned.format,
        num_inputs=scanned.num_files,
        num_samples=scanned.num_samples,
        num_shards=len(tasks),
        num_bytes=sum(task.planned_bytes for task in tasks),
        skipped=tuple(scanned.skipped),
        oversized=oversized.examples,
        seconds=time.perf_counter() - started,
        has_urls=scanned.has_urls,
        num_oversized=oversized.count,
        map_not_run=map_spec(map, options, scanned.format) is not None,
    )
