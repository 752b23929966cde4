"""Counters a dataset shares with its DataLoader workers: the epoch, the
skipped-fault count and the count of samples ``select`` filtered out (used
by :class:`~shardkit.ShardDataset` and
:class:`~shardkit.IndexedDataset`)."""

from __future__ import annotations

import multiprocessing
from typing import Any


def _starting_a_process(value: Any) -> bool:
    """Whether a process is being started right now: the one time shared
    memory may be pickled (a shared value refuses, with a RuntimeError, at
    any other time)."""
    try:
        value.__reduce__()
    except RuntimeError:
        return False
    return True


def _adopt_counters(epoch: Any, skipped: Any, filtered: Any) -> SharedCounters:
    counters = SharedCounters.__new__(SharedCounters)
    counters.epoch, counters.skipped, counters.filtered = epoch, skipped, filtered
    return counters


class SharedCounters:
    """The epoch, the skipped-fault count and the count of samples
    ``select`` filtered out, shared with DataLoader workers.

    Workers made by ``fork`` inherit the shared memory; workers started by
    ``spawn`` or ``forkserver`` receive it through the pickling that starts
    them. Any other pickling (``pickle.dumps``, ``copy.deepcopy``, Ray)
    carries the current values into fresh counters of their own.
    """

    def __init__(self, epoch: int = 0, skipped: int = 0, filtered: int = 0):
        # The spawn context's lock can be shared by fork, forkserver and spawn workers.
        context = multiprocessing.get_context("spawn")
        self.epoch = context.Value("q", epoch)
        self.skipped = context.Value("q", skipped)
        self.filtered = context.Value("q", filtered)

    def count_skip(self, exc: Exception) -> None:
        """Count one skipped fault (the reader's ``on_skip``)."""
        with self.skipped.get_lock():
            self.skipped.value += 1

    def count_filtered(self) -> None:
        """Count one sample ``select`` filtered out."""
        with self.filtered.get_lock():
            self.filtered.value += 1

    def __reduce__(self) -> tuple[Any, ...]:
        if _starting_a_process(self.epoch):
            return _adopt_counters, (self.epoch, self.skipped, self.filtered)
        return SharedCounters, (int(self.epoch.value), int(self.skipped.value), int(self.filtered.value))
