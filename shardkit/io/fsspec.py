"""Any fsspec URL (``gs://``, ``az://``, ``hf://``, ``memory://``...) as a ranged source.

The filesystem comes from :func:`fsspec.core.url_to_fs`, configured the way
that fsspec implementation reads its own configuration. Each range is a file
one ``cat_file(path, start, end)`` call; faults other than missing or
forbidden objects are retried like HTTP ones.
"""

from __future__ import annotations

from typing import Any

from shardkit.errors import RemoteError, UsageError
from shardkit.io.ranged import fatal_status
from shardkit.io.retry import TransientFault
from shardkit.io.base import SourceOptions
from shardkit.io.urls import redact_url


def url_to_fs(url: str) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``url``.

    Raises:
        UsageError: fsspec has no filesystem for the scheme (or its package
            is not installed).
    """
    import fsspec.core

    try:
        return fsspec.core.url_to_fs(url)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"{redact_url(url)}: no filesystem for this URL scheme ({exc})") from None


def classify_fs_error(exc: BaseException, url: str, offset: int | None) -> BaseException:
    """Map an exception from an fsspec filesystem to a fault or an error."""
    if isinstance(exc, FileNotFoundError):
        return fatal_status(url, 404, "Not Found", offset=offset)
    if isinstance(exc, PermissionError):
        return fatal_status(url, 403, "Forbidden", offset=offset)
    if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
        return RemoteError(f"{url}: not a file", url=url, offset=offset)
    if isinstance(exc, OSError):  # TimeoutError and ConnectionError included
        return TransientFault(f"{type(exc).__name__}: {exc.strerror or 'I/O error'}")
    return exc


class _FsResponse:
    """Bytes ``[start, end)`` fetched with one ``cat_file`` call on first read.

    ``cat_file`` is the one ranged read every fsspec filesystem has, it is
    safe to call from several threads, and the async filesystems implement
    it natively; a range is at most ``part_bytes`` long, so holding it whole
    is within the read-ahead budget.
    """

    def __init__(self, fetcher: FsspecFetcher, start: int, end: int | None):
        self._fetcher = fetcher
        self.start = start
        self.end = end
        self._data: memoryview | None = None
        self._pos = 0

    def read(self, amt: int) -> bytes:
        if self._data is None:
            fetcher = self._fetcher
            try:
                data = fetcher.fs.cat_file(fetcher.path, start=self.start, end=self.end)
            except Exception as exc:
                raise classify_fs_error(exc, fetcher.url, self.start) from None
            self._data = memoryview(data)
            if self.end is None:
                self.end = self.start + len(data)
        out = bytes(self._data[self._pos : self._pos + amt])
        self._pos += len(out)
        return out

    def close(self) -> None:
        self._data = None


class FsspecFetcher:
    """One object on an fsspec filesystem.

    Args:
        url: The fsspec URL.
        options: Read options (unused by most filesystems beyond chunking).
    """

    def __init__(self, url: str, *, options: SourceOptions):
        self.url = redact_url(url)
        self.fs, self.path = url_to_fs(url)
        self.options = options

    def size(self) -> int | None:
        try:
            size = self.fs.size(self.path)
        except Exception as exc:
            raise classify_fs_error(exc, self.url, None) from None
        return None if size is None else int(size)

    def open_range(self, start: int, end: int | None) -> _FsResponse:
        return _FsResponse(self, start, end)
