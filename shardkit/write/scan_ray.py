"""Scanning partitions as Ray tasks (``shardkit write --engine ray``).

The driver lists the partitions (directory entries and file sizes only) and
submits one Ray task per partition, at most ``workers`` at a time (default:
two per CPU of the cluster). A task scans its partition exactly as a local
scanning process does (:meth:`~shardkit.write.scan.ScanJob.run`), into a
temporary folder on its own node, then streams the spill's files back as a Ray
generator, :data:`CHUNK_BYTES` at a time. The driver writes each piece into
the spill folder in DEST's work folder as it arrives, the summary last (its
presence marks the spill complete, as for a local scan), so the driver holds
one piece at a time, and it needs no file system shared with the nodes for the
spills. The pieces of the tasks in flight wait in Ray's object store, whose
pages the driver maps as it reads them: its resident memory is bounded by the
tasks in flight times one partition's spill (about 64 bytes a sample of that
partition plus its key, and a JSONL row's inline values), plus O(partitions +
shards), never by the number of samples. (Measured on a one-machine cluster of
2 CPUs, the driver's peak RSS after scan + plan: 4 MiB JSONL partitions, 4
tasks in flight: 151 MB for 10^5 rows, 175 MB for 10^6; 64 MiB partitions, 2
in flight, the three partitions of 10^6 rows all scanned before the first was
read: 248 MB.) Spills are read in partition order and, as everywhere, errors
are those of the first failing partition in that order: a malformed line, a
vanished input file, give the local engine's error, one line, exit 2.

What the tasks read: the source by the same path the driver lists it by. On a
one-machine cluster that is any local path; on a cluster of several machines
the source must sit on a file system every node mounts at the same path (NFS,
a FUSE mount of a bucket...). Before any partition is scanned a probe task on
every alive node checks a partition of the source, and a source only the
driver sees is refused there, naming the path and the node (copy it to shared
storage, or write with ``--engine local``). Input shards compressed whole are
the exception: scanning one writes its plain copy into DEST's work folder,
which the shard writers read later, and those partitions are scanned by tasks
pinned to the driver's node, which wrote the folder's other files.

A task stages its partition's spill in its node's temporary folder
(``TMPDIR`` of the Ray workers) before streaming it, so that folder needs
room for one spill per task running there (about 64 bytes a sample plus its
key and a JSONL row's inline values); a full one stops the write with the folder named.

A task lost with its worker or node is run again (``ray_max_retries``); its
spill's bytes depend only on its partition, so a replay yields the same
pieces. An error raised by the scan itself (bad input) is not retried.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from shardkit.errors import SourceError
from shardkit.write.engine_ray import check_nodes_see, default_max_in_flight, require_ray, session, task_result
from shardkit.write.scan import ScanJob
from shardkit.write.spill import spill_error, spill_prefix

#: Bytes of one piece of a spill streamed from a task to the driver.
CHUNK_BYTES = 4 << 20
#: Name of the scanning tasks (Ray titles their worker processes ``ray::NAME``).
TASK_NAME = "shardkit_scan_partition"


def _scan_and_stream(job: ScanJob) -> Iterator[tuple[str, bytes]]:
    """Body of one Ray task: scan ``job`` (or run a map stage's job) into a
    temporary folder of this node, then yield the files it left as ``(file
    suffix, piece)`` pairs, file by file in ``job.files`` order, the summary
    last (an empty file as one empty piece)."""
    folder = tempfile.mkdtemp(prefix="shardkit-scan-")
    try:
        job.run(spill_dir=folder)
        prefix = spill_prefix(folder, job.part.index)
        for suffix in job.files:
            with open(prefix + suffix, "rb") as f:
                piece = f.read(CHUNK_BYTES)
                yield suffix, piece
                while piece := f.read(CHUNK_BYTES):
                    yield suffix, piece
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def scan_on_ray(
    jobs: Iterable[ScanJob], workers: int | None, *, address: str | None = None, max_retries: int = 3
) -> Iterator[dict]:
    """The Ray :data:`~shardkit.write.scan.Scanner`: scan ``jobs`` as Ray tasks.

    Args:
        jobs: The partitions to scan, in source order (or the map stage's
            jobs, :class:`~shardkit.write.mapping.MapJob`), drawn as tasks
            have room.
        workers: Tasks in flight at once (None: two per CPU of the cluster).
        address: The cluster (see :func:`~shardkit.write.engine_ray.connect`)
            when this process is not connected yet.
        max_retries: How often a task lost with its worker or node is run again.

    Yields:
        The summaries, in job order, each once it and those before it are
        received; the spills are in each job's ``spill_dir``.

    Raises:
        UsageError: The cluster cannot be reached, or a node cannot see the source.
        ShardkitError: The first failing partition's error, in job order.
        DestinationError: The driver cannot write the spill folder.
    """
    pending = iter(jobs)
    first = next(pending, None)
    if first is None:
        return
    ray = require_ray()
    with session(address):
        yield from _scan_all(ray, first, itertools.chain([first], pending), workers, max_retries)


def _scan_all(ray: Any, first: ScanJob, pending: Iterator[ScanJob], workers: int | None, max_retries: int) -> Iterator[dict]:
    """:func:`scan_on_ray` once connected; ``first`` is ``pending``'s first job."""
    running: deque[tuple[ScanJob, Any]] = deque()
    try:
        _check_nodes_see_the_source(first)
        task = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False)(_scan_and_stream)
        here = _driver_node(ray)
        limit = workers or default_max_in_flight(ray)
        while True:
            while len(running) < limit and (job := next(pending, None)) is not None:
                pinned = {"scheduling_strategy": here} if job.unpacks and here is not None else {}
                running.append((job, task.options(name=TASK_NAME, **pinned).remote(job)))
            if not running:
                return
            job, stream = running[0]
            yield _receive(ray, job, stream)
            running.popleft()
    finally:
        for _, stream in running:  # a partition failed: stop the others
            try:
                ray.cancel(stream)
            except Exception:  # already finished, or gone with its node
                pass


