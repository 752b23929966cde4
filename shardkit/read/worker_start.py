"""A watch over a DataLoader's worker processes until each has started.

A worker can hang before it runs a line of Python: forked while another
thread of the parent held one of the interpreter's locks (CPython
gh-112275, see :func:`shardkit.read.loader.fork_hazard`), it waits for that
lock forever. The DataLoader only notices workers that die, so the training
job would wait for that worker's first batch forever too.

:class:`StartWatch` turns that hang into an error. Each worker raises its
flag in a small shared array when it starts iterating its dataset; a thread
of the parent looks at the workers whose flag is still down, and one that
has used no CPU at all for ``stall_s`` seconds is stuck, not slow (a worker
still importing or running a ``worker_init_fn`` uses CPU). The watch names
it in the log, stops it with ``SIGKILL`` (a process stuck inside the
interpreter's start-up runs no signal handler), and keeps the reason, which
the loader raises as a :class:`~shardkit.errors.WorkerStartError` when the
DataLoader reports the dead worker. The thread ends as soon as every worker
has started: it costs nothing once the epoch is under way.

Linux only (it reads each worker's CPU time from ``/proc``); elsewhere
:meth:`StartWatch.watch` does nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

#: Seconds between two looks at the workers that have not started yet.
POLL_S = 0.5

#: How long a worker may sit before starting with no CPU used before it is
#: called stuck, by default (``make_loader(worker_start_timeout_s=...)``).
DEFAULT_STALL_S = 60.0


def cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of process ``pid`` in clock ticks, or None if
    it has exited (a zombie included) or this system has no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields are
    # counted from the last ')'. The state is field 3, utime and stime 14 and 15.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return None if fields[0] in (b"Z", b"X") else int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


class StartWatch:
    """Start flags for one set of DataLoader workers, and the thread that
    watches them.

    Made by the loader in the parent before its workers start; the flags
    travel to each worker with the dataset (a ``multiprocessing`` shared
    array, inherited on fork and passed to spawned workers as they start).

    Args:
        num_workers: Workers in the set.
        context: The ``multiprocessing`` context that starts them.
        stall_s: Seconds without CPU before an unstarted worker is stuck.
        cause: What the message should give as the likely cause, if known
            (e.g. :func:`~shardkit.read.loader.fork_hazard`'s text).
    """

    def __init__(self, num_workers: int, *, context: Any, stall_s: float, cause: str | None = None):
        self.flags = context.RawArray("b", num_workers)
        self.stall_s = stall_s
        self.cause = cause
        #: Why a worker was stopped, once one was.
        self.failure: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # What a worker needs is its flag; the rest is the parent's.
        return {"flags": self.flags}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.flags = state["flags"]
        self.stall_s, self.cause, self.failure = 0.0, None, None

    def mark_started(self, worker: int) -> None:
        """Called in worker ``worker`` when it starts iterating."""
        self.flags[worker] = 1

    def watch(self, iterator: Any) -> None:
        """Watch the workers of a DataLoader iterator that just started them.

        Does nothing where worker CPU time cannot be read (no ``/proc``),
        or where the iterator does not list its worker processes.
        """
        processes = getattr(iterator, "_workers", None)
        if not processes or cpu_ticks(os.getpid()) is None:
            return
        pids = [p.pid for p in processes]
        alive = weakref.ref(iterator)
        threading.Thread(target=self._run, args=(pids, alive), name="shardkit-worker-start-watch", daemon=True).start()

    def _run(self, pids: Sequence[int], alive: weakref.ref) -> None:
        seen: dict[int, tuple[int, float]] = {}  # worker -> (CPU ticks, when they last changed)
        pending = set(range(len(pids)))
        while pending and alive() is not None:
            time.sleep(POLL_S)
            now = time.monotonic()
            for worker in sorted(pending):
                ticks = None if self.flags[worker] else cpu_ticks(pids[worker])
                if ticks is None:  # started, or exited (which the DataLoader reports itself)
                    pending.discard(worker)
                elif worker not in seen or seen[worker][0] != ticks:
                    seen[worker] = (ticks, now)
                elif now - seen[worker][1] >= self.stall_s:
                    self._stop(worker, pids[worker])
                    return

    def _stop(self, worker: int, pid: int) -> None:
        cause = f" The likely cause: {self.cause}." if self.cause else ""
        self.failure = (
            f"DataLoader worker {worker} (pid {pid}) never started: it used no CPU for {self.stall_s:g} s "
            f"before reaching its first line of the dataset, so it was stopped instead of leaving the job "
            f"waiting for it forever.{cause} To wait longer, raise make_loader(worker_start_timeout_s=...)."
        )
        log.error("%s", self.failure)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
