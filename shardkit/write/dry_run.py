"""A write's cost before it is paid: scan and plan, write nothing (``shardkit write --dry-run``).

:func:`plan_dataset` runs the first two steps of
:func:`~shardkit.write.parallel.write_dataset` (scan the source, plan the
shards) with the same options, so its figures are the ones a write with those
options gives: samples, shards, shard bytes and the inputs left out under
``on_error="skip"``. It never touches the destination; input shards
compressed whole are unpacked into a temporary folder that is gone when it
returns.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

from shardkit.format.manifest import SkippedInput
from shardkit.write.parallel import WriteOptions, scan_and_plan


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
        oversized: Samples (``"origin (sample 'key')"``) that alone exceed
            ``max_bytes`` and would get a shard of their own.
        seconds: Time the scan and the plan took.
        has_urls: Table rows have fields to download: ``num_bytes`` counts
            only the bytes held in the table.
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


def plan_dataset(source: str, *, options: WriteOptions | None = None) -> WritePlanSummary:
    """Scan ``source`` and plan its shards as :func:`write_dataset` would; write nothing.

    Args:
        source: Input dataset, as for :func:`~shardkit.write.parallel.write_dataset`.
        options: The write's options; the engine, the number of workers and
            resume/overwrite do not change the plan. With ``engine="ray"``
            the plan is made here, as a Ray write's driver makes it, and no
            cluster is contacted.

    Returns:
        The plan's figures (see :class:`WritePlanSummary`).

    Raises:
        UsageError, SourceError: as ``write_dataset`` raises them while scanning.
    """
    options = options or WriteOptions()
    started = time.perf_counter()
    # The spills, the plan and unpacked copies of compressed inputs live in
    # temporary folders, gone when this returns.
    with tempfile.TemporaryDirectory(prefix="shardkit-unpack-") as unpack_dir:
        with tempfile.TemporaryDirectory(prefix="shardkit-plan-") as work:
            scanned, tasks, oversized = scan_and_plan(source, options, work=work, unpack_dir=unpack_dir)
    return WritePlanSummary(
        format=scanned.format,
        num_inputs=scanned.num_files,
        num_samples=scanned.num_samples,
        num_shards=len(tasks),
        num_bytes=sum(task.planned_bytes for task in tasks),
        skipped=tuple(scanned.skipped),
        oversized=tuple(oversized),
        seconds=time.perf_counter() - started,
        has_urls=scanned.has_urls,
    )
