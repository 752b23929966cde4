"""Any fsspec URL (``gs://``, ``az://``, ``hf://``, ``memory://``...) as a ranged source.

The filesystem comes from :func:`fsspec.core.url_to_fs`, configured the way
that fsspec implementation reads its own configuration. Each range is a file
opened, seeked and read in order; faults other than missing or forbidden
objects are retried and resumed like HTTP ones.
"""

from __future__ import annotations

from typing import Any

from shardkit.errors import RemoteError, UsageError
from shardkit.read.ranged import fatal_status
from shardkit.read.retry import TransientFault
from shardkit.read.sources import SourceOptions
from shardkit.read.urls import redact_url

_READ_BYTES = 1 << 20


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
    if isinstance(exc, (OSError, TimeoutError, ConnectionError)):
        return TransientFault(f"{type(exc).__name__}: {exc.strerror or type(exc).__name__}" if isinstance(exc, OSError) else type(exc).__name__)
    return exc


class _FsResponse:
    def __init__(self, handle: Any, start: int, end: int | None, url: str):
        self._handle = handle
        self.start = start
        self.end = end
        self._url = url

    def read(self, amt: int) -> bytes:
        try:
            return self._handle.read(min(amt, _READ_BYTES))
        except Exception as exc:
            raise classify_fs_error(exc, self._url, None) from None

    def close(self) -> None:
        try:
            self._handle.close()
        except Exception:  # closing a broken handle: nothing left to save
            pass


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
        try:
            handle = self.fs.open(self.path, "rb")
            if start:
                handle.seek(start)
        except Exception as exc:
            raise classify_fs_error(exc, self.url, start) from None
        return _FsResponse(handle, start, end, self.url)
