"""The engines a write runs on, peers behind one interface, chosen once.

An :class:`Engine` is where a write's two parallel stages run: the scan of
the source's partitions and the shard tasks. ``"local"`` is a process pool
on this machine (:mod:`.engine_local`); ``"ray"`` runs the same scan jobs and
shard tasks as Ray tasks on a cluster (:mod:`.engine_ray`, :mod:`.scan_ray`;
Ray itself is imported only when that engine connects). Both take the same
plain, picklable tasks and give the same results, so the output never
depends on the engine. The driver (:mod:`.parallel`) asks
:func:`choose_engine` once and calls what it gets.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shardkit.write.engine_local import run_tasks_locally
from shardkit.write.engine_ray import preflight, run_tasks_on_ray, session
from shardkit.write.journal import ShardResult
from shardkit.write.options import WriteOptions
from shardkit.write.plan import ShardTask
from shardkit.write.scan import Scanner, scan_locally
from shardkit.write.scan_ray import scan_on_ray
from shardkit.write.shard_task import ShardJob

#: Runs shard tasks, yielding their results as they finish (any order).
RunTasks = Callable[[list[ShardTask], ShardJob, WriteOptions], Iterator[ShardResult]]


@dataclass(frozen=True)
class Engine:
    """Where a write's scan and shard tasks run.

    Attributes:
        name: Its name in :data:`~shardkit.write.options.ENGINES`.
        scan: Scans partitions (see :func:`~shardkit.write.scan.scan_dataset`).
        run: Runs shard tasks.
        session: What the write holds while it runs (Ray's connection; nothing locally).
    """

    name: str
    scan: Scanner
    run: RunTasks
    session: contextlib.AbstractContextManager


def _local(options: WriteOptions) -> Engine:
    return Engine("local", scan_locally, run_tasks_locally, contextlib.nullcontext())


def _ray(options: WriteOptions) -> Engine:
    preflight(options.ray_address)  # no Ray, or no cluster at that address: refused before any scan
    scan = functools.partial(scan_on_ray, max_retries=options.ray_max_retries)
    return Engine("ray", scan, run_tasks_on_ray, session(options.ray_address))


_ENGINES: dict[str, Callable[[WriteOptions], Engine]] = {"local": _local, "ray": _ray}


def choose_engine(options: WriteOptions) -> Engine:
    """The engine ``options.engine`` names, ready to run (checked, not yet connected).

    Raises:
        UsageError: Ray asked for and not installed, or nothing listening at ``ray_address``.
    """
    return _ENGINES[options.engine](options)
