"""Real servers for remote tests, on 127.0.0.1 only: a ranged HTTP server with
injectable faults, and moto's S3 server; and client options that make a
client give up on them quickly."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from shardkit.io.base import SourceOptions

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass
class Faults:
    """Faults for one path, each consumed by the next matching GET.

    Attributes:
        statuses: Status codes to answer instead of serving (e.g. [503, 500]).
        drop_after: For each coming GET, close the connection after this many
            body bytes.
        stall_after: For each coming GET, stop sending after this many body
            bytes for ``stall_s`` seconds (or until the server closes), then
            close. ``FaultyHTTPServer.stalls_held`` counts the stalls going on.
        stall_s: Length of a stall.
        ignore_range: Answer every GET with 200 and the whole object.
        retry_after: Send ``Retry-After`` (seconds) with the ``statuses`` answers.
    """

    statuses: list[int] = field(default_factory=list)
    drop_after: list[int] = field(default_factory=list)
    stall_after: list[int] = field(default_factory=list)
    stall_s: float = 5.0
    ignore_range: bool = False
    retry_after: float | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultyHTTPServer

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def _lookup(self) -> tuple[bytes | None, Faults]:
        path = self.path.split("?", 1)[0]
        return self.server.objects.get(path), self.server.faults.setdefault(path, Faults())

    def do_HEAD(self):
        self.server.record(self.command, self.path, None)
        data, faults = self._lookup()
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self):
        range_header = self.headers.get("Range")
        self.server.record(self.command, self.path, range_header)
        data, faults = self._lookup()
        if data is None:
            self.send_error(404)
            return
        with self.server.lock:
            status = faults.statuses.pop(0) if faults.statuses else None
            drop = faults.drop_after.pop(0) if faults.drop_after else None
            stall = faults.stall_after.pop(0) if faults.stall_after else None
        if status is not None:
            if faults.retry_after is not None:
                body = b"slow down"
                self.send_response(status)
                self.send_header("Retry-After", str(faults.retry_after))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(status)
            return
        start, end = 0, len(data)
        match = _RANGE.match(range_header or "")
        if match and not faults.ignore_range:
            start = int(match.group(1))
            end = min(int(match.group(2)) + 1, len(data)) if match.group(2) else len(data)
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - start))
        for name, value in self.server.extra_headers.get(self.path.split("?", 1)[0], {}).items():
            self.send_header(name, value)
        self.end_headers()
        body = memoryview(data)[start:end]
        cut = min(x for x in (drop, stall, len(body)) if x is not None)
        stalls = stall is not None and stall == cut and cut < len(body)
        if stalls:
            # Counted before the first byte goes out, so a client that has the
            # bytes before the stall also sees the stall counted.
            with self.server.changed:
                self.server.stalls_held += 1
                self.server.changed.notify_all()
        try:
            for i in range(0, cut, 65536):
                piece = body[i : min(i + 65536, cut)]
                # Counted before the write, so whatever a client has received
                # is already counted when it looks.
                with self.server.changed:
                    self.server.sent[self.path] = self.server.sent.get(self.path, 0) + len(piece)
                    self.server.changed.notify_all()
                self.wfile.write(piece)
            self.wfile.flush()
            if stalls:
                self.server.stop.wait(faults.stall_s)
                with self.server.changed:
                    self.server.stalls_held -= 1
                    self.server.changed.notify_all()
                stalls = False
            if cut < len(body):
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            if stalls:  # the client hung up before the stall began
                with self.server.changed:
                    self.server.stalls_held -= 1
                    self.server.changed.notify_all()


class QuietDisconnects:
    """Mixin for a test server: a client that gives up mid-request (a reader
    stopping at the first error, a timeout) resets the connection while the
    server still reads or writes. That is the client's right, not a server
    fault, so it is not printed to stderr, where tests read the CLI's one line."""

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)  # type: ignore[misc]


class FaultyHTTPServer(QuietDisconnects, ThreadingHTTPServer):
    """An HTTP/1.1 server of in-memory objects with Range support and faults."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[str, bytes] = {}
        self.faults: dict[str, Faults] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.sent: dict[str, int] = {}  # body bytes handed to the socket per request path
        self.extra_headers: dict[str, dict[str, str]] = {}  # sent with each GET answer per path (ETag...)
        self.stalls_held = 0  # responses stalling right now (Faults.stall_after)
        # Re-entrant, so that a wait_for() predicate may call gets().
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # requests, sent, stalls_held
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add(self, path: str, data: bytes) -> str:
        """Serve ``data`` at ``path``; return its URL."""
        self.objects[path] = data
        return self.base_url + path

    def record(self, method: str, path: str, range_header: str | None) -> None:
        with self.changed:
            self.requests.append((method, path, range_header))
            self.changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 60.0) -> bool:
        """Block until ``predicate()`` holds, re-checked whenever a request
        arrives, body bytes go out or a stall begins or ends; False if it
        still does not hold after ``timeout_s`` (a failure, not a pace)."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout=timeout_s)

    def gets(self, path: str) -> list[str | None]:
        with self.lock:
            return [r for m, p, r in self.requests if m == "GET" and p.split("?", 1)[0] == path]

    def start(self) -> FaultyHTTPServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


def moto_environment(host: str, port: int) -> dict[str, str]:
    """The environment that points boto3 at moto's server on ``host:port``, with throwaway credentials."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }


def without_aws_credentials(monkeypatch, tmp_path) -> None:
    """No AWS credentials anywhere boto3 looks (environment, files, instance
    metadata), for the test's duration; the endpoint and region stay."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def wait_for_port(host: str, port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} did not open")


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 that can cut connections mid-response.

    Each new client connection takes the next value of ``cut_after`` (None or
    an exhausted list: never cut) and is closed once that many bytes went
    back to the client. Used to drop S3 (moto) responses midway.
    """

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.cut_after: list[int | None] = []
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> CuttingProxy:
        self._accept.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                cut = self.cut_after.pop(0) if self.cut_after else None
            upstream = socket.create_connection(self.target)
            for src, dst, limit in ((client, upstream, None), (upstream, client, cut)):
                t = threading.Thread(target=self._pump, args=(src, dst, limit), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while not self._stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: limit - sent])
                    with self._lock:
                        self.cuts += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._accept.join(timeout=5)


def most_attempts(options: SourceOptions) -> int:
    """Most attempts a :class:`~shardkit.io.retry.Backoff` makes on a stream
    that gets no byte through before it gives up, on any machine.

    Every wait lasts at least half its nominal delay (the jitter's floor), and
    the waits together stay within ``retry_deadline_s``, so a slow machine
    makes fewer attempts, never more; one extra allows for rounding.
    """
    waited, waits = 0.0, 0
    while True:
        shortest = 0.5 * min(options.backoff_max_s, options.backoff_initial_s * 2**waits)
        if waited + shortest > options.retry_deadline_s:
            return waits + 1 + 1
        waited += shortest
        waits += 1


def fast_options(**overrides: Any) -> SourceOptions:
    """Source options for the local test servers: small parts and chunks, a
    short read timeout, a 5 s retry deadline and millisecond backoff, so a
    fault is retried, or given up on, within a test's time. ``overrides``
    replace any of them or set other fields."""
    settings: dict[str, Any] = {
        "part_bytes": 16 << 10,
        "chunk_bytes": 8 << 10,
        "read_timeout_s": 0.5,
        "retry_deadline_s": 5.0,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.1,
    }
    return SourceOptions(**{**settings, **overrides})
