"""A local cache of whole remote shards, shared by threads, processes and jobs.

Layout of ``cache_dir``::

    <key>.shard        a complete, verified object (the only name readers open)
    <key>.part         a download in progress (only while <key>.lock is held)
    locks/<key>.lock   held by the one process downloading <key>
    locks/evict.lock   held while evicting

``key`` is the SHA-256 of the full URL plus the expected checksum (when the
caller knows it), so two datasets with the same shard basenames never collide
and a shard rewritten under the same URL is a new entry.

Rules that make it safe to share:

* A download is written to ``<key>.part`` under the per-key lock, checked
  against the expected size and SHA-256, fsynced, and renamed to
  ``<key>.shard``. A killed download leaves at most a ``.part`` file, which
  the next downloader of that key overwrites. No partial file is ever
  visible under the final name.
* Only one process downloads a key at a time; others that miss meanwhile
  stream from the remote store directly instead of waiting.
* Readers hold a shared ``flock`` on the ``.shard`` file while they read it;
  eviction takes an exclusive one without blocking and skips files in use.
  So a shard a reader has open is never evicted.
* Eviction removes least recently read entries (by mtime, which every cache
  hit refreshes) until the total is within ``max_bytes``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Iterator

import filelock

from shardkit.errors import CorruptShardError, UsageError
from shardkit.io.base import ByteSource, SourceOptions, check_range, read_capped, short_read, too_large
from shardkit.io.local import pread_up_to
from shardkit.io.urls import redact_url
from shardkit.io.atomic import fsync_dir

logger = logging.getLogger(__name__)

ENTRY_SUFFIX = ".shard"
PART_SUFFIX = ".part"
LOCK_DIR = "locks"


def cache_key(url: str, sha256: str | None = None) -> str:
    """The cache key of an object: hex SHA-256 of its full URL and checksum."""
    return hashlib.sha256(f"{url}\0{sha256 or ''}".encode()).hexdigest()


class CachedFile:
    """A complete cache entry held open with a shared lock (so it is not evicted)."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self.fd = fd
        self.size = os.fstat(fd).st_size

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        end = self.size if end is None else min(end, self.size)
        pos = start
        while pos < end:
            data = os.pread(self.fd, min(chunk_bytes, end - pos), pos)
            if not data:
                return
            pos += len(data)
            yield data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # also drops the shared lock
            self.fd = -1


class CacheWriter:
    """A download into the cache; commit it, or abort it."""

    def __init__(self, cache: ShardCache, key: str, lock: filelock.BaseFileLock):
        self.cache = cache
        self.key = key
        self.final = cache.entry_path(key)
        self.part = os.path.join(cache.root, key + PART_SUFFIX)
        self._lock = lock
        self._file = open(self.part, "wb")
        self._digest = hashlib.sha256()
        self.num_bytes = 0

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._digest.update(data)
        self.num_bytes += len(data)

    def commit(self, *, url: str, expected_size: int | None, expected_sha256: str | None) -> None:
        """Check the download and publish it under its final name.

        Raises:
            CorruptShardError: Size or checksum differ from what was expected
                (nothing is published).
        """
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            problem = None
            if expected_size is not None and self.num_bytes != expected_size:
                problem = f"{self.num_bytes} bytes arrived but the manifest says {expected_size}"
            elif expected_sha256 is not None and self._digest.hexdigest() != expected_sha256.lower():
                problem = f"the bytes have sha256 {self._digest.hexdigest()} but the manifest says {expected_sha256}"
            if problem is not None:
                os.unlink(self.part)
                raise CorruptShardError(
                    f"{redact_url(url)}: {problem}; the object changed after the manifest was written. "
                    "Re-upload the dataset or rewrite it.",
                    path=redact_url(url),
                )
            os.replace(self.part, self.final)
            fsync_dir(self.cache.root)
        finally:
            self._lock.release()
        logger.debug("cached %s as %s (%d bytes)", redact_url(url), self.final, self.num_bytes)
        self.cache.evict()

    def abort(self) -> None:
        """Drop the download (the consumer stopped early, or it failed)."""
        try:
            self._file.close()
            os.unlink(self.part)
        except OSError:
            pass
        finally:
            self._lock.release()


