"""Read-only FUSE passthrough that delays every read by the seek model.

Run in the foreground by the ``hdd-seek`` profile::

    python -m bench.profiles.seekfs BACKING_DIR MOUNTPOINT --control SOCKET

The files under ``BACKING_DIR`` are laid out on a virtual platter in creation
order (modification time, then path) when the file system starts. Each read is
booked on the one virtual head of :class:`~bench.profiles.seekmodel.SeekModel`
(under a lock, so requests are served one at a time, in arrival order); the
real bytes come from the backing file while the request waits for its booked
completion time.

A small line protocol on the Unix socket ``SOCKET`` lets the harness read the
counters (``stats``), zero them (``reset``), make the disk cold (``drop``) and
log every read (``trace FILE``: one line per request with time, caller pid,
file, offset, size and whether it paid a seek; ``trace`` alone stops), which
shows how concurrent readers interleave on the head.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import socketserver
import stat
import threading
import time
from dataclasses import asdict, fields
from typing import Any

from bench.profiles.seekmodel import DiskParams, SeekModel

logger = logging.getLogger(__name__)

#: Gap left between files on the virtual platter, so two files never touch.
FILE_GAP_BYTES = 1 << 20
#: How long the kernel may cache attributes and directory entries.
ATTR_TIMEOUT_S = 3600


def platter_layout(root: str) -> dict[str, tuple[int, int]]:
    """Map each file under ``root`` (relative path with a leading ``/``) to
    ``(platter address, size)``, laid out in creation order."""
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                rel = "/" + os.path.relpath(path, root)
                found.append((st.st_mtime_ns, rel, st.st_size))
    found.sort()
    layout = {}
    addr = 0
    for _mtime, rel, size in found:
        layout[rel] = (addr, size)
        addr += -(-size // 4096) * 4096 + FILE_GAP_BYTES
    return layout


class SeekDisk:
    """The model plus its clock and lock: what the FUSE handlers call."""

    def __init__(self, params: DiskParams, layout: dict[str, tuple[int, int]]):
        self.model = SeekModel(params)
        self.layout = layout
        self.lock = threading.Lock()
        self.switches = {"pid_switches": 0, "file_switches": 0}
        self._last: tuple[int, str] = (-1, "")
        self._trace: Any = None
        self._next_addr = max((a + s for a, s in layout.values()), default=0) + FILE_GAP_BYTES

    def address(self, path: str, size: int) -> int:
        entry = self.layout.get(path)
        if entry is None:  # a file that appeared after mounting goes at the end
            with self.lock:
                entry = self.layout.setdefault(path, (self._next_addr, size))
                self._next_addr += -(-size // 4096) * 4096 + FILE_GAP_BYTES
        return entry[0]

    def wait_open(self, path: str) -> None:
        with self.lock:
            done = self.model.open(time.monotonic(), path)
        _sleep_until(done)

    def book_read(self, addr: int, num_bytes: int, limit: int, *, path: str = "", pid: int = -1,
                  offset: int = 0) -> float:
        with self.lock:
            now = time.monotonic()
            seeks = self.model.stats.seeks
            done = self.model.read(addr, num_bytes, now, limit=limit)
            last_pid, last_path = self._last
            self.switches["pid_switches"] += pid != last_pid
            self.switches["file_switches"] += path != last_path
            self._last = (pid, path)
            if self._trace is not None:
                seek = int(self.model.stats.seeks > seeks)
                self._trace.write(f"{now:.6f} {pid} {path} {offset} {num_bytes} {seek} {done - now:.6f}\n")
            return done

    def command(self, line: str) -> dict[str, Any]:
        with self.lock:
            if line == "drop":
                self.model.drop_cache()
            elif line == "reset":
                self.model.reset_stats()
                self.switches = dict.fromkeys(self.switches, 0)
            elif line.startswith("trace"):
                if self._trace is not None:
                    self._trace.close()
                    self._trace = None
                target = line[len("trace") :].strip()
                if target:
                    self._trace = open(target, "a", buffering=1 << 16)
            elif line != "stats":
                return {"error": f"unknown command {line!r}"}
            stats = {**self.model.stats.as_dict(), **self.switches}
            return {"stats": stats, "params": asdict(self.model.params)}


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def make_operations(root: str, disk: SeekDisk) -> Any:
    import mfusepy

    #: fd -> (file size, platter address) of each open file.
    open_files: dict[int, tuple[int, int]] = {}

    class SeekOperations(mfusepy.Operations):
        use_ns = True

        def _real(self, path: str) -> str:
            return os.path.join(root, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            try:
                st = os.lstat(self._real(path))
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno or errno.EIO) from None
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
            out = {k: getattr(st, k) for k in keys}
            for k in ("st_atime", "st_mtime", "st_ctime"):
                out[k] = out.pop(k + "_ns")
            return out

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *sorted(os.listdir(self._real(path)))]

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise mfusepy.FuseOSError(errno.EROFS)
            fd = os.open(self._real(path), os.O_RDONLY)
            size = os.fstat(fd).st_size  # read-only, so it stays right
            open_files[fd] = (size, disk.address(path, size))
            disk.wait_open(path)
            return fd

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            file_size, base = open_files[fh]
            num_bytes = max(0, min(size, file_size - offset))
            pid = mfusepy.fuse_get_context()[2]
            done = disk.book_read(base + offset, num_bytes, base + file_size, path=path, pid=pid, offset=offset)
            data = os.pread(fh, num_bytes, offset)
            _sleep_until(done)
            return data

        def release(self, path: str, fh: int) -> int:
            open_files.pop(fh, None)
            os.close(fh)
            return 0

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(root)
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
            return {k: getattr(st, k) for k in keys}

    return SeekOperations()


def serve_control(path: str, disk: SeekDisk) -> socketserver.UnixStreamServer:
    """Answer one command line per connection with one JSON line."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline().decode().strip()
            self.wfile.write((json.dumps(disk.command(line)) + "\n").encode())

    if os.path.exists(path):
        os.unlink(path)
    server = socketserver.ThreadingUnixStreamServer(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="seekfs-control").start()
    return server


