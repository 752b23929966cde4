"""Scan and plan, the first two steps of a write (and all of its dry run):
the source scanned into spills (and mapped, when there is a map stage),
then cut into shard tasks. :mod:`.parallel` runs the tasks and publishes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from shardkit.write.limits import ShardLimits
from shardkit.write.map_stage import StageRun, map_scanned, map_sequence, map_spec
from shardkit.write.mapping import is_path
from shardkit.write.options import WriteOptions
from shardkit.write.plan import Oversized, ShardTask, plan_shards
from shardkit.write.scan import ScanProgress, ScanResult, Scanner, resolve_format, scan_dataset, scan_locally
from shardkit.write.sources import check_options
from shardkit.write.sources.base import SourceSettings
from shardkit.write.sources.mapped import SEQUENCE, SEQUENCE_SOURCE
from shardkit.write.sources.table import note_image_format, planned_options


def scan_and_plan(
    source: str | Sequence,
    options: WriteOptions,
    *,
    work: str,
    unpack_dir: str,
    scanner: Scanner = scan_locally,
    progress: Callable[[ScanProgress], None] | None = None,
    map: Callable[[Any], Any] | None = None,
    run_map: bool = True,
) -> tuple[ScanResult, list[ShardTask], Oversized]:
    """Scan ``source`` into ``work/scan``, run the map stage into
    ``work/map`` when there is one (a sequence, ``map``, or image options on
    a file source: see :func:`~shardkit.write.map_stage.map_spec`), and plan
    into ``work/plan``, as a write with ``options`` does (its dry run too, with
    the local scanner and ``run_map=False``: the inputs are planned as they
    are); ``progress`` follows the scan and the map stage (see
    :class:`~shardkit.write.scan.ScanProgress`).

    Returns:
        The scan (or the map stage), the shard tasks, and the samples over ``max_bytes``.
    """
    spill_dir, map_dir, plan_dir = (os.path.join(work, name) for name in ("scan", "map", "plan"))
    os.makedirs(spill_dir, exist_ok=True)
    shutil.rmtree(plan_dir, ignore_errors=True)
    os.makedirs(plan_dir)
    stage = StageRun(map_dir, options.seed, options.input_errors, options.resume, options.workers, scanner, progress,
                     ingest=options.ingest_options(), row_errors=options.download_errors)  # fmt: skip
    if not is_path(source):
        check_options(options, SEQUENCE, SEQUENCE_SOURCE)
        scanned = map_sequence(source, map_spec(map, options, SEQUENCE), stage)
    else:
        source = os.fspath(source)
        format = resolve_format(source, options.format)
        check_options(options, format, source)  # an option this kind does not use is refused, not ignored
        note_image_format(options)
        settings = SourceSettings(
            partition_bytes=options.partition_bytes, files_root=options.files_root, fields=options.field_map(),
            table_output=options.ingest_options().output_signature(), unpack_dir=unpack_dir,
            max_unpack_bytes=options.max_unpack_bytes,
        )  # fmt: skip
        scanned = scan_dataset(
            source, spill_dir=spill_dir, format=format, on_error=options.input_errors, seed=options.seed,
            workers=options.workers, settings=settings, reuse=options.resume, scanner=scanner, progress=progress,
        )
        spec = map_spec(map, options, format)
        if spec is not None and run_map:
            scanned = map_scanned(scanned, spec, stage)
    options = planned_options(options, scanned)
    limits = ShardLimits(max_samples=options.max_samples, max_bytes=options.max_bytes)
    tasks, oversized = plan_shards(
        scanned, limits=limits, shuffle=options.shuffle, plan_dir=plan_dir, first_shard=options.first_shard
    )
    return scanned, tasks, oversized