class ShardCache:
    """The cache directory.

    Args:
        root: Cache directory (created if missing).
        max_bytes: Size limit for complete entries, or None for no limit.
    """

    def __init__(self, root: str, *, max_bytes: int | None = None):
        if max_bytes is not None and max_bytes < 0:
            raise UsageError(f"cache size limit must be >= 0, got {max_bytes}")
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        os.makedirs(os.path.join(self.root, LOCK_DIR), exist_ok=True)

    def entry_path(self, key: str) -> str:
        return os.path.join(self.root, key + ENTRY_SUFFIX)

    def _lock(self, name: str) -> filelock.BaseFileLock:
        return filelock.FileLock(os.path.join(self.root, LOCK_DIR, name + ".lock"))

    def open(self, key: str) -> CachedFile | None:
        """Open a complete entry for reading (and mark it recently used), or None."""
        path = self.entry_path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            os.utime(fd)
        except OSError:
            pass  # a read-only cache still serves hits
        return CachedFile(path, fd)

    def begin(self, key: str, *, size: int | None) -> CacheWriter | None:
        """Start downloading ``key``, or None if another process is at it,
        it is already complete, or it cannot fit under the limit."""
        if self.max_bytes is not None and size is not None and size > self.max_bytes:
            return None
        lock = self._lock(key)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            return None
        if os.path.exists(self.entry_path(key)):
            lock.release()
            return None
        if size is not None:
            self.evict(reserve_bytes=size)  # make room first, so the cache stays within its limit
        try:
            return CacheWriter(self, key, lock)
        except OSError as exc:
            lock.release()
            logger.warning("cache %s not writable (%s); reading without it", self.root, exc.strerror)
            return None

    def entries(self) -> list[tuple[float, int, str]]:
        """Complete entries as ``(mtime, size, path)``, least recently used first."""
        out = []
        for name in os.listdir(self.root):
            if name.endswith(ENTRY_SUFFIX):
                path = os.path.join(self.root, name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime, st.st_size, path))
        return sorted(out)

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def evict(self, *, reserve_bytes: int = 0) -> None:
        """Remove least recently used entries until within ``max_bytes``
        (with room for ``reserve_bytes`` more); entries held open by a reader
        are kept."""
        if self.max_bytes is None:
            return
        limit = self.max_bytes - reserve_bytes
        with self._lock("evict"):
            entries = self.entries()
            total = sum(size for _, size, _ in entries)
            for _, size, path in entries:
                if total <= limit:
                    break
                if _remove_unless_open(path):
                    total -= size
                    logger.debug("evicted %s (%d bytes)", path, size)
            if total > limit:
                logger.info("cache %s holds %d bytes over its limit: entries in use", self.root, total - limit)


