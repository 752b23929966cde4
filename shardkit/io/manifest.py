"""Load a dataset's manifest, and its shard table, from wherever they are stored.

A remote format-2 dataset's table is fetched once per machine: downloaded
(at most the size the manifest states), checked against the manifest's
SHA-256, renamed into ``<cache>/tables/<sha256>.table`` and memory-mapped
from there; every later process (DataLoader workers, other ranks, other
jobs) maps the same cached file. The cache is the reader's ``cache_dir``, or
a per-user folder under the system's temporary directory without one.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from shardkit.errors import CorruptShardError, ManifestError, RemoteError
from shardkit.format.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    TableOpener,
    load_manifest,
    no_manifest_error,
    table_location,
)
from shardkit.format.table import TABLE_ADVICE, Naming, ShardTable, open_table
from shardkit.io.atomic import TMP_SUFFIX, commit
from shardkit.io.base import SourceOptions, close_iterator, read_capped
from shardkit.io.ranged import RangedObject, stream_range
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, local_path, redact_url

TABLE_CACHE_DIR = "tables"


def _chunks(url: str, options: SourceOptions):  # type: ignore[no-untyped-def]
    source = open_source(url, options=options)
    if isinstance(source, RangedObject):  # one request, no size request first
        return stream_range(source.fetcher, 0, None, options=options, chunk_bytes=options.chunk_bytes)
    return source.iter_range(0, None, chunk_bytes=options.chunk_bytes)


def _read_limited(url: str, options: SourceOptions, limit: int) -> bytes:
    """The object at ``url``, read in one streamed request and never held
    whole past ``limit`` bytes.

    Raises:
        ManifestError: It holds more than ``limit`` bytes.
    """
    try:
        return read_capped(redact_url(url), _chunks(url, options), limit)
    except CorruptShardError:
        raise ManifestError(
            f"{redact_url(url)}: more than {limit} bytes, more than a manifest may hold; not a shardkit "
            "manifest (a damaged or hostile file). Point the reader at the dataset's own manifest.json.",
            path=redact_url(url),
        ) from None


def machine_cache_root(options: SourceOptions) -> str:
    """This machine's folder for what shardkit keeps between runs (fetched
    tables, remote indexes' journals): ``cache_dir``, else one of this user's
    in the temporary folder."""
    return options.cache_dir or os.path.join(tempfile.gettempdir(), f"shardkit-{os.getuid()}")


def table_cache_dir(options: SourceOptions) -> str:
    """Where fetched shard tables are kept on this machine."""
    return os.path.join(machine_cache_root(options), TABLE_CACHE_DIR)


def remote_table_opener(options: SourceOptions) -> TableOpener:
    """Opens a remote manifest's table through the local table cache."""

    def opener(location: str, ref: Mapping[str, Any], naming: Naming | None, where: str) -> ShardTable:
        return fetch_table(table_location(location, ref), ref, naming, options)

    opener.cached_file = functools.partial(cached_file, options=options)  # type: ignore[attr-defined]  # a rows table's
    return opener


def cached_file(url: str, ref: Mapping[str, Any], *, options: SourceOptions) -> str:
    """The local copy of a table file at ``url`` (a derived dataset's rows
    table), downloaded into the table cache unless there (its size and
    SHA-256 are checked by whoever opens it)."""
    cached = os.path.join(table_cache_dir(options), f"{ref['sha256']}.table")
    if not os.path.exists(cached):
        _download(url, cached, ref, options)
    return cached


def fetch_table(url: str, ref: Mapping[str, Any], naming: Naming | None, options: SourceOptions) -> ShardTable:
    """The table at ``url``, from the cache or downloaded into it.

    Raises:
        ManifestError: The download ended short, ran past the stated size or
            has another SHA-256 (naming the URL); nothing is left in the cache.
        RemoteError: The download failed after the usual retries.
    """
    return _cached_table(url, ref, naming, options, check_sha256=True)


