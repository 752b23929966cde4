"""Fetching the URLs of sample fields (``http(s)://``, ``s3://``) while shards are written.

A :class:`Downloader` belongs to one writer process (make it after a fork:
its thread pool and connection pool are never shared across one). It
fetches many URLs at once on a bounded thread pool, at most
``max_connections_per_host`` of them from one host (scheme, host, port; an
S3 bucket) at a time, and hands the results back **in input order**
(:meth:`Downloader.map_ordered`), whichever finished first, so the shards
written from them do not depend on network timing.

Each URL gives one :class:`Fetched`: the body, or a failure with a short
reason category (see :data:`REASONS`) and a detail line for the skip record.
A failure is a result, never an exception: the writer counts it by reason and
goes on (or raises, under its ``on_error="raise"``).

What is retried: connection errors, timeouts, ``408``/``425``/``429`` and
``5xx`` answers, up to ``max_attempts`` attempts with exponential backoff;
a ``Retry-After`` of seconds is honoured up to ``max_retry_after_s`` (a
longer one ends the URL at once: waiting an hour for one image stalls a
shard). What is not: any other ``4xx``, a body over ``max_bytes``, an
opt-out. A hanging server costs at most ``connect_timeout_s`` plus
``fetch_deadline_s`` per attempt: the read timeout bounds each silence,
the deadline a body trickled byte by byte.

Redirects are followed up to ``max_redirects``, to other hosts too (image
hosts hand off to CDNs), but a URL's ``user:password@`` is sent (as Basic
auth) to its own origin only, and a redirect back to a URL already visited
ends as ``redirect_loop``.

Opt-out: an answer whose ``X-Robots-Tag`` says ``noai`` or ``noimageai``
(for every agent, or for ``shardkit``) is not stored and ends as
``opt_out``, unless ``respect_opt_out=False``; its body is not read.

URLs are logged only through :func:`~shardkit.io.urls.redact_url`; the
:attr:`Fetched.url` kept for the sample's record is the URL as given,
without its ``user:password@``.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError as Urllib3Error,
    LocationParseError,
    NewConnectionError,
    ReadTimeoutError,
)

from shardkit.errors import RemoteError, UsageError
from shardkit.io.base import SourceOptions
from shardkit.io.http import hide_query_strings_in_urllib3_logs
from shardkit.io.ranged import is_transient_status
from shardkit.io.retry import TransientFault, backoff_delay, retry_after_seconds
from shardkit.io.urls import redact_url, split_userinfo, url_origin
from shardkit.write.manners import HostSlots, default_user_agent, opted_out

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Failure categories a :class:`Fetched` may carry (``http_NNN`` stands for
#: every HTTP status: ``http_404``, ``http_429``...).
REASONS = {
    "bad_url": "empty, not a URL, or a scheme other than http(s):// and s3://",
    "http_NNN": "the server answered with that status (after retries, for 429 and 5xx)",
    "timeout": "no connection, or no bytes, within the timeouts (after retries)",
    "connection": "the connection failed or broke (after retries)",
    "redirect_loop": "a redirect led back to a URL already visited",
    "too_many_redirects": "more than max_redirects redirects in a row",
    "bad_redirect": "a redirect without a Location, or to a scheme other than http(s)",
    "opt_out": "X-Robots-Tag says noai or noimageai",
    "too_large": "the body is larger than max_bytes",
    "empty": "the body has no bytes",
    "s3_error": "the S3 request failed for another reason (credentials, configuration)",
    "cancelled": "the downloader was closed before the URL was fetched",
}

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_READ_BYTES = 64 << 10


@dataclass(frozen=True, kw_only=True)
class DownloadOptions:
    """How URLs are fetched. Times in seconds, sizes in bytes.

    Attributes:
        num_threads: Requests in flight at once in one process (16).
        max_connections_per_host: Requests in flight at once to one host
            (scheme, host and port; one S3 bucket) (4).
        connect_timeout_s: Time to open a connection (10).
        read_timeout_s: Longest silence while waiting for bytes (20).
        fetch_deadline_s: Longest time one attempt may take, headers and body
            (60): bounds a server that trickles bytes.
        max_attempts: Attempts per URL for faults worth retrying (3).
        backoff_initial_s: First wait between attempts; doubles each time,
            with jitter (0.5).
        backoff_max_s: Longest wait between attempts (8).
        max_retry_after_s: Longest ``Retry-After`` honoured; a server asking
            for more ends the URL as ``http_429``/``http_503`` at once (30).
        max_redirects: Redirects followed for one URL (5).
        max_bytes: Largest body accepted (64 MiB); more is ``too_large``.
        max_ahead: Items :meth:`Downloader.map_ordered` starts ahead of the
            one it hands over (256): results wait in input order, so one
            URL that hangs until its timeout holds up the hand-over, and the
            others go on only while this many are ahead. Memory: up to this
            many bodies. Make it about the download rate times the timeouts.
        respect_opt_out: Leave out answers whose ``X-Robots-Tag`` says
            ``noai``/``noimageai`` (True).
        user_agent_contact: Appended to the ``User-Agent``
            (``shardkit/VERSION (+CONTACT)``), so site owners can reach you.
        s3_endpoint_url: S3 endpoint for ``s3://`` URLs, overriding the AWS
            configuration (credentials always come from it).
        s3_region: S3 region, overriding the AWS configuration.
        s3_anonymous: Read ``s3://`` URLs unsigned (public buckets; see
            :class:`~shardkit.io.base.SourceOptions`).
    """

    num_threads: int = 16
    max_connections_per_host: int = 4
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0
    fetch_deadline_s: float = 60.0
    max_attempts: int = 3
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 30.0
    max_redirects: int = 5
    max_bytes: int = 64 << 20
    max_ahead: int = 256
    respect_opt_out: bool = True
    user_agent_contact: str | None = None
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_anonymous: bool = False

    def __post_init__(self) -> None:
        for name in ("num_threads", "max_connections_per_host", "max_attempts", "max_bytes", "max_ahead"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"DownloadOptions.{name} must be an integer of at least 1, got {value!r}")
        if not isinstance(self.max_redirects, int) or self.max_redirects < 0:
            raise UsageError(f"DownloadOptions.max_redirects must be 0 or more, got {self.max_redirects!r}")
        for name in ("connect_timeout_s", "read_timeout_s", "fetch_deadline_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"DownloadOptions.{name} must be more than 0 seconds, got {getattr(self, name)!r}")
        for name in ("backoff_initial_s", "backoff_max_s", "max_retry_after_s"):
            if not getattr(self, name) >= 0:
                raise UsageError(f"DownloadOptions.{name} must be 0 or more seconds, got {getattr(self, name)!r}")
        for name in ("respect_opt_out", "s3_anonymous"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"DownloadOptions.{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def user_agent(self) -> str:
        return default_user_agent(self.user_agent_contact)

    def source_options(self) -> SourceOptions:
        """The storage options ``s3://`` URLs are read with."""
        return SourceOptions(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            max_concurrent_requests=self.num_threads,
            s3_endpoint_url=self.s3_endpoint_url,
            s3_region=self.s3_region,
            s3_anonymous=self.s3_anonymous,
        )


