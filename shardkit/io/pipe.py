"""``pipe:CMD`` sources: a command's standard output (explicit opt-in only).

The command line is split with :func:`shlex.split` and run without a shell,
so nothing in it is expanded or interpreted. There are no ranges and no
retries: a range is read by discarding the bytes before it.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Iterator

from shardkit.errors import RemoteError, UsageError
from shardkit.io.base import check_range, read_capped, short_read

logger = logging.getLogger(__name__)


class PipeSource:
    """The stdout of a command, as a byte source.

    Args:
        url: ``pipe:CMD``.
    """

    def __init__(self, url: str):
        self.url = url
        self.argv = shlex.split(url[len("pipe:") :])
        if not self.argv:
            raise UsageError(f"{url!r}: empty pipe: command")

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        """Run the command and yield bytes ``[start, end)`` of its output.

        Raises:
            RemoteError: The command cannot be started or exits non-zero.
        """
        name = self.argv[0]
        try:
            process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, shell=False)
        except OSError as exc:
            raise RemoteError(f"pipe:{name}: cannot run the command ({exc.strerror})", url=f"pipe:{name}") from exc
        assert process.stdout is not None
        pos = 0
        finished = False
        try:
            while end is None or pos < end:
                data = process.stdout.read(chunk_bytes)
                if not data:
                    break
                lo, hi = max(start - pos, 0), len(data) if end is None else min(len(data), end - pos)
                pos += len(data)
                if lo < hi:
                    yield data[lo:hi]
            finished = True
        finally:
            process.stdout.close()
            if not finished or (end is not None and pos >= end):
                process.kill()
            code = process.wait()
        if end is None and code != 0:
            raise RemoteError(f"pipe:{name}: command exited with status {code}", url=f"pipe:{name}", offset=pos)

    def read_all(self, *, max_bytes: int | None = None) -> bytes:
        chunk_bytes = 1 << 20 if max_bytes is None else min(1 << 20, max_bytes + 1)
        return read_capped(self.url, self.iter_range(0, None, chunk_bytes=chunk_bytes), max_bytes)

    def read_at(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` of the output (the command runs
        again, and the bytes before the range are discarded)."""
        check_range(self.url, offset, size, None)
        data = read_capped(self.url, self.iter_range(offset, offset + size, chunk_bytes=1 << 20), None)
        if len(data) != size:
            raise short_read(self.url, offset, size, offset + len(data))
        return data

    def close(self) -> None:
        """Nothing is held between reads: each runs the command."""