def _cached_table(
    url: str, ref: Mapping[str, Any], naming: Naming | None, options: SourceOptions, *, check_sha256: bool
) -> ShardTable:
    """:func:`fetch_table`; a table pickled (to a DataLoader worker, a Ray
    task on another machine) is fetched again the same way, into the
    receiver's cache, checking only the size of a copy already there (its
    SHA-256 was checked when it was stored, and by the sender on opening)."""
    cached = os.path.join(table_cache_dir(options), f"{ref['sha256']}.table")
    downloaded = not os.path.exists(cached)
    if downloaded:
        _download(url, cached, ref, options)
    # A copy found in the cache is checked again, so that a damaged cache
    # file is an error naming it.
    table = open_table(
        cached,
        naming=naming,
        expected_size=ref["num_bytes"],
        expected_sha256=ref["sha256"] if check_sha256 and not downloaded else None,
    )
    table.reopen = functools.partial(_cached_table, url, dict(ref), naming, options, check_sha256=False)
    return table


def _download(url: str, cached: str, ref: Mapping[str, Any], options: SourceOptions) -> None:
    import hashlib

    os.makedirs(os.path.dirname(cached), exist_ok=True)
    expected = ref["num_bytes"]
    name = redact_url(url)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(cached), prefix=os.path.basename(cached) + ".", suffix=TMP_SUFFIX)
    digest = hashlib.sha256()
    held = 0
    try:
        with os.fdopen(fd, "wb") as f:
            chunks = _chunks(url, options)
            try:
                for chunk in chunks:
                    held += len(chunk)
                    if held > expected:
                        raise ManifestError(
                            f"{name}: shard table is longer than the {expected} bytes the manifest states; "
                            f"{TABLE_ADVICE}",
                            path=name,
                        )
                    digest.update(chunk)
                    f.write(chunk)
            except RemoteError as exc:
                raise RemoteError(
                    f"{name}: fetching the shard table failed: {exc}", url=name, status=exc.status, retryable=exc.retryable
                ) from None
            finally:
                close_iterator(chunks)
            if held != expected:
                raise ManifestError(
                    f"{name}: shard table download ended at {held} of {expected} bytes; rerun (a flaky network), "
                    f"or {TABLE_ADVICE}",
                    path=name,
                )
            if digest.hexdigest() != ref["sha256"]:
                raise ManifestError(
                    f"{name}: shard table SHA-256 is not the one the manifest states (damaged or replaced); "
                    f"{TABLE_ADVICE}",
                    path=name,
                )
            f.flush()
            os.fsync(f.fileno())
        commit(tmp, cached)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remote_manifest(url: str, options: SourceOptions) -> Manifest:
    """Load the manifest at ``url`` (a ``manifest.json`` URL), and its table.

    Raises:
        ManifestError: There is none (a 404), or it is larger than
            :data:`~shardkit.format.manifest.MAX_MANIFEST_BYTES`, or invalid,
            or its table cannot be fetched whole.
    """
    try:
        text = _read_limited(url, options, MAX_MANIFEST_BYTES)
    except RemoteError as exc:
        if exc.status != 404:
            raise
        raise no_manifest_error(redact_url(url), redact_url(url.rsplit("/", 1)[0]), remote=True) from None
    return Manifest.from_json(
        text, location=url.rsplit("/", 1)[0], origin=redact_url(url), open_table=remote_table_opener(options)
    )


def manifest_url(location: str) -> str:
    """The ``manifest.json`` URL of a remote dataset folder or manifest URL."""
    return location if location.endswith(".json") else location.rstrip("/") + "/" + MANIFEST_NAME


def fetch_manifest(location: str, *, options: SourceOptions | None = None) -> Manifest:
    """Load a manifest from a local path or a URL.

    Args:
        location: A dataset directory or ``manifest.json``, local (path or
            ``file://``) or remote (a URL of the folder or of the file).
        options: How to read remote manifests.

    Raises:
        ManifestError: Missing or invalid manifest.
    """
    if is_local(location):
        return load_manifest(local_path(location))
    return remote_manifest(manifest_url(location), options or SourceOptions())