@dataclass(frozen=True, slots=True)
class Fetched:
    """What fetching one URL gave.

    Attributes:
        url: The URL as asked for, without ``user:password@`` (kept for the
            sample's record; log it only through ``redact_url``).
        data: The body, or None on failure.
        status: The HTTP status of the last answer, when there was one
            (200 for an ``s3://`` object read).
        reason: None on success, else a category of :data:`REASONS`.
        detail: One line about the failure (no credentials, no query string).
        content_type: The answer's ``Content-Type``, when given.
        final_url: Where the body came from after redirects (as ``url``).
    """

    url: str
    data: bytes | None = None
    status: int | None = None
    reason: str | None = None
    detail: str = ""
    content_type: str | None = None
    final_url: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


class _Failure(Exception):
    """A URL's end, as a category and a detail line (turned into a Fetched)."""

    def __init__(self, reason: str, detail: str, *, status: int | None = None):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status


class _Retry(_Failure):
    """A fault worth another attempt (``Retry-After`` seconds, when the server said)."""

    def __init__(self, reason: str, detail: str, *, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(reason, detail, status=status)
        self.retry_after_s = retry_after_s



def _host_of(url: str) -> tuple[str, str, int | None]:
    if url.startswith("s3://"):
        return ("s3", url[5:].partition("/")[0], None)
    return url_origin(url)


class Downloader:
    """Fetches URLs concurrently for one writer process.

    Use as a context manager, or call :meth:`close`. Thread-safe: any
    thread may call :meth:`fetch`; :meth:`map_ordered` runs a function over
    items on the downloader's threads.

    Args:
        options: Timeouts, limits and policies (defaults: :class:`DownloadOptions`).
    """

    def __init__(self, options: DownloadOptions | None = None):
        self.options = options or DownloadOptions()
        o = self.options
        self._stop = threading.Event()
        self._slots = HostSlots(o.max_connections_per_host)
        self._timeout = urllib3.Timeout(connect=o.connect_timeout_s, read=o.read_timeout_s)
        hide_query_strings_in_urllib3_logs()
        # Pools per host kept: enough for the hosts in flight at once; an
        # evicted pool only closes idle connections.
        self._pool = urllib3.PoolManager(
            num_pools=max(2 * o.num_threads, 16), maxsize=o.max_connections_per_host, block=False
        )
        self._headers = {"User-Agent": o.user_agent, "Accept-Encoding": "identity"}
        self._executor = ThreadPoolExecutor(max_workers=o.num_threads, thread_name_prefix="shardkit-download")
        self._s3_options: SourceOptions | None = None

    def __enter__(self) -> Downloader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop: waits end at once, URLs not yet started end as ``cancelled``."""
        self._stop.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._pool.clear()

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T], *, window: int | None = None) -> Iterator[R]:
        """``fn(item)`` for each item, run on the downloader's threads, yielded
        in the order of ``items``.

        At most ``window`` calls (default: ``max_ahead``) are started ahead
        of the one being yielded, so memory stays bounded however long
        ``items`` is. Feed one long stream (a worker's rows across its
        shards) rather than one per shard: the end of a stream waits for its
        slowest item, with nothing else in flight. ``fn`` should not raise (an exception it raises comes
        out here, at its item's turn).
        """
        window = window or max(self.options.max_ahead, self.options.num_threads)
        pending: collections.deque[Future[R]] = collections.deque()
        try:
            for item in items:
                pending.append(self._executor.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()

    def fetch_all(self, urls: Iterable[str]) -> Iterator[Fetched]:
        """:meth:`fetch` of each URL, concurrently, in input order."""
        return self.map_ordered(self.fetch, urls)

    def fetch(self, url: str) -> Fetched:
        """Fetch one URL, with retries; never raises for what the URL gives."""
        if not isinstance(url, str) or not url.strip():
            return Fetched(url=str(url or ""), reason="bad_url", detail="no URL (empty value)")
        url = url.strip()
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        shown = redact_url(url)
        if scheme not in ("http", "https", "s3"):
            return Fetched(
                url=split_userinfo(url)[0] if scheme else url,
                reason="bad_url",
                detail=f"{shown[:200]!r} is not an http(s):// or s3:// URL",
            )
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):  # would break the request line
            return Fetched(url=url, reason="bad_url", detail=f"{shown[:200]!r} holds a control character")
        try:
            bare = split_userinfo(url)[0] if scheme != "s3" else url
            if scheme != "s3":
                url_origin(bare)  # raises on a port that is not a number
                if not urllib.parse.urlsplit(bare).hostname:
                    return Fetched(url=bare, reason="bad_url", detail=f"{shown}: no host in the URL")
        except ValueError as exc:  # a bad IPv6 literal, a port out of range
            return Fetched(url=shown, reason="bad_url", detail=f"{shown[:200]}: not a valid URL ({exc})")
        attempt_once = self._s3_attempt if scheme == "s3" else self._http_attempt
        rng = random.Random(zlib.crc32(bare.encode("utf-8", "replace")))  # jitter only spaces retries in time
        attempt = 0
        while True:
            attempt += 1
            try:
                return attempt_once(url, bare)
            except _Retry as fault:
                o = self.options
                if fault.retry_after_s is not None and fault.retry_after_s > o.max_retry_after_s:
                    detail = f"{fault.detail}; Retry-After {fault.retry_after_s:g}s is over max_retry_after_s"
                    return Fetched(url=bare, reason=fault.reason, detail=detail, status=fault.status)
                if attempt >= o.max_attempts:
                    detail = f"{fault.detail} (after {attempt} attempts)"
                    return Fetched(url=bare, reason=fault.reason, detail=detail, status=fault.status)
                delay = backoff_delay(attempt, initial_s=o.backoff_initial_s, max_s=o.backoff_max_s, rng=rng)
                delay = max(delay, fault.retry_after_s or 0.0)
                logger.debug("%s: %s; attempt %d in %.2fs", shown, fault.detail, attempt + 1, delay)
                if self._stop.wait(delay):
                    return Fetched(url=bare, reason="cancelled", detail="the downloader was closed", status=fault.status)
            except _Failure as failure:
                return Fetched(url=bare, reason=failure.reason, detail=failure.detail, status=failure.status)

    # --- http(s) -----------------------------------------------------------

    def _http_attempt(self, url: str, bare: str) -> Fetched:
        _, user, password = split_userinfo(url)
        origin = url_origin(bare)
        authorization = None
        if user is not None:
            authorization = urllib3.make_headers(basic_auth=f"{user}:{password or ''}")["authorization"]
        deadline = time.monotonic() + self.options.fetch_deadline_s
        visited = {bare}
        current = bare
        for _ in range(self.options.max_redirects + 1):
            headers = dict(self._headers)
            if authorization is not None and url_origin(current) == origin:
                headers["Authorization"] = authorization
            host = url_origin(current)
            if not self._slots.acquire(host, self._stop):
                raise _Failure("cancelled", "the downloader was closed")
            try:
                outcome = self._exchange(current, headers, deadline)
            finally:
                self._slots.release(host)
            if isinstance(outcome, Fetched):
                return Fetched(
                    url=bare, data=outcome.data, status=outcome.status,
                    content_type=outcome.content_type, final_url=current,
                )  # fmt: skip
            target = outcome
            if target in visited:
                raise _Failure("redirect_loop", f"{redact_url(bare)}: redirects back to {redact_url(target)}")
            visited.add(target)
            current = target
        raise _Failure(
            "too_many_redirects", f"{redact_url(bare)}: more than {self.options.max_redirects} redirects in a row"
        )

    def _exchange(self, url: str, headers: dict[str, str], deadline: float) -> Fetched | str:
        """One request: a Fetched with the body, or the URL a redirect points to."""
        try:
            response = self._pool.request(
                "GET", url, headers=headers, preload_content=False, timeout=self._timeout,
                retries=False, redirect=False,
            )  # fmt: skip
        except LocationParseError:
            raise _Failure("bad_url", f"{redact_url(url)}: not a valid URL") from None
        except Urllib3Error as exc:
            raise _network_fault(exc) from None
        try:
            status = response.status
            if status in _REDIRECTS:
                location = response.headers.get("Location")
                target = split_userinfo(urllib.parse.urljoin(url, location or ""))[0]
                if not location or urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
                    raise _Failure(
                        "bad_redirect",
                        f"HTTP {status} redirect to {redact_url(target) if location else 'nowhere'}",
                        status=status,
                    )
                return target
            if status >= 300:
                detail = f"HTTP {status} {response.reason or ''}".strip()
                if is_transient_status(status):
                    raise _Retry(
                        f"http_{status}", detail, status=status,
                        retry_after_s=retry_after_seconds(response.headers.get("Retry-After")),
                    )  # fmt: skip
                raise _Failure(f"http_{status}", detail, status=status)
            if self.options.respect_opt_out and opted_out(response.headers.getlist("X-Robots-Tag")):
                tag = ", ".join(response.headers.getlist("X-Robots-Tag"))[:100]
                raise _Failure("opt_out", f"X-Robots-Tag: {tag}", status=status)
            data = self._read_body(response, deadline)
            if not data:
                raise _Failure("empty", "the answer has no body", status=status)
            return Fetched(url=url, data=data, status=status, content_type=response.headers.get("Content-Type"))
        except _Failure as problem:
            if problem.status is None:
                problem.status = response.status
            raise
        finally:
            if response.length_remaining == 0:
                # Nothing left to read: the connection can serve the next URL.
                # drain_conn marks an empty answer (a redirect, an error with
                # no body) finished for http.client, which refuses to reuse
                # the connection otherwise. A body left unread is never read
                # out (that could take a trickling server's time): closed.
                response.drain_conn()
                response.release_conn()
            else:
                response.close()

    def _read_body(self, response: urllib3.BaseHTTPResponse, deadline: float) -> bytes:
        limit = self.options.max_bytes
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _Failure("too_large", f"Content-Length {length} is over max_bytes ({limit})")
        parts: list[bytes] = []
        received = 0
        while True:
            if time.monotonic() > deadline:
                raise _Retry("timeout", f"body not complete after {self.options.fetch_deadline_s:g}s")
            try:
                piece = response.read1(_READ_BYTES)
            except Urllib3Error as exc:
                raise _network_fault(exc) from None
            except OSError as exc:
                raise _Retry("connection", f"read failed ({type(exc).__name__})") from None
            if not piece:
                break
            received += len(piece)
            if received > limit:
                raise _Failure("too_large", f"body is over max_bytes ({limit})")
            parts.append(piece)
        return b"".join(parts)

    # --- s3 ----------------------------------------------------------------

    def _s3_attempt(self, url: str, bare: str) -> Fetched:
        from shardkit.io.s3 import S3Fetcher, classify_s3_error  # boto3 itself only once a client is made
        if self._s3_options is None:
            self._s3_options = self.options.source_options()
        host = _host_of(url)
        if not self._slots.acquire(host, self._stop):
            raise _Failure("cancelled", "the downloader was closed")
        try:
            try:
                fetcher = S3Fetcher(url, options=self._s3_options)
                response = fetcher.open_range(0, None)
            except UsageError as exc:
                raise _Failure("bad_url", str(exc)) from None
            try:
                if response.end is not None and response.end > self.options.max_bytes:
                    raise _Failure("too_large", f"object of {response.end} bytes is over max_bytes")
                parts: list[bytes] = []
                received = 0
                while piece := response.read(_READ_BYTES):
                    received += len(piece)
                    if received > self.options.max_bytes:
                        raise _Failure("too_large", f"object is over max_bytes ({self.options.max_bytes})")
                    parts.append(piece)
            finally:
                response.close()
        except _Failure:
            raise
        except TransientFault as fault:
            raise _Retry(_s3_reason(fault.status, "connection"), fault.cause, status=fault.status) from None
        except RemoteError as exc:
            raise _Failure(_s3_reason(exc.status, "s3_error"), str(exc), status=exc.status) from None
        except Exception as exc:  # a botocore error while reading that classify did not turn into ours
            problem = classify_s3_error(exc, redact_url(url), None)
            if isinstance(problem, TransientFault):
                raise _Retry("connection", problem.cause) from None
            raise _Failure("s3_error", f"{type(exc).__name__}") from None
        finally:
            self._slots.release(host)
        data = b"".join(parts)
        if not data:
            raise _Failure("empty", "the object has no bytes", status=200)
        return Fetched(url=bare, data=data, status=200, final_url=bare)


def _s3_reason(status: int | None, otherwise: str) -> str:
    return f"http_{status}" if status else otherwise


def _network_fault(exc: BaseException) -> _Retry:
    # urllib3 puts full URLs (query strings too) in its messages: only class names go out.
    # NewConnectionError subclasses ConnectTimeoutError in urllib3 2: test it first.
    if isinstance(exc, NewConnectionError):
        return _Retry("connection", f"connection failed ({type(exc).__name__})")
    if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError)) or isinstance(
        getattr(exc, "reason", None), (ConnectTimeoutError, ReadTimeoutError)
    ):
        return _Retry("timeout", f"timed out ({type(exc).__name__})")
    return _Retry("connection", f"connection failed ({type(exc).__name__})")


__all__ = ["DownloadOptions", "Downloader", "Fetched", "REASONS"]