def _remove_unless_open(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                return False
            raise
        os.unlink(path)
        return True
    finally:
        os.close(fd)


class CachedSource:
    """A remote source read through a :class:`ShardCache`.

    A range starting at byte 0 of an uncached object is streamed to the
    caller and written to the cache at the same time (the rest of the object
    after the range is fetched too, so the entry is whole). Other ranges of
    an uncached object go straight to the remote source. Cached objects are
    read from local disk.

    A random read (:meth:`read_at`) of an uncached object is one ranged
    request, and starts fetching the whole object into the cache in a
    background thread (at most :data:`MAX_BACKGROUND_FILLS` per process), so
    that later reads of it are ``pread`` s of the cached file.

    Args:
        url: The full URL (part of the cache key).
        remote: The uncached source.
        cache: The cache.
        expected_size: Object size from the manifest, if known.
        expected_sha256: Object checksum from the manifest, if known.
        options: Read options (chunk size).
    """

    def __init__(
        self,
        url: str,
        remote: ByteSource,
        *,
        cache: ShardCache,
        expected_size: int | None = None,
        expected_sha256: str | None = None,
        options: SourceOptions,
    ):
        self.url = remote.url
        self._full_url = url
        self.remote = remote
        self.cache = cache
        self.expected_size = expected_size
        self.expected_sha256 = expected_sha256
        self.options = options
        self.key = cache_key(url, expected_sha256)

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        """Yield bytes ``[start, end)``, from the cache when possible."""
        hit = self.cache.open(self.key)
        writer = None
        if hit is None and start == 0:
            writer = self.cache.begin(self.key, size=self.expected_size)
            if writer is None:
                hit = self.cache.open(self.key)  # another process may have just finished it
        if hit is not None:
            try:
                yield from hit.iter_range(start, end, chunk_bytes=chunk_bytes)
            finally:
                hit.close()
            return
        if writer is None:
            yield from self.remote.iter_range(start, end, chunk_bytes=chunk_bytes)
            return
        try:
            for chunk in self.remote.iter_range(0, end, chunk_bytes=chunk_bytes):
                writer = self._write(writer, chunk)
                yield chunk
            if end is not None and writer is not None:
                # The caller wanted a prefix (e.g. up to the end marker): fetch
                # the rest so the cached entry is the whole object.
                for chunk in self.remote.iter_range(end, self.expected_size, chunk_bytes=chunk_bytes):
                    writer = self._write(writer, chunk)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if writer is not None:
            try:
                writer.commit(
                    url=self._full_url, expected_size=self.expected_size, expected_sha256=self.expected_sha256
                )
            except OSError as exc:
                logger.warning(
                    "cache %s: could not store %s (%s); reading on without it", self.cache.root, self.url, exc
                )

    def _write(self, writer: CacheWriter | None, chunk: bytes) -> CacheWriter | None:
        # A full or failing cache disk must not fail the read: drop the entry.
        if writer is None:
            return None
        try:
            writer.write(chunk)
            return writer
        except OSError as exc:
            logger.warning("cache %s: could not store %s (%s); reading on without it", self.cache.root, self.url, exc)
            writer.abort()
            return None

    def read_all(self, *, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            return b"".join(self.iter_range(0, None, chunk_bytes=self.options.chunk_bytes))
        hit = self.cache.open(self.key)
        if hit is None:  # an object with a size cap is small: fetched, not cached
            return self.remote.read_all(max_bytes=max_bytes)
        try:
            if hit.size > max_bytes:
                raise too_large(self.url, max_bytes)
            return read_capped(self.url, hit.iter_range(0, None, chunk_bytes=self.options.chunk_bytes), max_bytes)
        finally:
            hit.close()

    def read_at(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)``: from the cached copy when there is
        one; else with a ranged request, while the whole object is fetched
        into the cache in the background."""
        check_range(self.url, offset, size, self.expected_size)
        hit = self.cache.open(self.key)
        if hit is None:
            _background_fills().start(self)
            return self.remote.read_at(offset, size)
        try:
            data = pread_up_to(hit.fd, offset, size)
        finally:
            hit.close()
        if len(data) != size:  # an entry is complete: it is the object, and the object is shorter
            raise short_read(self.url, offset, size, hit.size)
        return data

    def close(self) -> None:
        self.remote.close()


#: Whole-object downloads one process runs in the background at once.
MAX_BACKGROUND_FILLS = 2


class _BackgroundFills:
    """Whole-object downloads into the cache, in background threads.

    At most ``limit`` run at a time per process; an object another process
    is fetching is left to it, and one that failed is tried again on a later
    read (its samples are read with ranged requests meanwhile).
    """

    def __init__(self, *, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._started: set[str] = set()
        self._active = 0

    def start(self, source: CachedSource) -> None:
        with self._lock:
            if source.key in self._started or self._active >= self.limit:
                return
            self._started.add(source.key)
            self._active += 1
        threading.Thread(target=self._fill, args=(source,), name="shardkit-cache-fill", daemon=True).start()

    def _fill(self, source: CachedSource) -> None:
        try:
            writer = source.cache.begin(source.key, size=source.expected_size)
            if writer is None:
                return  # cached already, or another process is fetching it
            try:
                for chunk in source.remote.iter_range(0, None, chunk_bytes=source.options.chunk_bytes):
                    writer.write(chunk)
            except BaseException:
                writer.abort()
                raise
            writer.commit(url=source._full_url, expected_size=source.expected_size, expected_sha256=source.expected_sha256)
        except Exception as exc:
            logger.warning("could not cache %s: %s", source.url, exc)
            with self._lock:
                self._started.discard(source.key)  # try again on a later read
        finally:
            with self._lock:
                self._active -= 1


_fills: dict[int, _BackgroundFills] = {}
_fills_lock = threading.Lock()


def _background_fills() -> _BackgroundFills:
    """This process's fills (a forked child starts its own: the parent's threads are not in it)."""
    with _fills_lock:
        fills = _fills.get(os.getpid())
        if fills is None:
            fills = _fills[os.getpid()] = _BackgroundFills(limit=MAX_BACKGROUND_FILLS)
        return fills
