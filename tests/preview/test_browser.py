"""A `shardkit show` page in a real browser: headless Chromium (Debian's
package) opens it from disk, a screenshot is taken and the rendered DOM
dumped, and the test checks that the page rendered as meant (the cards
there, the thumbnails decoded and on screen) and fetched nothing, although
the samples' captions hold markup that would fetch from a server on
127.0.0.1 were it ever live.

Skips, saying why, only where Chromium is missing and cannot be installed
(``tools/install_chromium.sh`` needs root and apt-get; ``make test`` runs it).
"""

from __future__ import annotations

import http.server
import io
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardkit
from tests.preview.datasets import COLOURS, jpeg

ROOT = Path(__file__).resolve().parents[2]
#: Seconds one Chromium run may take (it takes about 2 here).
CHROMIUM_TIMEOUT_S = 120
WINDOW = (1280, 1400)


def _find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def chromium() -> str:
    found = _find_chromium()
    if found is None and os.geteuid() == 0:
        subprocess.run(["bash", str(ROOT / "tools" / "install_chromium.sh")], capture_output=True, timeout=900)
        found = _find_chromium()
    if found is None:
        pytest.skip(
            "Chromium is not installed and could not be installed here (tools/install_chromium.sh needs root "
            "and apt-get; `make test` runs it as root)"
        )
    return found


class _Counting(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def bait_server() -> Iterator[http.server.ThreadingHTTPServer]:
    """A server on 127.0.0.1 that records every request: what a live tag in a sample would fetch."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _run(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Every host name resolves to nothing; 127.0.0.1, the bait server, is reachable (an IP is mapped too, unless excluded).
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
        "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--enable-logging=stderr", "--v=0", *args,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S)


def _bait(server: http.server.ThreadingHTTPServer) -> str:
    base = f"http://127.0.0.1:{server.server_address[1]}"
    return (
        f'<img src="{base}/img.png"><link rel="stylesheet" href="{base}/style.css">'
        f'<iframe src="{base}/frame"></iframe><script src="{base}/app.js"></script>'
        f"<style>@import url({base}/import.css);</style>"
    )


def test_page_renders_in_chromium_with_every_card_and_thumbnail_and_fetches_nothing(
    chromium, bait_server, tmp_path
):
    from PIL import Image

    bait = _bait(bait_server)
    dest = tmp_path / "ds"
    with shardkit.ShardWriter(str(dest), max_samples=2, class_names=[f"cat{bait}", "dog"]) as writer:
        for i, colour in enumerate(COLOURS):
            writer.write({"__key__": f"k{i}<svg onload=alert({i})>", "jpg": jpeg(colour), "cls": i % 2,
                          "txt": f"caption {i} {bait}", "json": {"note": bait}})  # fmt: skip
    page = tmp_path / "page.html"
    from shardkit.cli import main

    assert main(["show", str(dest), "--out", str(page), "--samples", str(len(COLOURS))]) == 0
    # The control: the same markup, live, does fetch from the server under these flags.
    control = tmp_path / "control.html"
    control.write_text(f"<html><body>{bait}</body></html>")
    _run(chromium, tmp_path / "profile-control", "--dump-dom", "--virtual-time-budget=3000", control.as_uri())
    assert bait_server.paths, "the control page fetched nothing: the test could not see a leak"
    bait_server.paths.clear()

    shot = tmp_path / "shot.png"
    taken = _run(chromium, tmp_path / "profile", f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                 "--virtual-time-budget=3000", page.as_uri())  # fmt: skip
    dumped = _run(chromium, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=3000", page.as_uri())
    assert taken.returncode == 0 and dumped.returncode == 0, taken.stderr[-2000:] + dumped.stderr[-2000:]

    # Nothing fetched, nothing refused: no tag from a sample ever came alive.
    assert bait_server.paths == []
    for log in (taken.stderr, dumped.stderr):
        assert "Refused to" not in log and "Content Security Policy" not in log, log[-2000:]

    # The DOM Chromium built: every card, every thumbnail a data: URI, no element from the samples.
    dom = dumped.stdout
    assert dom.count('<article class="card">') == len(COLOURS)
    assert dom.count('<img src="data:image/jpeg;base64,') == len(COLOURS)
    assert "<iframe" not in dom and "<script" not in dom and "<link" not in dom and "onload" not in dom.replace(
        "&lt;svg onload=", "")
    assert dom.count("&lt;iframe src=") >= len(COLOURS)  # the markup is there, as text

    # The screenshot: the thumbnails decoded and drawn, each colour on screen in a thumbnail's area.
    image = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    assert image.size == WINDOW
    pixels = np.asarray(image).astype(np.int16)
    for colour in COLOURS:
        drawn = int(np.all(np.abs(pixels - np.array(colour)) <= 16, axis=-1).sum())
        assert drawn > 20_000, f"colour {colour}: {drawn} pixels on screen"  # a 256 x 192 thumbnail is 49,152
    assert len(np.unique(pixels.reshape(-1, 3)[::97], axis=0)) > 30  # text and plots too, not one flat colour
