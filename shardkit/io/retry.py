"""Retrying transient faults: exponential backoff with jitter, bounded by a deadline.

Backends signal a fault that a retry may fix (timeout, dropped connection,
5xx answer) by raising :class:`TransientFault`; anything retrying cannot fix
they raise as :class:`~shardkit.errors.RemoteError` straight away. A
:class:`Backoff` decides how long to wait before the next attempt and turns
the fault into a ``RemoteError`` once the deadline has passed.

The deadline clock starts at the first fault after the last progress and is
reset whenever bytes arrive again, so a long download that hits a few
unrelated hiccups is not failed by their sum.

Waits are on a :class:`threading.Event`, never ``time.sleep``: a thread that
reads on behalf of an iterator (a read-ahead thread) marks its reads with
:func:`stopping_on`, and once that iterator is closed every retry under it
stops at once instead of going on until the deadline.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from shardkit.errors import RemoteError

logger = logging.getLogger(__name__)

T = TypeVar("T")

_scope = threading.local()


@contextlib.contextmanager
def stopping_on(stop: threading.Event) -> Iterator[None]:
    """Within the block, reads made by this thread stop when ``stop`` is set.

    A :class:`Backoff` made in the block without a ``stop`` of its own waits
    on this one and gives up as soon as it is set (see :func:`current_stop`).
    """
    outer = getattr(_scope, "stop", None)
    _scope.stop = stop
    try:
        yield
    finally:
        _scope.stop = outer


def current_stop() -> threading.Event | None:
    """The event set by the innermost :func:`stopping_on` of this thread, or None."""
    return getattr(_scope, "stop", None)


class TransientFault(Exception):
    """A fault that may go away if the request is made again.

    Attributes:
        cause: Short description of what went wrong (no URL, no secrets).
        status: HTTP status of the answer, when there was one.
        retry_after_s: How long the server asked us to wait (``Retry-After``),
            when it said.
    """

    def __init__(self, cause: str, *, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(cause)
        self.cause = cause
        self.status = status
        self.retry_after_s = retry_after_s


def retry_after_seconds(value: str | None) -> float | None:
    """The delay a ``Retry-After`` header asks for, in seconds, or None.

    Only the delay-seconds form; an HTTP date is rare on 429/503 answers.
    """
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


def backoff_delay(attempt: int, *, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Wait before retry number ``attempt`` (1 for the first): doubles from
    ``initial_s`` up to ``max_s``, with jitter down to half of that."""
    return min(max_s, initial_s * 2 ** (attempt - 1)) * (0.5 + 0.5 * rng.random())


class Backoff:
    """Waits between attempts and gives up after a deadline.

    Args:
        url: The redacted URL, for messages.
        deadline_s: Longest time to keep retrying, from the first fault after
            the last progress, in seconds.
        initial_s: First wait, in seconds; doubles each attempt.
        max_s: Longest single wait, in seconds.
        stop: When set, waiting ends at once and the caller gives up; by
            default the thread's :func:`current_stop`, if any.
        rng: Source of jitter (a private ``random.Random`` by default; jitter
            only spreads retries in time and never affects data order).
    """

    def __init__(
        self,
        url: str,
        *,
        deadline_s: float,
        initial_s: float,
        max_s: float,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
    ):
        self.url = url
        self.deadline_s = deadline_s
        self.initial_s = initial_s
        self.max_s = max_s
        self.stop = stop if stop is not None else current_stop()
        self._wait = self.stop if self.stop is not None else threading.Event()
        self._rng = rng or random.Random()
        self._first_fault: float | None = None
        self._attempts = 0

    def progress(self) -> None:
        """Record that bytes arrived: the next fault starts a fresh deadline."""
        self._first_fault = None
        self._attempts = 0

    def fault(self, fault: TransientFault, *, offset: int | None) -> None:
        """Wait before the next attempt, or raise once the deadline is spent.

        Raises:
            RemoteError: The deadline passed, or ``stop`` was set (before
                or during the wait); the message names the URL, the byte
                offset and the last cause.
        """
        now = time.monotonic()
        if self._first_fault is None:
            self._first_fault = now
        self._attempts += 1
        delay = backoff_delay(self._attempts, initial_s=self.initial_s, max_s=self.max_s, rng=self._rng)
        if fault.retry_after_s is not None:
            # The server said when to come back; still no longer than max_s.
            delay = max(delay, min(fault.retry_after_s, self.max_s))
        spent = now - self._first_fault
        where = "" if offset is None else f" at byte {offset}"
        if spent + delay > self.deadline_s or (self.stop is not None and self.stop.is_set()):
            raise RemoteError(
                f"{self.url}: giving up{where} after {self._attempts} attempts over {spent:.1f}s; "
                f"last error: {fault.cause}. Check that the server is reachable, or raise "
                "SourceOptions.retry_deadline_s",
                url=self.url,
                offset=offset,
                status=fault.status,
                retryable=True,
            ) from fault
        logger.warning("%s: %s%s; retry %d in %.2fs", self.url, fault.cause, where, self._attempts, delay)
        if self._wait.wait(delay):
            raise RemoteError(
                f"{self.url}: stopped retrying{where} after {self._attempts} attempts: the reader was closed; "
                f"last error: {fault.cause}",
                url=self.url,
                offset=offset,
                status=fault.status,
                retryable=True,
            ) from fault


def call_with_retry(fn: Callable[[], T], backoff: Backoff, *, offset: int | None = None) -> T:
    """Call ``fn`` until it returns, retrying on :class:`TransientFault`.

    Raises:
        RemoteError: ``fn`` raised it, or the backoff deadline passed.
    """
    while True:
        try:
            return fn()
        except TransientFault as fault:
            backoff.fault(fault, offset=offset)
