#!/usr/bin/env python3
"""What serves bench_ingest's list of URLs.

The good photos, the 404s and the HTML pages served as ``image/jpeg`` are
static files of one folder (the *site*), served by the object-store emulation
of ``bench/remote_emulation.sh``: nginx in a network namespace of its own,
with the per-connection cap (``limit_rate``) and no aggregate cap. The site:

    photos/NNNNNN.jpg   the generated photos (a link to their folder)
    html/NNNNNN.jpg     a login page; nginx serves every .jpg as image/jpeg
    missing/            absent, so nginx answers 404

nginx lets a response send its first second's worth of bytes at once
(``limit_rate`` counts from one second ahead), so a 0.5 MB photo under a
20 MB/s cap would arrive unpaced. The site's ``.jpg`` location therefore sets
``sendfile_max_chunk`` to 2 ms of the cap: nginx sends one chunk, then waits
the chunk's time at the cap before the next, from the first byte on. The
per-connection rate reached is measured and recorded (one connection, one
photo after another: about 19 MB/s for the 1,600x1,200 photos and 21 MB/s
for ImageNet-size ones, whose last chunk goes unpaced; the Python server
gives 19 and 18; 3 ms steps gave 20 and 26, 1 ms steps 17 and 17).

The hanging URLs point at :class:`HangingListener`, a socket on 127.0.0.1
that listens and never accepts: the kernel completes each connection into
the accept queue and takes the request into its buffer, but nothing ever
answers, so the client's read timeout fires. It needs no thread and no CPU,
and it is renewed (same port, empty queue) before each tool's run.

Only when the emulation cannot start (not root, or the script fails) does a
Python server (``serve``, in a process of its own, pacing every answer at
the cap) serve the site instead; the record says which one served.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
EMULATION = os.path.join(HERE, "remote_emulation.sh")
#: Where remote_emulation.sh keeps its state (nginx.conf, nginx.pid), as it decides.
EMULATION_STATE = os.environ.get("SHARDKIT_EMULATION_DIR", "/tmp/shardkit-remote-emulation")
#: nginx sends this much of the cap at a time, then waits as long (see the module's text).
PACE_STEP_S = 0.002
#: The page served as image/jpeg under html/.
HTML_PAGE = b"<!doctype html><html><body>Please log in</body></html>"
#: Folder of the site per kind of URL (hanging URLs go to the listener).
FOLDERS = {"ok": "photos", "missing": "missing", "html": "html"}


def write_site(work: str, images_dir: str, html_rows: list[int]) -> str:
    """``work/site`` laid out as the module's text says, made anew; returns its path."""
    site = os.path.join(work, "site")
    shutil.rmtree(site, ignore_errors=True)
    os.makedirs(os.path.join(site, "html"))
    os.symlink(os.path.abspath(images_dir), os.path.join(site, "photos"))
    for row in html_rows:
        with open(os.path.join(site, "html", f"{row:06d}.jpg"), "wb") as f:
            f.write(HTML_PAGE)
    return site


# --- hanging answers -------------------------------------------------------------


class HangingListener:
    """A socket on 127.0.0.1 that listens and never accepts (see the module's text).

    Up to the kernel's ``somaxconn`` connections wait in its queue; a
    connection beyond that would see a connect timeout instead of a read
    timeout, so :meth:`renew` empties the queue between runs and
    :attr:`capacity` says how many one run may make.
    """

    def __init__(self) -> None:
        self._sock = self._listen(0)
        self.port: int = self._sock.getsockname()[1]
        with open("/proc/sys/net/core/somaxconn") as f:
            self.capacity = min(int(f.read()), 4096)

    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(4096)
        return sock

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def renew(self) -> None:
        """A new socket on the same port; the queued connections are reset."""
        self._sock.close()
        self._sock = self._listen(self.port)

    def close(self) -> None:
        self._sock.close()


