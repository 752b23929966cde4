"""HTTP(S) objects read with ranged GET requests (urllib3).

One connection pool per process, created after a DataLoader worker forks
(pools are never shared across a fork). urllib3 does no retrying of its own
here: :mod:`shardkit.io.ranged` resumes and retries with its own deadline.
Query strings (presigned URLs carry tokens there) are sent but never logged,
urllib3's own debug lines included.

Credentials: ``https://USER:PASSWORD@host/...`` (percent-encoded) is sent as
HTTP Basic auth. The userinfo is taken out of the URL that is requested and
of everything reported, and the ``Authorization`` header goes to the URL's
own origin (scheme, host, port) only.

Redirects are followed here, at most :data:`MAX_REDIRECTS` in a row, and only
within the origin unless ``SourceOptions.allow_cross_origin_redirects`` is
set; a redirect elsewhere is a :class:`~shardkit.errors.RemoteError`. Even
with that option, credentials are never sent to another origin.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.parse

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error

from shardkit.errors import RemoteError
from shardkit.io.ranged import fatal_status, is_transient_status
from shardkit.io.retry import TransientFault, retry_after_seconds
from shardkit.io.base import SourceOptions
from shardkit.io.urls import redact_url, split_userinfo, url_origin

logger = logging.getLogger(__name__)

#: Most redirects followed for one request.
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_pools: dict[tuple[int, int], urllib3.PoolManager] = {}
_pools_lock = threading.Lock()

#: Origins (scheme, host, port) whose server answered a ranged request of
#: this process with the whole object: their objects are read in one
#: request each from then on (see :func:`shardkit.io.ranged.ignores_ranges`).
_WHOLE_OBJECT_ORIGINS: set[tuple[str, str, int | None]] = set()
_origins_lock = threading.Lock()


class _DropQueryStrings(logging.Filter):
    """Cuts query strings out of urllib3's debug lines (they can hold tokens)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(a.split("?", 1)[0] if isinstance(a, str) and "?" in a else a for a in record.args)
        return True


_QUERY_FILTER = _DropQueryStrings()


def hide_query_strings_in_urllib3_logs() -> None:
    """Cut query strings out of urllib3's request log lines from now on.

    Called when a connection pool is made (not at import); idempotent.
    """
    connection_log = logging.getLogger("urllib3.connectionpool")
    if _QUERY_FILTER not in connection_log.filters:
        connection_log.addFilter(_QUERY_FILTER)


def _pool(max_connections: int) -> urllib3.PoolManager:
    key = (os.getpid(), max_connections)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            hide_query_strings_in_urllib3_logs()
            # Room for several open ranges at once (read-ahead, interleaved
            # streams) without urllib3 discarding connections.
            pool = urllib3.PoolManager(num_pools=16, maxsize=max(4 * max_connections, 16), block=False)
            _pools[key] = pool
        return pool


def _describe(exc: BaseException) -> str:
    # urllib3 messages can embed the full URL (query string included): keep
    # only the exception class and its innermost reason.
    reason = getattr(exc, "reason", None)
    inner = reason if isinstance(reason, BaseException) else exc
    return type(inner).__name__



class _HttpResponse:
    def __init__(
        self, response: urllib3.BaseHTTPResponse, start: int, end: int | None, url: str, total: int | None
    ):
        self._response = response
        self.start = start
        self.end = end
        self.total = total  # the object's size as the answer states it (Content-Range total, a 200's length)
        self._url = url

    def read(self, amt: int) -> bytes:
        try:
            # read1: whatever has arrived (up to amt), so the bytes received
            # before a dropped connection are kept and not fetched again.
            return self._response.read1(amt)
        except (Urllib3Error, OSError) as exc:
            # from None: urllib3's messages carry the full URL, query string included.
            raise TransientFault(f"read failed ({_describe(exc)})") from None

    def close(self) -> None:
        if self._response.length_remaining == 0:
            self._response.release_conn()  # fully read: the connection can be reused
        else:
            self._response.close()  # abandoned mid-body: never hand it to another request


