"""Background read-ahead: fetch the next byte ranges while samples are parsed.

:class:`ReadAhead` runs one thread that walks a list of read jobs, fetches
each job's bytes as large chunks and hands them to the consuming thread
through a queue bounded in *bytes*. While the consumer parses one chunk the
thread is already reading the next ones, including those of the next shard,
so a worker does not stall at shard boundaries. Reads release the GIL, so
this overlaps I/O with parsing even in one process.

Errors never get lost: an exception raised while fetching a job is passed to
the consumer in the job's place, and the consumer decides what to do.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Generic, TypeVar

from shardkit.errors import UsageError
from shardkit.io.base import close_iterator
from shardkit.io.retry import stopping_on
from shardkit.read import stats

log = logging.getLogger(__name__)

J = TypeVar("J")

#: Seconds close() waits for the reader thread to finish its current read.
CLOSE_WAIT_S = 2.0

#: Default byte budget of one read-ahead thread.
DEFAULT_READ_AHEAD_BYTES = 32 << 20

#: Readers' outermost generators not yet finished (see :func:`closed_at_exit`).
_LIVE: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()

G = TypeVar("G", bound=Generator[Any, None, None])


def closed_at_exit(reader: G) -> G:
    """Have ``reader`` (a reader's outermost generator) closed before the
    interpreter exits if it is still open then.

    An iterator left half-read at the top level of a script is otherwise
    collected while the interpreter tears its modules down, and its
    read-ahead threads and ``finally`` blocks run with module globals
    already gone ("Exception ignored in: <generator ...>").
    """
    _LIVE.add(reader)
    return reader


@atexit.register
def _close_live_readers() -> None:
    for reader in list(_LIVE):
        try:
            reader.close()
        except Exception:  # noqa: BLE001 - exiting: a reader that cannot close is left to the OS
            pass


class ReadAhead(Generic[J]):
    """A reader thread feeding chunks of successive jobs, bounded in bytes.

    Iterating yields ``(job, item)`` where ``item`` is a ``bytes`` chunk of
    the job, ``None`` once the job's chunks are all delivered, or the
    exception that fetching the job raised (the job then ends there). An
    exception raised by the job iterable itself is yielded as ``(None, exc)``
    and ends the stream.

    Args:
        jobs: What to read, in order. Consumed by the reader thread.
        fetch: Returns the chunks of one job (runs in the reader thread).
        budget_bytes: Most bytes fetched but not yet taken by the consumer;
            one chunk larger than the budget is still let through alone.
        start_bytes: The budget until the consumer has taken anything; from
            then on it is twice the bytes taken so far, up to
            ``budget_bytes`` (None: ``budget_bytes`` from the start). A
            reader started before anyone asks for its samples (a DataLoader
            worker whose siblings are still starting) thus fetches what its
            first samples need, not its whole budget, and leaves the link
            and the CPU to the others until its consumer shows up.
        name: Thread name, for debugging.

    Use as a context manager, or call :meth:`close`, so the thread stops
    when the consumer stops early (or raises): a read waiting to retry stops
    at once (:func:`shardkit.io.retry.stopping_on`), and so do the threads of
    a remote range read in parallel.
    """

    def __init__(
        self,
        jobs: Iterable[J],
        fetch: Callable[[J], Iterable[bytes]],
        *,
        budget_bytes: int = DEFAULT_READ_AHEAD_BYTES,
        start_bytes: int | None = None,
        name: str = "shardkit-read-ahead",
    ):
        if budget_bytes <= 0:
            raise UsageError(f"read-ahead budget must be > 0 bytes, not {budget_bytes}")
        if start_bytes is not None and start_bytes <= 0:
            raise UsageError(f"read-ahead start budget must be > 0 bytes, not {start_bytes}")
        self.budget_bytes = budget_bytes
        self.start_bytes = budget_bytes if start_bytes is None else min(start_bytes, budget_bytes)
        self._taken = 0  # bytes the consumer has taken (counted until the budget is whole)
        self._jobs = jobs
        self._fetch = fetch
        self._items: deque[tuple[J | None, object]] = deque()
        self._held = 0  # bytes in _items
        self._done = False  # the thread has put its last item
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    # ------------------------------------------------------------ producer

    def _put(self, job: J | None, item: object) -> bool:
        size = len(item) if isinstance(item, bytes) else 0
        with self._cond:
            while not self._fits(size) and not self._stop.is_set():
                self._cond.wait()
            if self._stop.is_set():
                return False
            self._items.append((job, item))
            self._held += size
            self._cond.notify_all()
        return True

    def wait_room(self, num_bytes: int) -> bool:
        """Wait until ``num_bytes`` more can be queued without waiting (at
        most ``budget_bytes - num_bytes`` queued, or nothing); False once
        closed. A fetch that must not stall half-way (one holding a shared
        resource while it reads) reserves its room with this before it
        starts; this and :meth:`has_room` make the queue a
        :class:`shardkit.io.device.Room`."""
        with self._cond:
            while not self._fits(num_bytes) and not self._stop.is_set():
                self._cond.wait()
            return not self._stop.is_set()

    def has_room(self, num_bytes: int) -> bool:
        """Whether ``num_bytes`` more can be queued now without waiting (the
        test :meth:`wait_room` waits on)."""
        with self._cond:
            return self._fits(num_bytes)

    def _fits(self, num_bytes: int) -> bool:
        """Whether ``num_bytes`` more stay within the budget as it stands
        (see ``start_bytes``), or the queue is empty (one item larger than
        the budget goes through alone). Call with ``_cond`` held."""
        budget = min(self.budget_bytes, max(self.start_bytes, 2 * self._taken))
        return not self._held or self._held + num_bytes <= budget

    @property
    def starting(self) -> bool:
        """Whether the start budget still holds: the consumer has taken
        nothing yet, and ``start_bytes`` is below ``budget_bytes``."""
        return self._taken == 0 and self.start_bytes < self.budget_bytes

    def _run(self) -> None:
        # Reads under this thread stop retrying the moment the consumer closes.
        with stopping_on(self._stop):
            self._read_all()

    def _read_all(self) -> None:
        try:
            for job in self._jobs:
                chunks: Iterator[bytes] | None = None
                try:
                    chunks = iter(self._fetch(job))
                    for chunk in chunks:
                        if not self._put(job, chunk):
                            return
                    end: object = None
                except Exception as exc:  # handed to the consumer
                    end = exc
                finally:
                    # A fetch left half-way releases what it holds (a file,
                    # a lock) now, not when it is garbage-collected.
                    close_iterator(chunks)
                if not self._put(job, end):
                    return
        except Exception as exc:
            self._put(None, exc)
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    # ------------------------------------------------------------ consumer

    def start(self) -> None:
        """Start reading now, before the first item is asked for (iterating
        starts it otherwise). Idempotent."""
        if not self._started:
            self._started = True
            self._thread.start()

    def __iter__(self) -> Iterator[tuple[J | None, object]]:
        self.start()
        clock = stats.current  # with loader statistics on: the waits for bytes are timed
        while True:
            with self._cond:
                waited = 0.0
                if clock is not None and not self._items and not self._done:
                    waited = -time.monotonic()
                while not self._items and not self._done:
                    self._cond.wait()
                if not self._items:
                    return
                job, item = self._items.popleft()
                if isinstance(item, bytes):
                    self._held -= len(item)
                    if 2 * self._taken < self.budget_bytes:
                        self._taken += len(item)
                self._cond.notify_all()
            if clock is not None:
                clock.nbytes += len(item) if isinstance(item, bytes) else 0
                clock.reading = getattr(job, "url", "")
                if waited:
                    clock.add(stats.READ, time.monotonic() + waited, clock.reading)
            yield job, item
            if isinstance(item, BaseException) and job is None:
                return

    def close(self) -> None:
        """Stop the reader thread and drop what it fetched. Idempotent."""
        self._stop.set()
        with self._cond:
            self._items.clear()
            self._held = 0
            self._cond.notify_all()
        if self._started and self._thread is not threading.current_thread():
            # The thread stops at its next chunk; a read stuck in the storage
            # layer is not waited for long (the thread is a daemon and drops
            # what it gets once it returns).
            self._thread.join(timeout=CLOSE_WAIT_S)
            if self._thread.is_alive():
                log.info("read-ahead thread still inside a read after %s s; not waiting for it", CLOSE_WAIT_S)

    def __enter__(self) -> ReadAhead[J]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
