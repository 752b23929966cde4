"""Counters a dataset shares with its DataLoader workers: the epoch, the
skipped-fault count and the epoch the last iteration started (used by
:class:`~shardkit.ShardDataset` and :class:`~shardkit.IndexedDataset`)."""

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


def _adopt_counters(epoch: Any, skipped: Any, started: Any) -> SharedCounters:
    counters = SharedCounters.__new__(SharedCounters)
    counters.epoch, counters.skipped, counters.started = epoch, skipped, started
    return counters


#: ``started`` once a repeated epoch has been reported (epochs are >= 0).
_REPORTED = -2


class SharedCounters:
    """The epoch, the skipped-fault count and the epoch the last iteration
    started, shared with DataLoader workers.

    Workers made by ``fork`` inherit the shared memory; workers started by
    ``spawn`` or ``forkserver`` receive it through the pickling that starts
    them. Any other pickling (``pickle.dumps``, ``copy.deepcopy``, Ray)
    carries the current values into fresh counters of their own.
    """

    def __init__(self, epoch: int = 0, skipped: int = 0, started: int = -1):
        # The spawn context's lock can be shared by fork, forkserver and spawn workers.
        context = multiprocessing.get_context("spawn")
        self.epoch = context.Value("q", epoch)
        self.skipped = context.Value("q", skipped)
        self.started = context.Value("q", started)

    def count_skip(self, exc: Exception) -> None:
        """Count one skipped fault (the reader's ``on_skip``)."""
        with self.skipped.get_lock():
            self.skipped.value += 1

    def start_epoch(self, epoch: int, *, resumed: bool = False) -> bool:
        """Record that an iteration of ``epoch`` starts; True the first time
        one starts afresh the epoch the previous iteration started (a
        forgotten ``set_epoch``), False ever after, so that it is reported
        once. A ``resumed`` iteration (from a checkpoint) never repeats."""
        with self.started.get_lock():
            previous = self.started.value
            if previous == _REPORTED:
                return False
            repeated = previous == epoch and not resumed
            self.started.value = _REPORTED if repeated else epoch
            return repeated

    def __reduce__(self) -> tuple[Any, ...]:
        if _starting_a_process(self.epoch):
            return _adopt_counters, (self.epoch, self.skipped, self.started)
        return SharedCounters, (int(self.epoch.value), int(self.skipped.value), int(self.started.value))
