"""Ranged reads of remote objects: resume after faults, several requests at once.

Every remote backend (HTTP, S3, fsspec) only needs to open one byte range as
a stream (:class:`RangeFetcher`). This module turns that into a
:class:`~shardkit.io.base.ByteSource`:

* :func:`stream_range` reads one range over one connection at a time. When the
  connection drops or stalls, it asks again for the bytes from the last one it
  received, so nothing is yielded twice and nothing is skipped.
* :func:`iter_parallel_range` splits a long range into parts of
  ``part_bytes`` and fetches up to ``max_concurrent_requests`` of them at once
  in threads, while the caller consumes the parts in order. A per-connection
  bandwidth cap thus does not cap the reader. Parts are started only while
  the bytes fetched but not yet consumed stay within ``remote_read_ahead_bytes``.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from shardkit.errors import RemoteError, TruncatedShardError
from shardkit.io.base import check_range, read_capped, short_read, too_large
from shardkit.io.local import size_mismatch
from shardkit.io.retry import Backoff, TransientFault, call_with_retry, current_stop

if TYPE_CHECKING:
    from shardkit.io.base import SourceOptions

logger = logging.getLogger(__name__)

#: Size of one read call on a response; reads are joined up to ``chunk_bytes``.
READ_CALL_BYTES = 256 << 10
#: The first chunk a range yields; each next one doubles, up to ``chunk_bytes``.
FIRST_CHUNK_BYTES = 64 << 10

#: Smallest part a short range is cut into (see :func:`iter_parallel_range`).
MIN_PART_BYTES = 1 << 20


class RangeResponse(Protocol):
    """An open response delivering bytes ``[start, end)`` of an object.

    ``start`` may be lower than asked for when the server ignored the range
    (a plain 200 answer); the reader then drops the leading bytes. ``total``
    is the object's size as the answer states it (``Content-Range`` total,
    a whole answer's length), when a backend knows it; it may be absent.
    """

    start: int
    end: int | None

    def read(self, amt: int) -> bytes:
        """Up to ``amt`` bytes, ``b""`` at the end; raises :class:`TransientFault`."""
        ...

    def close(self) -> None: ...


class RangeFetcher(Protocol):
    """One remote object, able to open byte ranges of it.

    ``url`` is redacted (no query string, no credentials): it goes into logs.
    """

    url: str

    def size(self) -> int | None:
        """Object size in bytes, or None when the store cannot tell."""
        ...

    def open_range(self, start: int, end: int | None) -> RangeResponse:
        """Start reading bytes ``[start, end)``; ``end=None`` reads to the end.

        Raises:
            TransientFault: A retry may help.
            RemoteError: It will not (403, 404, bad range...).
        """
        ...


def make_backoff(url: str, options: SourceOptions, stop: threading.Event | None = None) -> Backoff:
    return Backoff(
        url,
        deadline_s=options.retry_deadline_s,
        initial_s=options.backoff_initial_s,
        max_s=options.backoff_max_s,
        stop=stop,
    )


def stream_range(
    fetcher: RangeFetcher,
    start: int,
    end: int | None,
    *,
    options: SourceOptions,
    chunk_bytes: int,
    stop: threading.Event | None = None,
) -> Iterator[bytes]:
    """Yield bytes ``[start, end)`` of the object in order, resuming after faults.

    Args:
        fetcher: The object.
        start: First byte.
        end: End byte (exclusive), or None to read to the end of the object.
        options: Timeouts and retry settings.
        chunk_bytes: Largest chunk yielded.
        stop: When set, the stream ends at the next read (used to cancel
            read-ahead threads); by default the thread's
            :func:`~shardkit.io.retry.current_stop`.

    Raises:
        RemoteError: A fault retrying cannot fix, or the retry deadline passed.
        TruncatedShardError: An answer states that the object ends before ``end``.
    """
    if stop is None:
        stop = current_stop()
    backoff = make_backoff(fetcher.url, options, stop)
    pos = start
    target = min(FIRST_CHUNK_BYTES, chunk_bytes)
    while end is None or pos < end:
        if stop is not None and stop.is_set():
            return
        fault: TransientFault | None = None
        try:
            response = fetcher.open_range(pos, end)
        except TransientFault as exc:
            fault = exc
        else:
            total = getattr(response, "total", None)
            if end is not None and total is not None and total < end:
                # The object ends inside the range: say so now, not after retrying a short answer.
                response.close()
                raise short_read(fetcher.url, start, end - start, total)
            # Pieces as they arrive, joined into chunks (one copy). The first
            # chunk of a range is small and each next one twice as large, up
            # to chunk_bytes: the first sample is parsed after a round trip
            # and 64 KiB, not after a whole 4 MiB chunk crossed the link.
            pieces: list[bytes] = []
            have = 0
            try:
                skip = pos - response.start  # > 0 only when the server ignored the range
                resp_end = response.end if end is None else end
                if skip:
                    logger.debug("%s: server ignored the range; skipping %d bytes", fetcher.url, skip)
                while resp_end is None or pos + have < resp_end:
                    if stop is not None and stop.is_set():
                        return
                    # Never read past the next chunk boundary, so chunks are joined without slicing.
                    want = min(READ_CALL_BYTES, target - have) + skip
                    if resp_end is not None:
                        want = min(want, resp_end - pos - have + skip)
                    try:
                        data = response.read(want)
                    except TransientFault as exc:
                        fault = exc
                        break
                    if not data:
                        if resp_end is not None:
                            fault = TransientFault(f"connection closed early at byte {pos + have} of {resp_end}")
                        break
                    if skip:
                        cut = min(skip, len(data))
                        data = data[cut:]
                        skip -= cut
                        if not data:
                            continue
                    pieces.append(data)
                    have += len(data)
                    if have >= target:
                        joined = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                        pieces.clear()
                        cut = 0
                        while have >= target:
                            out = joined[cut : cut + target] if cut or len(joined) != target else joined
                            cut += target
                            pos += target
                            have -= target
                            backoff.progress()
                            yield out
                            target = min(target * 2, chunk_bytes)
                        if have:
                            pieces.append(joined[cut:])
            finally:
                response.close()
            if have:
                # Bytes that arrived before a fault still count: resume after them.
                backoff.progress()
                joined = b"".join(pieces)
                for i in range(0, len(joined), chunk_bytes):
                    out = joined[i : i + chunk_bytes]
                    pos += len(out)
                    yield out
            if fault is None:
                return
        backoff.fault(fault, offset=pos)


@dataclass(eq=False)
class _Part:
    start: int
    end: int
    chunks: collections.deque[bytes] = field(default_factory=collections.deque)
    done: bool = False
    error: BaseException | None = None


def iter_parallel_range(
    fetcher: RangeFetcher,
    start: int,
    end: int,
    *,
    options: SourceOptions,
    chunk_bytes: int,
) -> Iterator[bytes]:
    """Yield bytes ``[start, end)`` in order, fetching parts concurrently.

    Parts are ``options.part_bytes`` long, or shorter for a range that would
    otherwise make fewer parts than ``options.max_concurrent_requests`` (but
    not below ``MIN_PART_BYTES``); the first ``max_concurrent_requests``
    parts are ``MIN_PART_BYTES``, so the start of the range arrives over all
    connections.
    At most ``options.max_concurrent_requests`` parts are in flight, and a new
    part starts only while the bytes reserved for unconsumed parts stay within
    ``options.remote_read_ahead_bytes`` (one part always may start). Closing the
    generator early cancels the fetches, and so does the thread's
    :func:`~shardkit.io.retry.current_stop`; the fetch threads end with it.

    Raises:
        RemoteError: A part failed for good (see :func:`stream_range`).
    """
    # Ranges shorter than max_concurrent_requests parts are cut into smaller
    # parts (down to MIN_PART_BYTES), so small shards are fetched in parallel too.
    even_split = -(-(end - start) // options.max_concurrent_requests)
    part_bytes = max(min(options.part_bytes, max(MIN_PART_BYTES, even_split)), 1)
    if end - start <= part_bytes or options.max_concurrent_requests <= 1 or ignores_ranges(fetcher):
        yield from stream_range(fetcher, start, end, options=options, chunk_bytes=chunk_bytes)
        return
    # The first parts, one per request, are small: the bytes a reader needs
    # first (the first batch) then come over every connection at once, not
    # over the first part's alone.
    first_bytes = min(part_bytes, MIN_PART_BYTES)
    parts: list[_Part] = []
    pos = start
    while pos < end:
        size = first_bytes if len(parts) < options.max_concurrent_requests else part_bytes
        parts.append(_Part(pos, min(pos + size, end)))
        pos += size
    cond = threading.Condition()
    stop = threading.Event()
    outer = current_stop()  # the reader this range is read for was closed: stop too
    state = {"active": 0, "reserved": 0}
    next_part = 0

    def run(part: _Part) -> None:
        try:
            for data in stream_range(
                fetcher, part.start, part.end, options=options, chunk_bytes=chunk_bytes, stop=stop
            ):
                with cond:
                    part.chunks.append(data)
                    cond.notify_all()
        except BaseException as exc:  # handed to the consumer, which re-raises it
            part.error = exc
        finally:
            with cond:
                part.done = True
                state["active"] -= 1
                cond.notify_all()

    def fill() -> None:
        # Called with ``cond`` held.
        nonlocal next_part
        while next_part < len(parts) and state["active"] < options.max_concurrent_requests:
            part = parts[next_part]
            size = part.end - part.start
            if state["reserved"] and state["reserved"] + size > options.remote_read_ahead_bytes:
                break
            state["active"] += 1
            state["reserved"] += size
            next_part += 1
            threading.Thread(target=run, args=(part,), name="shardkit-fetch", daemon=True).start()

    try:
        for part in parts:
            while True:
                with cond:
                    fill()
                    while not part.chunks and not part.done:
                        # With an outer stop, look at it now and then (an Event cannot wake a Condition).
                        cond.wait(None if outer is None else 0.05)
                        if outer is not None and outer.is_set():
                            return
                        fill()
                    if part.chunks:
                        data = part.chunks.popleft()
                        state["reserved"] -= len(data)
                    elif part.error is not None:
                        raise part.error
                    else:
                        break
                yield data
            if ignores_ranges(fetcher) and part.end < end:
                # Each part would come as the whole object from byte 0 (the part's bytes cut out of it):
                # the rest is read in one request, not in parts that fetch ever more of the object.
                stop.set()
                yield from stream_range(fetcher, part.end, end, options=options, chunk_bytes=chunk_bytes)
                return
    finally:
        stop.set()


def ignores_ranges(fetcher: RangeFetcher) -> bool:
    """Whether ``fetcher``'s store answers ranged requests with the whole
    object (some static servers, ``python -m http.server``): known once one
    such answer came, for backends that can tell (see
    :attr:`shardkit.io.http.HttpFetcher.ignores_ranges`)."""
    return bool(getattr(fetcher, "ignores_ranges", False))


class SizeCheckedFetcher:
    """A fetcher whose every answer must come from an object of ``expected_size``
    bytes, or of at most ``max_bytes``.

    Each answer's stated object size (``total``, where the backend gives
    one) is compared with the manifest's, and a range the store refuses as
    past the end (416) of an object the manifest says is longer means the
    object was cut short. Either is a
    :class:`~shardkit.errors.CorruptShardError` naming the object, before
    any of its bytes are used; so is a stated size past ``max_bytes`` (see
    :meth:`RangedObject.read_all`).
    """

    def __init__(self, fetcher: RangeFetcher, expected_size: int | None = None, *, max_bytes: int | None = None):
        self.fetcher = fetcher
        self.url = fetcher.url
        self.expected_size = expected_size
        self.max_bytes = max_bytes

    @property
    def ignores_ranges(self) -> bool:
        return ignores_ranges(self.fetcher)

    def size(self) -> int | None:
        return self.fetcher.size()

    def open_range(self, start: int, end: int | None) -> RangeResponse:
        try:
            response = self.fetcher.open_range(start, end)
        except RemoteError as exc:
            if exc.status == 416 and self.expected_size is not None and start < self.expected_size:
                raise TruncatedShardError(
                    f"{self.url}: the object ends before byte {start}, but the manifest says it has "
                    f"{self.expected_size} bytes: it was cut short or replaced. Run `shardkit verify` on the "
                    "dataset or rewrite this shard.",
                    path=self.url,
                    offset=start,
                ) from None
            raise
        total = getattr(response, "total", None)
        if total is not None and self.expected_size is not None and total != self.expected_size:
            response.close()
            raise size_mismatch(self.url, total, self.expected_size)
        if total is not None and self.max_bytes is not None and total > self.max_bytes:
            response.close()
            raise too_large(self.url, self.max_bytes)
        return response


class RangedObject:
    """A :class:`~shardkit.io.base.ByteSource` over any :class:`RangeFetcher`.

    Args:
        fetcher: The backend object.
        options: Timeouts, retries, concurrency and read-ahead budget.
        expected_size: The object size if the caller knows it (from the
            manifest); saves a size request, and every answer is checked
            against it (see :class:`SizeCheckedFetcher`).
    """

    def __init__(self, fetcher: RangeFetcher, *, options: SourceOptions, expected_size: int | None = None):
        self.fetcher: RangeFetcher = fetcher if expected_size is None else SizeCheckedFetcher(fetcher, expected_size)
        self.url = fetcher.url
        self.options = options
        self.expected_size = expected_size
        self._size = expected_size  # or as the store said, once asked

    def size(self) -> int | None:
        """The object size in bytes (asked of the store once, then remembered)."""
        if self._size is None:
            self._size = call_with_retry(self.fetcher.size, make_backoff(self.url, self.options))
        return self._size

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        """Yield bytes ``[start, end)`` in order; ``end=None`` reads to the end.

        Raises:
            RemoteError: See :func:`stream_range`.
        """
        if end is None:
            end = self.size()
        if end is None:
            yield from stream_range(self.fetcher, start, None, options=self.options, chunk_bytes=chunk_bytes)
        elif start < end:
            yield from iter_parallel_range(self.fetcher, start, end, options=self.options, chunk_bytes=chunk_bytes)

    def read_all(self, *, max_bytes: int | None = None) -> bytes:
        """The whole object, in one request when nothing goes wrong and its
        size is unknown or at most ``part_bytes``.

        Raises:
            CorruptShardError: The object holds more than ``max_bytes``:
                refused on its known or stated size before its bytes are
                read, else once more than ``max_bytes`` have arrived.
            RemoteError: See :func:`stream_range`.
        """
        if max_bytes is not None and self._size is not None and self._size > max_bytes:
            raise too_large(self.url, max_bytes)
        if self._size is not None and self._size > self.options.part_bytes:
            return b"".join(self.iter_range(0, None, chunk_bytes=self.options.chunk_bytes))
        fetcher = self.fetcher if max_bytes is None else SizeCheckedFetcher(self.fetcher, max_bytes=max_bytes)
        chunk_bytes = self.options.chunk_bytes if max_bytes is None else min(self.options.chunk_bytes, max_bytes + 1)
        chunks = stream_range(fetcher, 0, None, options=self.options, chunk_bytes=chunk_bytes)
        return read_capped(self.url, chunks, max_bytes)

    def read_at(self, offset: int, size: int) -> bytes:
        """Exactly bytes ``[offset, offset + size)``: one request for a range
        of at most ``part_bytes``, else concurrent parts (see
        :func:`iter_parallel_range`), resumed and retried as for a stream.

        Raises:
            UsageError: A negative range, or one past the manifest's size.
            TruncatedShardError: The object ends inside the range.
            RemoteError: See :func:`stream_range`.
        """
        check_range(self.url, offset, size, self.expected_size)
        end = offset + size
        if self._size is not None and end > self._size:  # the store said so already: no request
            raise short_read(self.url, offset, size, self._size)
        if size == 0:
            return b""
        try:
            if size <= self.options.part_bytes:
                chunks = stream_range(self.fetcher, offset, end, options=self.options, chunk_bytes=size)
            else:
                chunks = iter_parallel_range(
                    self.fetcher, offset, end, options=self.options, chunk_bytes=self.options.chunk_bytes
                )
            data = read_capped(self.url, chunks, None)
        except RemoteError as exc:
            if exc.status == 416:  # the range starts past the end of the object
                raise short_read(self.url, offset, size, None) from None
            raise
        if len(data) != size:
            stop = current_stop()
            if stop is not None and stop.is_set():  # the stream ended early because the reader was closed
                raise RemoteError(
                    f"{self.url}: reading bytes [{offset}, {end}) stopped: the reader was closed",
                    url=self.url,
                    offset=offset,
                )
            raise short_read(self.url, offset, size, offset + len(data))
        return data

    def close(self) -> None:
        """Nothing to let go of: connections belong to the process's pool."""