# --- the emulation (nginx) -------------------------------------------------------


def emulation_in_use() -> bool:
    """Whether remote_emulation.sh is up already (another benchmark's run, or a stale one)."""
    try:
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    except OSError:
        namespaces = ""
    if "skremote" in namespaces.split():
        return True
    try:
        with open(os.path.join(EMULATION_STATE, "nginx.pid")) as f:
            os.kill(int(f.read().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def nginx_site_conf(bytes_per_s: int) -> str:
    """The server-block lines for the site's ``.jpg`` files: image/jpeg, the
    cap from the first byte, missing files not logged."""
    pace = f"limit_rate {bytes_per_s}; sendfile_max_chunk {max(int(bytes_per_s * PACE_STEP_S), 4096)};"
    return (
        "# bench/ingest_servers.py: the URL list's files\n"
        "location ~ \\.jpg$ {\n"
        "    types { image/jpeg jpg; }\n"
        f"    {pace if bytes_per_s else 'limit_rate 0;'}\n"
        "    log_not_found off;\n"
        "}\n"
    )


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its living children (nginx's
    master and workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command's ")": state, ppid, ..., utime (12th), stime (13th).
        if int(entry) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


# --- the fallback: a Python server -----------------------------------------------


class _SiteHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _SiteServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        parts = urllib.parse.urlsplit(self.path).path.strip("/").split("/")
        path = os.path.join(self.server.root, *parts)
        if ".." in parts or not parts[-1].endswith(".jpg") or not os.path.isfile(path):
            self.send_error(404)
            return
        with open(path, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # The per-connection cap: 16 KiB pieces, each sent when the cap allows.
        started, rate = time.monotonic(), self.server.bytes_per_s
        try:
            for at in range(0, len(body), 16 << 10):
                self.wfile.write(body[at : at + (16 << 10)])
                ahead = (at + (16 << 10)) / rate - (time.monotonic() - started) if rate else 0
                if ahead > 0:
                    time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _SiteServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, root: str, bytes_per_s: float):
        super().__init__(("127.0.0.1", 0), _SiteHandler)
        self.root = root
        self.bytes_per_s = bytes_per_s


def serve(root: str, per_connection_mbps: float) -> None:
    """Serve ``root`` until killed or until stdin ends (the parent is gone);
    prints the port first."""
    server = _SiteServer(root, per_connection_mbps * 1e6)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True).start()
    sys.stdin.read()


# --- all of it -------------------------------------------------------------------


class URLServers:
    """The emulation (or the fallback) serving ``site`` plus the hanging
    listener, from ``with`` to its end (Ctrl-C included).

    Args:
        site: the folder from :func:`write_site`.
        per_connection_mbps: the per-connection cap, MB/s (10^6 bytes).
        emulation: try the emulation first (default); False serves from
            the Python server straight away.
    """

    def __init__(self, site: str, per_connection_mbps: float, *, emulation: bool = True):
        self.site = site
        self.emulation = emulation
        self.bytes_per_s = int(per_connection_mbps * 1e6)
        self.per_connection_mbps = per_connection_mbps
        self.kind = ""
        self.base_url = ""
        self.emulation_started = False
        self.fallback: subprocess.Popen | None = None
        self.hang: HangingListener | None = None
        self._note = ""

    def __enter__(self) -> URLServers:
        try:
            self.hang = HangingListener()
            self._start_site_server()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_site_server(self) -> None:
        if not self.emulation:
            self._note = "asked for"
        elif os.geteuid() != 0:
            self._note = "not root"
        elif emulation_in_use():
            raise SystemExit(
                "the remote emulation is up already (another benchmark is using it, or a run was killed): "
                "wait for it, or stop it with `bench/remote_emulation.sh down`"
            )
        else:
            conf = os.path.join(os.path.dirname(self.site), "nginx-site.conf")
            with open(conf, "w") as f:
                f.write(nginx_site_conf(self.bytes_per_s))
            self.emulation_started = True
            try:
                out = subprocess.run(
                    ["bash", EMULATION, "up", self.site, str(max(round(self.per_connection_mbps), 1)), "0"],
                    env={**os.environ, "SHARDKIT_EMULATION_EXTRA_CONF": conf},
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True,
                )  # fmt: skip
                self.base_url = out.stdout.strip().splitlines()[-1]
                self.kind = "nginx" if "://127.0.0.1:" in self.base_url else "nginx-netns"
                return
            except (OSError, subprocess.CalledProcessError) as exc:
                stderr = getattr(exc, "stderr", "") or str(exc)
                self._note = f"remote_emulation.sh up failed: {stderr.strip()[-300:]}"
                self._emulation_down()
        if self.emulation:
            print(f"bench_ingest: the object-store emulation cannot start ({self._note}); "
                  "serving the URLs from a Python server instead", file=sys.stderr)  # fmt: skip
        self.fallback = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", self.site, str(self.per_connection_mbps)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.fallback.stdout is not None
        self.base_url = f"http://127.0.0.1:{int(self.fallback.stdout.readline())}"
        self.kind = "python"

    def url(self, kind: str, row: int) -> str:
        """The URL of row ``row``, of kind ok, missing, html or hang."""
        assert self.hang is not None
        base = self.hang.base_url if kind == "hang" else f"{self.base_url}/{FOLDERS[kind]}"
        return f"{base}/{row:06d}.jpg"

    def renew(self) -> None:
        """Before each tool's run: an empty queue on the hanging listener."""
        assert self.hang is not None
        self.hang.renew()

    def cpu_s(self) -> float:
        """CPU seconds the server processes have used so far."""
        if self.fallback is not None:
            return process_tree_cpu_s(self.fallback.pid)
        try:
            with open(os.path.join(EMULATION_STATE, "nginx.pid")) as f:
                return process_tree_cpu_s(int(f.read().strip()))
        except (OSError, ValueError):
            return 0.0

    def measure_per_connection(self, urls: list[str]) -> float:
        """MB/s of one connection fetching ``urls`` one after the other."""
        received, started = 0, time.monotonic()
        for url in urls:
            parts = urllib.parse.urlsplit(url)
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            try:
                connection.request("GET", parts.path)
                response = connection.getresponse()
                if response.status != 200:
                    raise RuntimeError(f"{url}: HTTP {response.status} from the {self.kind} server")
                received += len(response.read())
            finally:
                connection.close()
        return received / (time.monotonic() - started) / 1e6

    def describe(self) -> dict[str, Any]:
        """For the record: which server served, with which caps."""
        how = {
            "nginx-netns": "nginx of bench/remote_emulation.sh in its network namespace",
            "nginx": "nginx of bench/remote_emulation.sh on 127.0.0.1 (no network namespace)",
            "python": f"a Python ThreadingHTTPServer in its own process (the emulation: {self._note})",
        }[self.kind]
        return {
            "kind": self.kind, "how": how, "per_connection_mbps": self.per_connection_mbps,
            "aggregate_mbps": None, "hang": "a socket on 127.0.0.1 that listens and never accepts",
        }  # fmt: skip

    def _emulation_down(self) -> None:
        subprocess.run(["bash", EMULATION, "down"], check=False, capture_output=True)
        self.emulation_started = False

    def close(self) -> None:
        """Stop what was started; safe to call twice."""
        if self.fallback is not None:
            self.fallback.terminate()
            self.fallback.wait()
            self.fallback = None
        if self.emulation_started:
            self._emulation_down()
        if self.hang is not None:
            self.hang.close()
            self.hang = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="serve a site folder as bench_ingest's fallback server")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("root")
    parser.add_argument("per_connection_mbps", type=float)
    args = parser.parse_args(argv)
    serve(args.root, args.per_connection_mbps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
