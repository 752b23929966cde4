"""The writer's process pools: how they start, and that they end with the writer.

Scanning, shard writing and indexing each run in a
:class:`~concurrent.futures.ProcessPoolExecutor` made by :func:`process_pool`.
Its workers die with the process that made them: a writer killed by
``SIGKILL`` (the OOM killer, ``kill -9``, a scheduler) would otherwise leave
them running, still writing shards under the names a ``--resume`` run writes
too, and each would remove the other's temporary files.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

#: ``prctl`` option: the signal a process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def pool_context() -> multiprocessing.context.BaseContext:
    """Start method for writer processes.

    ``fork`` where the platform has it: the workers only read files, hash and
    write, so they need nothing that fork could leave in a bad state, and
    unlike ``spawn``/``forkserver`` it does not re-import the caller's
    ``__main__`` (which would re-run a training script without a main guard,
    or fail for ``python -c``/stdin programs).
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
    if initializer is not None:
        initializer(*initargs)


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
