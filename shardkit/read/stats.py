"""Where a reader's time goes, per process: the clock behind
``make_loader(..., stats=True)`` (:mod:`.loader_stats` gathers it).

A :class:`StageClock` lives in each process that reads (a DataLoader
worker, or the training process with ``num_workers=0``) while an iteration
with statistics runs; :data:`current` holds it, and None otherwise. The
reader's stages look it up once, when an iteration builds them, and only
then wrap themselves in timers (:func:`timed_call`, and the reader's
sample stream in :mod:`.slot`): with statistics off nothing is timed, per
sample or otherwise. (:mod:`.watch` starts the clock for a plain DataLoader.)

The stages:

``read``
    waiting for bytes: the parser found the read-ahead buffer empty
    (:class:`~shardkit.read.prefetch.ReadAhead`), charged to the shard whose
    bytes it waited for;
``parse``
    the reader's own work to hand over a sample: tar parsing, the shuffle
    buffer, merging sources (time in the sample stream less ``read``);
``decode``, ``map``, ``collate``
    the dataset's decoder, the user's ``map`` and the batch's collation.

After each item it hands over (each batch, where the DataLoader batches),
the reader takes a :class:`Record` of the time since the last
(:meth:`StageClock.take`): small, and it travels with the item to the
training process. Token blocks and budget batches charge their time to the
stored shard being read, not to their virtual shard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

#: The stages a worker's time is split into, in pipeline order.
STAGES = ("read", "parse", "decode", "map", "collate")

#: Shards a record names at most (those that took longest).
RECORD_SHARDS = 3

#: The clock of this process's running iteration with statistics, or None.
current: StageClock | None = None

T = TypeVar("T")


@dataclass
class Record:
    """One item's share of a worker's time (seconds; ``start`` and ``end``
    on the machine-wide monotonic clock, comparable between processes).

    Attributes:
        worker: The DataLoader worker (0 with ``num_workers=0``).
        pid: Its process.
        start: When the worker started on the item (its previous item's end).
        end: When the item was ready to hand over.
        stages: Seconds per stage of :data:`STAGES`, in order.
        shards: ``(url, seconds)`` of the shards the item's samples took
            longest on (reading and the stages after), longest first.
        samples: Samples read into the item.
        nbytes: Bytes that arrived from storage meanwhile.
    """

    worker: int
    pid: int
    start: float
    end: float
    stages: list[float]
    shards: list[tuple[str, float]] = field(default_factory=list)
    samples: int = 0
    nbytes: int = 0


class StageClock:
    """A process's stage times since its last :meth:`take`."""

    def __init__(self, worker: int = 0):
        self.worker = worker
        self.pid = os.getpid()
        self.since = time.monotonic()
        # Kept as the same objects, emptied by take(): timers may hold on to them.
        self.stages = [0.0] * len(STAGES)
        self.shards: dict[str, float] = {}
        self.shard = ""  # the shard of the sample being worked on
        self.reading = ""  # the stored shard whose bytes the parser has now (the read-ahead's)
        self.samples = 0
        self.nbytes = 0

    def add(self, stage: int, seconds: float, shard: str | None = None) -> None:
        """Charge ``seconds`` to stage number ``stage``, and to ``shard``
        (default: the shard of the sample being worked on)."""
        self.stages[stage] += seconds
        url = self.shard if shard is None else shard
        self.shards[url] = self.shards.get(url, 0.0) + seconds

    def take(self) -> Record:
        """The record of the time since the last take, the clock emptied."""
        now = time.monotonic()
        top = sorted(self.shards.items(), key=lambda kv: -kv[1])[:RECORD_SHARDS]
        record = Record(self.worker, self.pid, self.since, now, list(self.stages), [(u, s) for u, s in top if u],
                        self.samples, self.nbytes)  # fmt: skip
        self.since, self.samples, self.nbytes = now, 0, 0
        self.stages[:] = _ZEROS
        self.shards.clear()
        return record


_ZEROS = [0.0] * len(STAGES)

READ, PARSE, DECODE, MAP, COLLATE = range(len(STAGES))


def collated(collate: Callable[[Any], T], samples: Any, clock: StageClock) -> tuple[T, Record]:
    """``collate(samples)``, its time charged to ``collate``, with the
    record of the item it makes (the clock emptied)."""
    started = time.monotonic()
    batch = collate(samples)
    clock.add(COLLATE, time.monotonic() - started)
    return batch, clock.take()


def timed_call(fn: Callable[..., T], clock: StageClock, stage: int) -> Callable[..., T]:
    """``fn``, its time charged to ``stage``."""

    def call(*args: Any, **kwargs: Any) -> T:
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.add(stage, time.monotonic() - started)

    return call
