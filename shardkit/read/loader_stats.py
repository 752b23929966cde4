"""Loader statistics in the training process: what ``make_loader(...,
stats=True)`` gathers and ``loader.stats()`` returns.

Each batch arrives with its worker's :class:`~shardkit.read.stats.Record`
(stage times, shards, bytes). The loader adds when the training loop asked
for the batch and when it had it, which gives:

* **waiting**: the time the loop waited for batches, and its fraction of
  the time since the first batch was asked for (the *data-starved*
  fraction);
* **hand-off**: from the later of "the worker had the batch ready" and
  "the loop asked for it" to "the loop had it": pickling, the trip through
  shared memory and the queue, unpickling, pinning;
* **stalls**: the loop waited for a batch (at least :data:`STALL_MIN_S`,
  and :data:`STALL_FACTOR` times its usual wait) while the batch delivered
  next, another worker's, had been ready since before the wait began. That is the head-of-line stall of in-order
  delivery (``in_order=True``, or replicated ranks): the worker, and the
  shard it spent longest on, are named.

What is kept does not grow with the epoch: totals, the worst
:data:`KEEP_STALLS` stalls, and the last ``keep`` batches for the trace.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from collections.abc import Callable, Iterator
from typing import Any

from shardkit.read import stats
from shardkit.read.stats import STAGES, Record

#: The shortest wait that counts as a stall (seconds).
STALL_MIN_S = 0.005

#: A stall's wait is at least this many times the loop's usual one (the
#: median of the last :data:`STALL_WINDOW`): a loop that waits for every
#: batch alike is short of workers, not stalled.
STALL_FACTOR = 3.0
STALL_WINDOW = 64

#: Stalls a report lists (the longest); all are counted.
KEEP_STALLS = 20

#: Batches kept for the trace, by default (the latest).
KEEP_BATCHES = 10_000


@dataclass
class Stall:
    """A batch the loop waited for while the next one was ready.

    Attributes:
        batch: The batch's number in the iteration (from 0).
        worker: The worker whose batch was late.
        shard: The shard that worker spent longest on for it ("" if none).
        waited_s: How long the loop waited for it.
        behind: The worker whose ready batch waited behind it.
        ready_s: How long that batch had been ready when the late one came.
    """

    batch: int
    worker: int
    shard: str
    waited_s: float
    behind: int
    ready_s: float

    def __str__(self) -> str:
        shard = f" on shard {self.shard}" if self.shard else ""
        return (f"batch {self.batch}: waited {self.waited_s * 1e3:.0f} ms for worker {self.worker}{shard}, "
                f"while worker {self.behind}'s batch had been ready for {self.ready_s * 1e3:.0f} ms")  # fmt: skip


@dataclass
class WorkerTimes:
    """One worker's seconds per stage (:data:`~shardkit.read.stats.STAGES`),
    its hand-off, and their sum over the stages (``busy``)."""

    stages: list[float] = field(default_factory=lambda: [0.0] * len(STAGES))
    handoff: float = 0.0
    busy: float = 0.0
    batches: int = 0
    pid: int = 0


class LoaderStats:
    """Statistics of a loader's iterations so far (see the module docstring).

    Attributes:
        batches: Batches delivered.
        samples: Samples read into them.
        nbytes: Bytes that arrived from storage for them.
        waited_s: Seconds the loop waited for batches.
        elapsed_s: Seconds from the first batch asked for to the last one delivered.
        workers: :class:`WorkerTimes` by worker.
        stall_count: Stalls seen (:attr:`stalls` lists the longest).
    """

    def __init__(self, keep: int = KEEP_BATCHES):
        self.batches = self.samples = self.nbytes = 0
        self.waited_s = self.elapsed_s = 0.0
        self.workers: dict[int, WorkerTimes] = {}
        self.stall_count = 0
        self.stalls: list[Stall] = []
        self._trace: deque[tuple[int, Record, float, float]] = deque(maxlen=keep)
        self._first: float | None = None
        self._last: tuple[int, Record, float, float] | None = None
        self._waits: deque[float] = deque(maxlen=STALL_WINDOW)

    def add(self, record: Record, asked: float, got: float) -> None:
        """A batch, with its record and when the loop asked for it and had it."""
        number = self.batches
        if self._first is None:
            self._first = asked
        self.batches += 1
        self.samples += record.samples
        self.nbytes += record.nbytes
        self.waited_s += got - asked
        self.elapsed_s = got - self._first
        times = self.workers.setdefault(record.worker, WorkerTimes(pid=record.pid))
        times.stages = [a + b for a, b in zip(times.stages, record.stages)]
        times.handoff += max(got - max(record.end, asked), 0.0)
        times.busy += sum(record.stages)
        times.batches += 1
        self._check_stall(record)
        self._last = (number, record, asked, got)
        self._trace.append(self._last)

    def _check_stall(self, record: Record) -> None:
        if self._last is None:
            return
        number, late, asked, got = self._last
        waited = got - asked
        usual = sorted(self._waits)[len(self._waits) // 2] if self._waits else 0.0
        self._waits.append(waited)
        if waited >= max(STALL_MIN_S, STALL_FACTOR * usual) and record.worker != late.worker and record.end <= asked:
            self.stall_count += 1
            shard = late.shards[0][0] if late.shards else ""
            self.stalls.append(Stall(number, late.worker, shard, got - asked, record.worker, got - record.end))
            self.stalls.sort(key=lambda s: -s.waited_s)
            del self.stalls[KEEP_STALLS:]

    @property
    def starved(self) -> float:
        """The fraction of the time the loop waited for data."""
        return self.waited_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def stage_totals(self) -> dict[str, float]:
        """Seconds per stage over all workers, the hand-off last."""
        out = {name: sum(w.stages[i] for w in self.workers.values()) for i, name in enumerate(STAGES)}
        out["handoff"] = sum(w.handoff for w in self.workers.values())
        return out

    def summary(self) -> str:
        """A few lines for a terminal or a log."""
        mb = self.nbytes / 1e6
        rate = self.batches / self.elapsed_s if self.elapsed_s > 0 else 0.0
        lines = [
            f"{self.batches} batches, {self.samples} samples, {mb:.1f} MB read in {self.elapsed_s:.2f} s "
            f"({rate:.1f} batches/s); the loop waited for data {self.starved:.0%} of the time",
            "worker  " + "".join(f"{name:>9}" for name in (*STAGES, "handoff", "idle")) + "   (seconds)",
        ]
        for worker in sorted(self.workers):
            w = self.workers[worker]
            idle = max(self.elapsed_s - w.busy, 0.0)
            lines.append(f"{worker:>6}  " + "".join(f"{v:>9.2f}" for v in (*w.stages, w.handoff, idle)))
        if self.stall_count:
            lines.append(f"{self.stall_count} stalls behind a slow worker; the longest:")
            lines += [f"  {s}" for s in self.stalls[:5]]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain data (JSON)."""
        return {
            "batches": self.batches, "samples": self.samples, "bytes": self.nbytes,
            "elapsed_s": self.elapsed_s, "waited_s": self.waited_s, "starved": self.starved,
            "stages_s": self.stage_totals(),
            "workers": {str(k): asdict(v) for k, v in sorted(self.workers.items())},
            "stall_count": self.stall_count, "stalls": [asdict(s) for s in self.stalls],
        }  # fmt: skip

    def trace(self) -> dict[str, Any]:
        """The kept batches as a Chrome / Perfetto trace (the JSON object format)."""
        events: list[dict[str, Any]] = []
        here = os.getpid()
        names = {here: "training loop"}
        for number, record, asked, got in self._trace:
            names.setdefault(record.pid, f"worker {record.worker}")
            lane = {"pid": record.pid, "tid": record.worker}
            args = {"samples": record.samples, "bytes": record.nbytes, "shards": [u for u, _ in record.shards]}
            work = sum(record.stages)  # drawn as one stretch ending when the batch was ready
            at = max(record.end - work, record.start)
            events.append({"name": f"batch {number}", "ph": "X", "ts": _us(at), "dur": _us(record.end - at),
                           "cat": "batch", "args": args, **lane})  # fmt: skip
            for name, seconds in zip(STAGES, record.stages):  # the stages' totals laid end to end
                if seconds > 0:
                    events.append({"name": name, "ph": "X", "ts": _us(at), "dur": _us(seconds), "cat": "stage", **lane})
                    at += seconds
            events.append({"name": f"wait for batch {number}", "ph": "X", "ts": _us(asked), "dur": _us(got - asked),
                           "cat": "wait", "pid": here, "tid": 0, "args": {"worker": record.worker}})  # fmt: skip
        for stall in self.stalls:
            kept = [t for t in self._trace if t[0] == stall.batch]
            if kept:
                events.append({"name": "stall", "ph": "i", "s": "p", "ts": _us(kept[0][3]), "pid": here, "tid": 0,
                               "args": asdict(stall)})  # fmt: skip
        for pid, name in names.items():
            events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save_trace(self, path: str) -> None:
        """Write :meth:`trace` to ``path``: open it in ui.perfetto.dev or chrome://tracing."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.trace(), f)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def timed_batches(
    batches: Iterator[tuple[Any, Record | None]], into: LoaderStats, *, ended: Callable[[], None] | None = None
) -> Iterator[Any]:
    """The batches of ``(batch, record)``, each record added to ``into``
    with when the loop asked for the batch and had it. When the iteration
    ends, a clock of this process (``num_workers=0``) is let go, and
    ``ended`` called."""
    try:
        while True:
            asked = time.monotonic()
            try:
                batch, record = next(batches)
            except StopIteration:
                return
            if record is not None:
                into.add(record, asked, time.monotonic())
            yield batch
    finally:
        if stats.current is not None and stats.current.pid == os.getpid():
            stats.current = None
        if ended is not None:
            ended()
