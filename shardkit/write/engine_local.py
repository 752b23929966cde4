"""The local engine: scans and shard tasks in a process pool on this machine
(one process with two threads for one worker).

One of the engines of :mod:`shardkit.write.engines`, the peer of the Ray
engine (:mod:`shardkit.write.engine_ray`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor, as_completed
from typing import Any

from shardkit.write.journal import ShardResult
from shardkit.write.options import WriteOptions
from shardkit.write.plan import ShardTask
from shardkit.write.pool import pool_context, process_pool
from shardkit.write.shard_task import ShardJob, init_worker, run_shard, run_shard_in_worker
from shardkit.write.sources.table import close_process_downloader


def run_tasks_locally(tasks: list[ShardTask], job: ShardJob, options: WriteOptions) -> Iterator[ShardResult]:
    """The local engine: run shard tasks in a process pool, yielding results
    as they finish (any order).

    When the caller stops early (a task failed, or the consumer raised), the
    pool is stopped: queued tasks are cancelled and running ones give up
    between samples, removing their temporary files.
    """
    workers = min(options.workers or os.cpu_count() or 1, max(len(tasks), 1))
    stop: Any
    if workers <= 1:
        # One process, two threads taking turns (see write_shard's ``turn``):
        # one shard's fsync, rename and upload overlap the next one's samples,
        # and the two do not fight over the GIL at every input file (which
        # cost an ImageFolder write a third more CPU).
        stop, turn = threading.Event(), threading.Lock()
        pool: Executor = ThreadPoolExecutor(max_workers=2)
        futures = [pool.submit(run_shard, task, job, stop=stop, turn=turn) for task in tasks]
    else:
        stop = pool_context().Event()
        pool = process_pool(workers, init_worker, (stop,))
        futures = [pool.submit(run_shard_in_worker, task, job) for task in tasks]
    try:
        for future in as_completed(futures):
            yield future.result()
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        if workers <= 1:
            close_process_downloader()  # its threads, made in this process for table rows
