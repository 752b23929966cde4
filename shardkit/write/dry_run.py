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
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.format.manifest import SkippedInput
from shardkit.write.inputs import InputSample
from shardkit.write.limits import ShardLimits
from shardkit.write.parallel import WriteOptions, scan_for_write
from shardkit.write.plan import plan_shards


@dataclass(frozen=True)
class WritePlanSummary:
    """What writing a source would give, found by scanning and planning only.

    Attributes:
        format: The source format scanned (``"imagefolder"``, ``"jsonl"``...).
        num_inputs: Distinct input files the shards would be read from (a
            JSONL file and the files its rows name; the images of an
            ImageFolder; the input shards).
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
    """

    format: str
    num_inputs: int
    num_samples: int
    num_shards: int
    num_bytes: int
    skipped: tuple[SkippedInput, ...]
    oversized: tuple[str, ...]
    seconds: float


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
    with tempfile.TemporaryDirectory(prefix="shardkit-unpack-") as unpack_dir:
        scanned = scan_for_write(source, options, unpack_dir=unpack_dir)
    limits = ShardLimits(max_samples=options.max_samples, max_bytes=options.max_bytes)
    tasks, oversized = plan_shards(scanned.samples, limits=limits, seed=options.seed, shuffle=options.shuffle)
    return WritePlanSummary(
        format=scanned.format,
        num_inputs=count_input_files(scanned.samples),
        num_samples=len(scanned.samples),
        num_shards=len(tasks),
        num_bytes=sum(task.planned_bytes for task in tasks),
        skipped=tuple(scanned.skipped),
        oversized=tuple(f"{s.origin} (sample {s.key!r})" for s in oversized),
        seconds=time.perf_counter() - started,
    )


def count_input_files(samples: Sequence[InputSample]) -> int:
    """Distinct files the samples' bytes come from: a field's own file, else
    the input shard, else the file the sample was read from (a JSONL row's)."""
    files: set[str] = set()
    for sample in samples:
        if sample.tar_range is not None:
            files.add(sample.tar_origin or sample.tar_range[0])
            continue
        for field in sample.fields:
            files.add(field.path if field.path is not None else sample.origin)
    return len(files)
