"""Any fsspec URL (``gs://``, ``az://``, ``hf://``, ``memory://``...) as a ranged source or a destination.

The filesystem comes from :func:`fsspec.core.url_to_fs`, configured the way
that fsspec implementation reads its own configuration. Each range is a file
one ``cat_file(path, start, end)`` call; faults other than missing or
forbidden objects are retried like HTTP ones.

The object's size is asked of the filesystem once per opened object (one
``size`` call, remembered) and stated with every range, as an HTTP answer's
``Content-Range`` states it: so a manifest size that disagrees is refused at
open, as for local, HTTP and S3 objects, and so is an object longer than
``read_all(max_bytes=...)`` allows, before its bytes are fetched.
"""

from __future__ import annotations

from typing import Any

from shardkit.errors import RemoteError, UsageError
from shardkit.io.atomic import TMP_SUFFIX
from shardkit.io.ranged import fatal_status, make_backoff
from shardkit.io.retry import TransientFault, call_with_retry
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
        raise UsageError(f"{redact_url(url)}: no filesystem for this URL scheme ({exc})") from exc


#: Errors of libraries shardkit does not import (huggingface_hub...), known by
#: class name, that no retry fixes: status for the message, and what to do.
_FATAL_BY_NAME = {
    "OfflineModeIsEnabled": (
        None,
        "Hugging Face offline mode is on (HF_HUB_OFFLINE=1), so nothing can be fetched; unset "
        "HF_HUB_OFFLINE or read a local copy",
    ),
    "RepositoryNotFoundError": (404, "no such repository, or it is private; check the name and your token"),
    "GatedRepoError": (403, "the repository is gated; accept its terms on the Hub and log in"),
    "RevisionNotFoundError": (404, "no such revision; check the branch, tag or commit"),
    "EntryNotFoundError": (404, "no such file in the repository; check the path"),
    "LocalEntryNotFoundError": (404, "the file is not in the local cache and cannot be fetched now"),
}


def _fatal_status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (aiohttp's ``status``, requests'
    ``response.status_code``), when it is one that no retry fixes."""
    status = getattr(exc, "status", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int) and status in (401, 403, 404, 410):
        return status
    return None


def classify_fs_error(exc: BaseException, url: str, offset: int | None) -> BaseException:
    """Map an exception from an fsspec filesystem to a fault or an error.

    Missing, forbidden or unauthorized objects, Hugging Face offline mode and
    the Hub's not-found errors are :class:`~shardkit.errors.RemoteError` at
    once; other ``OSError`` (timeouts, dropped connections) are transient.
    """
    for cls in type(exc).__mro__:
        known = _FATAL_BY_NAME.get(cls.__name__)
        if known is not None:
            status, hint = known
            where = "" if offset is None else f" at byte {offset}"
            return RemoteError(f"{url}: {cls.__name__}{where}: {hint}", url=url, offset=offset, status=status)
    status = _fatal_status_of(exc)
    if status is not None:
        return fatal_status(url, status, type(exc).__name__, offset=offset)
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
    """Bytes ``[start, end)`` of an object, fetched with ``cat_file``.

    ``cat_file`` is the one ranged read every fsspec filesystem has, it is
    safe to call from several threads, and the async filesystems implement
    it natively. A range with an end (at most ``part_bytes`` long when read
    by :mod:`shardkit.io.ranged`, so within the read-ahead budget) is one
    call. A range to the end of the object
    is fetched in parts of ``part_bytes``, the next one when the previous is
    consumed, so a reader that stops early (a size cap) never fetches the
    rest. An answer shorter than asked means the object ends there, which
    ``total`` then states (so a range past the end is an error at once, not
    a dropped connection retried).

    Where the filesystem states the object's size, ``total`` is that size
    from the start and nothing is fetched until the first :meth:`read`: the
    caller checks ``total`` (against the manifest, against a size cap) first.
    """

    def __init__(self, fetcher: FsspecFetcher, start: int, end: int | None):
        self._fetcher = fetcher
        self.start = start
        self.end = end
        self.total: int | None = fetcher.size()
        self._next = start  # the first byte not fetched yet
        self._data = memoryview(b"")
        self._pos = 0
        self._fetched = False
        if self.total is None:
            self._fetch()  # a short answer is then how the object's end is learnt, at open

    def _fetch(self) -> None:
        fetcher = self._fetcher
        self._fetched = True
        stop = self.end if self.end is not None else self._next + fetcher.options.part_bytes
        if self.total is not None:
            stop = min(stop, self.total)
        if stop <= self._next:  # nothing left to ask for
            self._data, self._pos = memoryview(b""), 0
            return
        try:
            data = fetcher.fs.cat_file(fetcher.path, start=self._next, end=stop)
        except Exception as exc:
            raise classify_fs_error(exc, fetcher.url, self._next) from exc
        if len(data) < stop - self._next:
            self.total = self._next + len(data)
        self._next += len(data)
        self._data, self._pos = memoryview(data), 0

    def read(self, amt: int) -> bytes:
        if not self._fetched or (
            self._pos == len(self._data) and self.end is None and (self.total is None or self._next < self.total)
        ):
            self._fetch()
        out = bytes(self._data[self._pos : self._pos + amt])
        self._pos += len(out)
        return out

    def close(self) -> None:
        self._data = memoryview(b"")


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
        self._size: int | None = None
        self._size_asked = False

    def size(self) -> int | None:
        """The object's size as the filesystem states it (asked once), or None."""
        if not self._size_asked:
            try:
                size = self.fs.size(self.path)
            except Exception as exc:
                raise classify_fs_error(exc, self.url, None) from exc
            self._size = None if size is None else int(size)
            self._size_asked = True
        return self._size

    def open_range(self, start: int, end: int | None) -> _FsResponse:
        return _FsResponse(self, start, end)


