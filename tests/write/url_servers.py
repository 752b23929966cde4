"""A scripted HTTP server on 127.0.0.1 for downloader tests: each path
answers from a queue of :class:`Answer` (the last one repeats), so a test
can serve a 503 then a 200, a redirect loop, a hang or an opt-out header."""

from __future__ import annotations

import io
import random
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.remote.remote_servers import QuietDisconnects


@dataclass
class Answer:
    """One scripted answer.

    Attributes:
        status: HTTP status.
        body: The body.
        headers: Extra headers (``Location``, ``Retry-After``, ``X-Robots-Tag``...).
        hold_s: Wait this long before answering (ended early when the server closes).
        hold_until: Wait for this event before answering (or ``hold_s``, or the close).
        trickle_s: Pause between body bytes (a server that trickles).
    """

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    hold_s: float = 0.0
    hold_until: threading.Event | None = None
    trickle_s: float = 0.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ScriptedServer

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def do_GET(self):
        server = self.server
        path = self.path
        with server.lock:
            server.requests.append((path, dict(self.headers)))
            queue = server.script.get(path.split("?", 1)[0])
            answer = (queue.pop(0) if len(queue) > 1 else queue[0]) if queue else Answer(404, b"no such path")
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        try:
            if answer.hold_until is not None:
                answer.hold_until.wait(answer.hold_s or 30)
            elif answer.hold_s:
                server.closing.wait(answer.hold_s)
            self.send_response(answer.status)
            headers = {"Content-Type": "image/jpeg", "Content-Length": str(len(answer.body)), **answer.headers}
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if answer.trickle_s:
                for i in range(len(answer.body)):
                    if server.closing.wait(answer.trickle_s):
                        break
                    self.wfile.write(answer.body[i : i + 1])
                    self.wfile.flush()
            else:
                self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with server.lock:
                server.in_flight -= 1


class ScriptedServer(QuietDisconnects, ThreadingHTTPServer):
    """``server.serve(path, Answer(...), ...)`` -> URL; close() ends holds at once."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a loaded machine's burst of connects never waits on the backlog

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: dict[str, list[Answer]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.closing = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def serve(self, path: str, *answers: Answer) -> str:
        self.script[path] = list(answers)
        return self.base_url + path

    def hits(self, path: str) -> int:
        with self.lock:
            return sum(1 for p, _ in self.requests if p.split("?", 1)[0] == path)

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def server():
    """A :class:`ScriptedServer` for one test (import this fixture into a test module)."""
    s = ScriptedServer()
    try:
        yield s
    finally:
        s.close()


def photo_jpeg(width: int, height: int, *, seed: int = 0, quality: int = 90) -> bytes:
    """A JPEG with noise (so truncating it loses coded data, as with a photo)."""
    from PIL import Image

    rng = random.Random(seed)
    small = Image.frombytes("RGB", (max(width // 8, 1), max(height // 8, 1)),
                            bytes(rng.getrandbits(8) for _ in range(3 * max(width // 8, 1) * max(height // 8, 1))))
    image = small.resize((width, height), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def png_bytes(width: int, height: int, mode: str = "RGBA") -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, (width, height), (10, 20, 30, 128) if mode == "RGBA" else 90).save(buffer, format="PNG")
    return buffer.getvalue()