def _receive(ray: Any, job: ScanJob, stream: Any) -> dict:
    """Write the spill ``stream`` yields into ``job.spill_dir``, each file
    through a temporary name, the summary last; return the summary."""
    prefix = spill_prefix(job.spill_dir, job.part.index)
    out = None
    current = ""
    try:
        for ref in stream:
            suffix, piece = _piece(ray, ref, job)  # the scan's own error, raised as it is
            try:
                if suffix != current:
                    _close(out, prefix + current)
                    current, out = suffix, open(prefix + suffix + ".tmp", "wb")
                out.write(piece)
            except OSError as exc:
                raise spill_error(exc, job.spill_dir, job.part.path) from exc
        try:
            _close(out, prefix + current)
        except OSError as exc:
            raise spill_error(exc, job.spill_dir, job.part.path) from exc
        out = None
    finally:
        if out is not None and not out.closed:  # no half file left behind
            out.close()
            os.unlink(out.name)
    assert current == job.files[-1], f"{job.part.path}: the scan's spill came back incomplete"
    with open(prefix + current, "rb") as f:
        return json.load(f)


def _close(out: Any, path: str) -> None:
    """Finish one received file: give it its final name. (No fsync: as for a
    local scan, the summary's sizes and CRCs vouch for the files on reuse.)"""
    if out is None:
        return
    out.close()
    os.replace(out.name, path)


def _piece(ray: Any, ref: Any, job: ScanJob) -> tuple[str, bytes]:
    """One piece of a spill; the scan's own error (not Ray's wrapper) when it failed."""
    path = job.part.path
    error = functools.partial(SourceError, path=path)
    return task_result(ray, ref, subject=path, doing="scanning it", kept="partitions already scanned", error=error)


def _driver_node(ray: Any) -> Any:
    """A scheduling strategy that keeps a task on the driver's node (None: no node here, a Ray client)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        node = ray.get_runtime_context().get_node_id()
    except Exception:
        return None
    return NodeAffinitySchedulingStrategy(node, soft=False) if node else None


def _check_nodes_see_the_source(first: ScanJob) -> None:
    """Every node sees the source (the first partition's input, when the
    driver sees it: one that vanished is left to its scan, which names it; a
    Python sequence's items travel with the tasks)."""
    seen = first.part.path if os.path.exists(first.part.path) else None
    check_nodes_see([seen] if seen is not None else [])