def control(path: str, command: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Send one command to a running seekfs; returns its JSON answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(command.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def parse_params(pairs: list[str]) -> DiskParams:
    """``["seek_s=0.008", ...]`` -> DiskParams (unknown names are an error)."""
    types = {f.name: f.type for f in fields(DiskParams)}
    values: dict[str, Any] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in types:
            raise SystemExit(f"seekfs: unknown parameter {name!r}; known: {', '.join(sorted(types))}")
        values[name] = int(float(value)) if types[name] in (int, "int") else float(value)
    return DiskParams(**values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--control", required=True, help="Unix socket for stats/drop/reset")
    parser.add_argument("--param", action="append", default=[], help="DiskParams field=value")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="seekfs: %(message)s")
    try:
        import mfusepy
    except (ImportError, OSError) as exc:
        raise SystemExit(
            f"seekfs needs the mfusepy package and libfuse ({exc}); "
            "run `pip install mfusepy` and `apt-get install -y fuse libfuse2`"
        ) from None
    backing = os.path.abspath(args.backing)
    disk = SeekDisk(parse_params(args.param), platter_layout(backing))
    logger.info("%d files on the platter; %s", len(disk.layout), disk.model.params)
    server = serve_control(args.control, disk)
    try:
        mfusepy.FUSE(
            make_operations(backing, disk),
            args.mountpoint,
            foreground=True,
            ro=True,
            fsname="shardkit-seekfs",
            attr_timeout=ATTR_TIMEOUT_S,
            entry_timeout=ATTR_TIMEOUT_S,
            # Keep a file's cached pages when it is opened again, as a disk
            # file system does (FUSE drops them on every open by default).
            # Safe here: the backing files never change while mounted.
            kernel_cache=True,
        )
    finally:
        server.shutdown()
        if os.path.exists(args.control):
            os.unlink(args.control)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