#: fsspec protocols whose uploads are atomic (object stores): no temporary name.
ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})


class FsspecDestination:
    """A dataset folder on an fsspec filesystem.

    On object stores an upload appears only once complete; on other
    filesystems it goes to ``NAME.tmp`` and is moved into place. Transient
    faults are retried up to ``options.retry_deadline_s``.

    Args:
        url: The folder's fsspec URL (file names are appended).
        options: Retry deadline and backoff.

    Raises:
        UsageError: fsspec has no filesystem for the scheme.
    """

    local_dir = None

    def __init__(self, url: str, *, options: SourceOptions | None = None):
        self.options = options or SourceOptions()
        self.url = redact_url(url.rstrip("/"))
        self.fs, self.root = url_to_fs(url.rstrip("/"))
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else tuple(self.fs.protocol)
        self.atomic_put = bool(set(protocols) & ATOMIC_PUT_PROTOCOLS)

    def object_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def exists(self, name: str) -> bool:
        return self._retrying(name, lambda: bool(self.fs.exists(f"{self.root}/{name}")))

    def put_file(self, local_path: str, name: str) -> None:
        import os

        if not os.path.isfile(local_path):  # a local problem, never worth retrying
            raise FileNotFoundError(f"{local_path}: file to upload is missing")
        self._retrying(name, lambda: self._publish(name, lambda target: self.fs.put_file(local_path, target)))

    def put_bytes(self, name: str, data: bytes) -> None:
        self._retrying(name, lambda: self._publish(name, lambda target: self.fs.pipe_file(target, data)))

    def _publish(self, name: str, upload: Any) -> None:
        final = f"{self.root}/{name}"
        if self.atomic_put:
            upload(final)
        else:
            upload(final + TMP_SUFFIX)
            self.fs.mv(final + TMP_SUFFIX, final)

    def _retrying(self, name: str, attempt: Any) -> Any:
        url = self.object_url(name)

        def guarded() -> Any:
            try:
                return attempt()
            except (RemoteError, TransientFault):
                raise
            except Exception as exc:
                raise classify_fs_error(exc, url, None) from exc

        return call_with_retry(guarded, make_backoff(url, self.options))
