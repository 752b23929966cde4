"""One shard task: write a planned shard, wherever the engine runs it.

:func:`write_shard` writes one :class:`~shardkit.write.plan.ShardTask` into a
local folder; :func:`run_shard` is what an engine runs (a process of the local
pool, a Ray task): it writes the shard through the run's
:class:`~shardkit.write.publisher.ShardPublisher`, in place or staged and
uploaded. Both take only picklable values, so any executor can run a plan
shard by shard.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shardkit.errors import InputFileError, ShardkitError
from shardkit.format.compression import Compression, compress, compressed_extension, should_compress
from shardkit.format.manifest import SkippedInput
from shardkit.write.destination import output_error
from shardkit.write.journal import ShardResult, journal_record
from shardkit.write.plan import PlanReader, ShardTask
from shardkit.write.publisher import ShardPublisher
from shardkit.write.shard import ShardFile
from shardkit.write.sources import load_sample, source_kind
from shardkit.write.sources.jsonl import unpack_inline
from shardkit.write.sources.table import IngestOptions, table_rows


@dataclass(frozen=True)
class ShardJob:
    """What every shard task of one write shares.

    Attributes:
        publisher: Where the shards go.
        arguments: Keyword arguments of :func:`write_shard`
            (``WriteOptions.shard_arguments()``).
    """

    publisher: ShardPublisher
    arguments: dict[str, Any]


def run_shard(
    task: ShardTask, job: ShardJob, *, stop: Any = None, plan: PlanReader | None = None, turn: Any = None
) -> ShardResult:
    """Write and publish one shard: the body of every engine's task.

    Args:
        task: The planned shard.
        job: The write's publisher and shard options.
        stop: The run's stop event, if any (see :func:`write_shard`).
        plan: The rows the task carries, if it does (see :func:`write_shard`).
        turn: A lock the tasks running in threads of one process share (see
            :func:`write_shard`).

    Raises:
        As :func:`write_shard`, and RemoteError when the upload failed for good.
    """
    return job.publisher.publish(
        task.name, lambda folder: write_shard(task, folder, stop=stop, plan=plan, turn=turn, **job.arguments)
    )


def _compress_fields(fields: list[tuple[str, bytes]], kind: Compression | None) -> list[tuple[str, bytes]]:
    """Compress the members worth compressing, renaming ``txt`` to ``txt.gz``."""
    if kind is None:
        return fields
    out = [
        (compressed_extension(ext, kind), compress(data, kind) if should_compress(ext) else data) for ext, data in fields
    ]
    return sorted(out, key=lambda field: field[0])  # members of a sample stay in sorted order


#: Samples written between two looks at the stop event (a process pool's
#: event takes a lock each time: ~0.5 us, as much as a tiny sample's header).
_STOP_CHECK_ROWS = 32


class _Stopped(Exception):
    """A shard task given up because the run is stopping (another task failed)."""


def write_shard(
    task: ShardTask,
    dest: str,
    *,
    on_error: str = "raise",
    stop: Any = None,
    compress_members: Compression | None = None,
    ingest: IngestOptions | None = None,
    download_errors: str = "skip",
    plan: PlanReader | None = None,
    turn: Any = None,
) -> ShardResult:
    """Write one planned shard into local directory ``dest``.

    Args:
        task: The planned shard.
        dest: The output directory.
        on_error: ``"raise"`` or ``"skip"`` for inputs that cannot be read.
        stop: An event (``threading`` or ``multiprocessing``); once it is set
            the task gives up at its next look (one every 32 samples, from the
            first), leaving no file behind.
        compress_members: See :attr:`~shardkit.write.parallel.WriteOptions.compress_members`.
        ingest: For a table source: how fields are fetched and images
            prepared (see :mod:`shardkit.write.sources.table`).
        download_errors: For a table source: ``"skip"`` records rows whose
            fields could not be fetched or checked, ``"raise"`` stops.
        plan: Where the task's samples are read from: its rows of the plan's
            files (None, the default) or the rows it carries
            (:class:`~shardkit.write.carried.CarriedPlan`).
        turn: A lock held while the task makes its samples from input files,
            and let go while it hashes and writes them (see
            :class:`~shardkit.write.shard.ShardFile`) and once the shard is
            to be finished (fsync, index, rename) and published. Tasks in two
            threads of one process take turns: one runs Python while the
            other runs without the GIL, and they do not contend for it at
            every file read. (Table rows, which wait on downloads, take no turn.)

    Raises:
        InputFileError: An input vanished, became unreadable or changed, and
            ``on_error`` is ``"raise"``. No file is left under the final name.
        SourceError: A table row could not be stored under
            ``download_errors="raise"``.
        DestinationError: The shard, its index or its journal record could
            not be written (disk full, read-only, no permission); the message
            names the file and what to do. No temporary file is left.
    """
    skipped = []
    path = os.path.join(dest, task.name)
    try:
        with plan or PlanReader(task) as plan:
            if plan.partitions and source_kind(plan.partitions[0].kind).rows_in_spill:
                rows = table_rows(plan, task, ingest=ingest, on_error=download_errors, input_errors=on_error)
                turn = None
            else:
                rows = _file_rows(plan, task, on_error, joined=compress_members is None)
            with ShardFile(path, turn=turn) as shard:
                number = 0
                with turn or contextlib.nullcontext():
                    for row in rows:
                        if stop is not None and (type(row) is _Carried or not number % _STOP_CHECK_ROWS) and stop.is_set():
                            raise _Stopped(task.name)
                        if type(row) is _Carried:
                            shard.add_joined_block(row.keys, row.joined)
                        elif isinstance(row, SkippedInput):
                            skipped.append(row)
                        else:
                            shard.add(row[0], _compress_fields(row[1], compress_members))
                        number += 1
                written = shard.commit()
        result = ShardResult(
            index=task.index, entry=written.entry(), fingerprint=task.fingerprint, skipped=tuple(skipped),
            token_fields=written.token_fields, token_totals=written.token_totals,
        )
        journal_record(dest, result)
    except ShardkitError:
        raise
    except OSError as exc:
        raise output_error(exc, path) from exc
    return result


@dataclass(frozen=True)
class _Carried:
    """A block of samples whose values the scan carried (JSONL rows whose
    files are as scanned): keys, and members joined
    (:func:`~shardkit.format.tar.join_members`), as the spill holds them."""

    keys: list[bytes]
    joined: list[bytes]


def _file_rows(
    plan: PlanReader, task: ShardTask, on_error: str, *, joined: bool = False
) -> Iterator[tuple[str, list] | SkippedInput | _Carried]:
    """A task's samples read from their input files, ``(key, fields)``, or
    the skip record of one that could not be read (``on_error="skip"``).
    With ``joined``, a block of samples whose values the scan carried comes
    as one :class:`_Carried`."""
    for block in plan.blocks(task):
        parts = set(block.parts)
        kinds = {part: source_kind(plan.partitions[part].kind) for part in parts}
        carried = {part for part in parts if kinds[part].inline_values and plan.unchanged(part)}
        if joined and carried == parts and all(block.names):
            yield _Carried(block.keys, block.names)
            continue
        if joined and all(kinds[part].joined_in_stage for part in parts):
            yield _Carried(block.keys, [
                kinds[part].joined(plan.partitions[part], plan.read_paths[part], name, rec, plan.read_range)
                for part, _, name, rec in block.samples()
            ])  # fmt: skip
            continue
        for part, key, name, rec in block.samples():
            if name and part in carried:
                # Its values were spilled by the scan, and the file is as scanned.
                yield key, unpack_inline(name)
                continue
            try:
                fields = load_sample(
                    plan.partitions[part], plan.read_paths[part], key, name.decode("utf-8", "surrogateescape"), rec,
                    plan.read_range,
                )
            except InputFileError as exc:
                if on_error == "raise":
                    raise
                yield SkippedInput(path=exc.path or plan.partitions[part].path, reason=str(exc))
                continue
            yield key, fields


def run_shard_in_worker(task: ShardTask, job: ShardJob) -> ShardResult:
    """:func:`run_shard` in a process of the local pool (its stop event set by :func:`init_worker`)."""
    return run_shard(task, job, stop=_worker_stop)


#: The run's stop event in a writer process (set by the pool initializer).
_worker_stop: Any = None


def init_worker(stop: Any) -> None:
    """Pool initializer: remember the run's stop event."""
    global _worker_stop
    _worker_stop = stop
