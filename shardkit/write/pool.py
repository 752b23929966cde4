"""The writer's process pools: how they start, that they end with the writer,
and how work streams through them.

Scanning, shard writing, indexing and verifying each run in a
:class:`~concurrent.futures.ProcessPoolExecutor` made by :func:`process_pool`.
Its workers die with the process that made them: a writer killed by
``SIGKILL`` (the OOM killer, ``kill -9``, a scheduler) would otherwise leave
them running, still writing shards under the names a ``--resume`` run writes
too, and each would remove the other's temporary files.
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Groups of tasks :func:`run_in_pool` keeps submitted per worker process.
IN_FLIGHT_PER_WORKER = 4

#: ``prctl`` option: the signal a process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def pool_context() -> multiprocessing.context.BaseContext:
    """Start method for writer processes.

    ``fork`` where the platform has it: unlike ``spawn``/``forkserver`` it
    does not re-import the caller's ``__main__`` (which would re-run a
    training script without a main guard, or fail for ``python -c``/stdin
    programs), and a ``map`` defined there reaches the workers. What fork
    leaves in a bad state is mended as each worker starts
    (:func:`_start_worker`).
    """
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def process_pool(workers: int, initializer: Callable[..., Any] | None = None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of ``workers`` writer processes (:func:`pool_context`) that are
    killed when this process dies; ``initializer(*initargs)`` runs in each after that."""
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=pool_context(),
        initializer=_start_worker,
        initargs=(os.getpid(), initializer, initargs),
    )


def _start_worker(parent: int, initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    die_with_parent(parent)
    one_torch_thread()
    if initializer is not None:
        initializer(*initargs)


def one_torch_thread() -> None:
    """Where the parent had imported torch, run its operators on one thread
    in this forked worker, as DataLoader's workers do. The OpenMP thread pool
    that torch's operators share does not survive ``fork``: a parallel
    operator in the child (a ``.contiguous()`` copy of a clip in a user's
    ``map``) would wait forever for threads that are not there. The workers
    are the parallelism anyway."""
    torch = sys.modules.get("torch")
    set_num_threads = getattr(torch, "set_num_threads", None)
    if set_num_threads is not None:
        set_num_threads(1)


def die_with_parent(parent: int) -> bool:
    """Have the kernel kill this process when its parent dies (Linux; elsewhere
    nothing is done and False returned). ``parent`` is the pid the caller
    expects as its parent: if that one is already gone, this process exits now."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)
    return True


def group_size(count: int, workers: int, *, most: int, per_worker: int) -> int:
    """How many of ``count`` small tasks go to the pool as one group (one
    round trip each): at most ``most``, and few enough that each of
    ``workers`` still gets about ``per_worker`` groups to balance the load."""
    return max(1, min(most, count // (workers * per_worker)))


def in_groups(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last may be shorter), drawn lazily."""
    items = iter(items)
    while group := list(itertools.islice(items, size)):
        yield group


def bounded(
    groups: Iterable[T],
    submit: Callable[[T], Any],
    finished: Callable[[list[Any]], tuple[list[Any], list[Any]]],
    collect: Callable[[Any], list[R]],
    limit: int,
) -> Iterator[R]:
    """Keep at most ``limit`` groups of tasks submitted; yield results as groups finish.

    ``submit`` starts a group and returns its handle (a future, a Ray object
    ref), ``finished`` splits handles into (done, still running) once at
    least one is done, and ``collect`` gives a done handle's results. Groups
    are drawn only as room frees up, so nothing per task waits in a queue.
    """
    running: list[Any] = []
    for group in itertools.chain(groups, [None]):
        if group is not None:
            running.append(submit(group))
        while running and (len(running) >= limit or group is None):
            done, running = finished(running)
            for handle in done:
                yield from collect(handle)


def run_in_pool(
    fn: Callable[[list[T]], list[R]],
    groups: Iterable[list[T]],
    workers: int,
    *,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple = (),
) -> Iterator[R]:
    """``fn(group)`` for each group in a :func:`process_pool` of ``workers``,
    at most :data:`IN_FLIGHT_PER_WORKER` groups per worker submitted at a
    time; yields each result as its group finishes (not in order). Closing
    the iterator, or an error from ``fn``, cancels what has not started and
    waits for the rest."""

    def finished(running: list[Future]) -> tuple[list[Future], list[Future]]:
        done, rest = wait(running, return_when=FIRST_COMPLETED)
        return list(done), list(rest)

    pool = process_pool(workers, initializer, initargs)
    try:
        yield from bounded(groups, lambda group: pool.submit(fn, group), finished, Future.result,
                           workers * IN_FLIGHT_PER_WORKER)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