def fatal_status(url: str, status: int, reason: str, *, offset: int | None, hint: str | None = None) -> RemoteError:
    """The error for an HTTP-style status that retrying cannot fix (raised at
    once, never retried); ``hint`` says what to do, instead of the generic one."""
    hints = {
        401: "the server wants credentials; configure them for this store",
        403: "access denied; check credentials and permissions for this object",
        404: "no such object; check the URL and that the dataset was uploaded",
        410: "the object is gone; check the URL",
        416: "the byte range is outside the object; the object may have been replaced since the manifest was written",
    }
    hint = hint or hints.get(status, "the request was refused")
    where = "" if offset is None else f" at byte {offset}"
    said = f" {reason}" if reason and reason != str(status) else ""  # S3 answers a HEAD with its status as its code
    return RemoteError(f"{url}: HTTP {status}{said}{where}: {hint}", url=url, offset=offset, status=status)


def is_transient_status(status: int) -> bool:
    """Whether an HTTP status is worth retrying (timeouts, throttling, 5xx)."""
    return status in (408, 425, 429) or 500 <= status <= 599


__all__ = [
    "RangeFetcher",
    "RangeResponse",
    "RangedObject",
    "RemoteError",
    "SizeCheckedFetcher",
    "fatal_status",
    "is_transient_status",
    "iter_parallel_range",
    "stream_range",
]