class HttpFetcher:
    """One HTTP(S) object.

    Args:
        url: The full URL (a query string is sent but never logged;
            ``user:password@`` becomes HTTP Basic auth for the URL's origin).
        options: Timeouts, the connection limit and the redirect policy.
    """

    def __init__(self, url: str, *, options: SourceOptions):
        self.url = redact_url(url)
        bare, user, password = split_userinfo(url)
        self._full_url = bare
        self._origin = url_origin(bare)
        self._authorization: str | None = None
        if user is not None:
            self._authorization = urllib3.make_headers(basic_auth=f"{user}:{password or ''}")["authorization"]
        self.options = options
        self._timeout = urllib3.Timeout(connect=options.connect_timeout_s, read=options.read_timeout_s)
        # Redirects are followed in _request, where the origin is checked.
        self._retries = urllib3.Retry(
            total=None, connect=0, read=0, status=0, other=0, redirect=0, raise_on_status=False
        )
        #: The object's ``ETag`` (or, without one, its ``Last-Modified``) as
        #: the last :meth:`size` answer gave it; None when it gave neither.
        self.validator: str | None = None

    @property
    def ignores_ranges(self) -> bool:
        """Whether this object's server has answered a ranged request (of
        this process) with the whole object."""
        return self._origin in _WHOLE_OBJECT_ORIGINS

    def _whole_object_answer(self) -> None:
        """Note that the server answered a ranged request with the whole object (a plain 200)."""
        with _origins_lock:
            first = self._origin not in _WHOLE_OBJECT_ORIGINS
            _WHOLE_OBJECT_ORIGINS.add(self._origin)
        if first:
            scheme, host, port = self._origin
            logger.warning(
                "%s://%s:%s ignores Range requests (it answers them with the whole object): shardkit now reads "
                "each object from it in one request, and a read inside an object (IndexedDataset, a resume "
                "within a shard) fetches the object from its start. A server that honours ranges (nginx, S3 "
                "and other object stores) avoids this",
                scheme, host, port,
            )

    def _send(self, method: str, url: str, headers: dict[str, str]) -> urllib3.BaseHTTPResponse:
        if self._authorization is not None and url_origin(url) == self._origin:
            headers = {**headers, "Authorization": self._authorization}
        pool = _pool(max(self.options.max_concurrent_requests, 1))
        try:
            return pool.request(
                method,
                url,
                headers=headers,
                preload_content=False,
                timeout=self._timeout,
                retries=self._retries,
                redirect=False,
            )
        except Urllib3Error as exc:
            # from None: urllib3 puts the full URL (query string too) in its messages.
            raise TransientFault(f"request failed ({_describe(exc)})") from None

    def _redirect_target(self, url: str, response: urllib3.BaseHTTPResponse, offset: int | None) -> str:
        location = response.headers.get("Location")
        response.drain_conn()
        response.release_conn()
        target = split_userinfo(urllib.parse.urljoin(url, location or ""))[0]  # never credentials from a Location
        where = "" if offset is None else f" at byte {offset}"
        if not location or urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
            raise RemoteError(
                f"{self.url}: HTTP {response.status} redirect{where} to {redact_url(target) if location else 'nowhere'}, "
                "which is not an http(s) URL; ask the server's operator, or use the final URL directly",
                url=self.url,
                offset=offset,
                status=response.status,
            )
        if url_origin(target) != self._origin and not self.options.allow_cross_origin_redirects:
            raise RemoteError(
                f"{self.url}: HTTP {response.status}{where} redirects to {redact_url(target)}, another origin "
                "(scheme, host or port), which is not followed by default. If you trust that server, pass "
                "SourceOptions(allow_cross_origin_redirects=True) (credentials are still never sent there), "
                "or use the final URL directly",
                url=self.url,
                offset=offset,
                status=response.status,
            )
        return target

    def _request_url(self) -> str:
        """The URL a request goes to first (subclasses sign it per request)."""
        return self._full_url

    def _request(self, method: str, headers: dict[str, str], offset: int | None) -> urllib3.BaseHTTPResponse:
        url = self._request_url()
        for _ in range(MAX_REDIRECTS + 1):
            response = self._send(method, url, headers)
            if response.status not in _REDIRECTS:
                break
            url = self._redirect_target(url, response, offset)
        else:
            response.drain_conn()
            response.release_conn()
            raise RemoteError(
                f"{self.url}: more than {MAX_REDIRECTS} redirects in a row; check the URL, or use the final URL",
                url=self.url,
                offset=offset,
                status=response.status,
            )
        if response.status >= 400:
            raise self._refused(response, offset)
        return response

    def _refused(self, response: urllib3.BaseHTTPResponse, offset: int | None) -> Exception:
        """The error for an answer of status 400 or more (the response is
        released here): a :class:`TransientFault` to retry, else a
        :class:`~shardkit.errors.RemoteError`."""
        reason = response.reason or ""
        response.drain_conn()
        response.release_conn()
        if is_transient_status(response.status):
            return TransientFault(
                f"HTTP {response.status} {reason}".strip(),
                status=response.status,
                retry_after_s=retry_after_seconds(response.headers.get("Retry-After")),
            )
        hint = None
        if response.status == 401:
            hint = (
                "the server refused the credentials in the URL; check the user name and password"
                if self._authorization is not None
                else "the server wants credentials; put them in the URL as "
                "https://USER:PASSWORD@host/... (percent-encoded)"
            )
        return fatal_status(self.url, response.status, reason, offset=offset, hint=hint)

    def size(self) -> int | None:
        # A one-byte ranged GET rather than HEAD: presigned URLs are signed
        # for GET only, and some servers answer HEAD without a length.
        try:
            response = self._request("GET", {"Range": "bytes=0-0", "Accept-Encoding": "identity"}, None)
        except RemoteError as exc:
            if exc.status == 416:  # byte 0 does not exist: the object is empty
                return 0
            raise
        try:
            etag, modified = response.headers.get("ETag"), response.headers.get("Last-Modified")
            self.validator = f"etag:{etag}" if etag else f"modified:{modified}" if modified else None
            if response.status == 206:
                match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
                if match is not None and match.group(3) != "*":
                    return int(match.group(3))
                return None
            length = response.headers.get("Content-Length")  # a plain 200: the whole object
            if length is None or int(length) > 1:  # more than the byte asked for
                self._whole_object_answer()
            return int(length) if length is not None else None
        finally:
            response.close()

    def open_range(self, start: int, end: int | None) -> _HttpResponse:
        headers = {"Accept-Encoding": "identity"}
        if start > 0 or end is not None:
            headers["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        response = self._request("GET", headers, start)
        length = response.headers.get("Content-Length")
        if response.status == 206:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if match is None or int(match.group(1)) != start:
                response.close()
                raise fatal_status(self.url, 416, "unexpected Content-Range", offset=start)
            total = None if match.group(3) == "*" else int(match.group(3))
            return _HttpResponse(response, start, int(match.group(2)) + 1, self.url, total)
        if response.status != 200:
            response.close()
            raise fatal_status(self.url, response.status, response.reason or "", offset=start)
        # A plain 200: the whole object from byte 0 (the server ignores ranges).
        size = None if length is None else int(length)
        if start > 0 or (end is not None and (size is None or end < size)):
            self._whole_object_answer()  # not a range that happened to be the whole object
        return _HttpResponse(response, 0, size, self.url, size)
