"""``shardkit show --serve``: the page served on 127.0.0.1, a new draw a click away.

One small :class:`http.server.ThreadingHTTPServer` on the loopback
interface only. ``GET /`` is the page of the command's seed and
``GET /?seed=N`` that of seed N, each made when asked (the dataset opened,
its samples read at random) and linking to the next seed. Nothing else is
served: any other path or query is a 404, every answer carries the page's
Content-Security-Policy as a header too, and nothing is cached.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from shardkit.errors import redact_text
from shardkit.preview.page import CONTENT_SECURITY_POLICY

log = logging.getLogger(__name__)

#: Makes the page of a seed (the dataset and every other setting fixed).
PageMaker = Callable[[int, int], str]


def requested_seed(target: str, default: int) -> int | None:
    """The seed a request names: ``/`` the default, ``/?seed=N`` N; None for anything else."""
    parts = urlsplit(target)
    if parts.path != "/":
        return None
    query = parse_qs(parts.query, keep_blank_values=True)
    if not query:
        return default
    values = query.get("seed", [])
    if set(query) != {"seed"} or len(values) != 1 or not values[0].isdigit() or len(values[0]) > 18:
        return None
    return int(values[0])


def make_server(make_page: PageMaker, *, seed: int, port: int = 0) -> ThreadingHTTPServer:
    """A server on ``127.0.0.1:port`` (0: a free port) answering with
    ``make_page(seed, next_seed)``; call ``serve_forever()`` on it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked = requested_seed(self.path, seed)
            if asked is None:
                self._answer(404, b"not found: / or /?seed=N\n", "text/plain; charset=utf-8")
                return
            try:
                body = make_page(asked, asked + 1).encode("utf-8")
            except Exception as exc:  # a fault reading the dataset: said in the answer, the server goes on
                log.warning("shardkit show --serve: %s", exc)
                self._answer(500, redact_text(f"{type(exc).__name__}: {exc}\n").encode(), "text/plain; charset=utf-8")
                return
            self._answer(200, body, "text/html; charset=utf-8")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            log.debug("shardkit show --serve: " + format, *args)

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


__all__ = ["make_server", "requested_seed"]
