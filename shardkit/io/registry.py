"""One place that maps a URL to the backend that reads it, or writes it.

Reading (:func:`open_source`):

=====================  ==========================================================
``/path``, ``file://``  :class:`~shardkit.io.local.LocalFile`
``http://``, ``https://``  ranged GETs with urllib3 (:mod:`shardkit.io.http`)
``s3://bucket/key``    as http(s), presigned by botocore (:mod:`shardkit.io.s3`)
other ``scheme://``    any fsspec filesystem (:mod:`shardkit.io.fsspec`)
``pipe:CMD``           a command's stdout, only with ``allow_pipe=True``
                       (:mod:`shardkit.io.pipe`)
=====================  ==========================================================

Writing (:func:`open_destination`): a local path or ``file://`` URL is a
:class:`~shardkit.io.local.LocalDestination`, ``s3://`` an
:class:`~shardkit.io.s3.S3Destination`, any other ``scheme://`` an
:class:`~shardkit.io.fsspec.FsspecDestination`; ``pipe:`` and ``http(s)://``
cannot be written to.

Backends are imported when a URL of theirs is first opened, so reading local
files never imports urllib3, boto3 or fsspec.
"""

from __future__ import annotations

from shardkit.errors import UsageError
from shardkit.io.base import ByteSource, Destination, SourceOptions
from shardkit.io.local import LocalDestination, LocalFile
from shardkit.io.urls import is_local, redact_url, url_scheme


def open_remote(url: str, *, options: SourceOptions, expected_size: int | None = None) -> ByteSource:
    """Open a non-local URL without the cache (see :func:`open_source`).

    Raises:
        UsageError: No backend for the URL scheme, or ``pipe:`` without
            ``allow_pipe``.
    """
    scheme = url_scheme(url)
    if scheme == "pipe":
        if not options.allow_pipe:
            raise UsageError(
                "pipe: URLs run a command and are off by default; pass SourceOptions(allow_pipe=True) to allow them"
            )
        from shardkit.io.pipe import PipeSource

        return PipeSource(url)
    from shardkit.io.ranged import RangedObject

    if scheme in ("http", "https"):
        from shardkit.io.http import HttpFetcher

        return RangedObject(HttpFetcher(url, options=options), options=options, expected_size=expected_size)
    if scheme == "s3":
        from shardkit.io.s3 import S3Fetcher

        return RangedObject(S3Fetcher(url, options=options), options=options, expected_size=expected_size)
    from shardkit.io.fsspec import FsspecFetcher

    return RangedObject(FsspecFetcher(url, options=options), options=options, expected_size=expected_size)


def prepare_reading(url: str, *, options: SourceOptions) -> None:
    """Make now, once for this process, what reading URLs like ``url`` needs
    per process, so that DataLoader workers forked afterwards inherit it
    instead of each making it: for ``s3://``, the client that presigns its
    reads (botocore imported, credentials looked up; see
    :func:`shardkit.io.s3.s3_signer`). Nothing for other schemes: their
    connection pools belong to the process that uses them.

    Raises:
        RemoteError: ``s3://`` without boto3 installed.
    """
    if url_scheme(url) == "s3":
        from shardkit.io.s3 import s3_signer

        s3_signer(options)


def _cacheable(url: str, expected_sha256: str | None) -> bool:
    # Objects with a known checksum are cached under a key that includes it,
    # so they can never be served stale. Without one, only shards (``.tar``)
    # are cached, trusted by URL; manifests and indexes are small and are
    # what tells a reader that a dataset was rewritten, so they always come
    # from the store.
    if url_scheme(url) == "pipe":
        return False
    return expected_sha256 is not None or url.split("?", 1)[0].endswith(".tar")


def open_source(
    url: str,
    *,
    options: SourceOptions | None = None,
    expected_size: int | None = None,
    expected_sha256: str | None = None,
) -> ByteSource:
    """Open a path or URL for reading.

    Args:
        url: Local path, ``file://``, ``http(s)://``, ``s3://``, any fsspec
            URL, or ``pipe:CMD`` (with ``options.allow_pipe``).
        options: Timeouts, retries, concurrency, cache; defaults if None.
        expected_size: Object size in bytes if known (the manifest's
            ``num_bytes``): saves a request, and is checked against the
            object's actual size (a local file's ``fstat``, a remote
            answer's ``Content-Range`` total) on every open, and before caching.
        expected_sha256: Hex SHA-256 if known (the manifest's ``sha256``):
            a cached copy is kept only if it matches, and the checksum is
            part of the cache key, so a shard rewritten under the same URL is
            never served stale. Without it only ``.tar`` objects are cached,
            trusted by URL.

    Raises:
        UsageError: The URL scheme is not supported or not allowed.
    """
    options = options or SourceOptions()
    if is_local(url):
        return LocalFile(url, expected_size=expected_size)
    source = open_remote(url, options=options, expected_size=expected_size)
    if options.cache_dir is not None and _cacheable(url, expected_sha256):
        from shardkit.io.cache import CachedSource, ShardCache

        cache = ShardCache(options.cache_dir, max_bytes=options.cache_max_bytes)
        return CachedSource(
            url, source, cache=cache, expected_size=expected_size, expected_sha256=expected_sha256, options=options
        )
    return source


def open_destination(url: str, *, options: SourceOptions | None = None) -> Destination:
    """Open a dataset folder for writing.

    Args:
        url: Local path, ``file://``, ``s3://bucket/prefix`` or another fsspec
            URL of the folder.
        options: Timeouts, retries, S3 endpoint and region; defaults if None.

    Returns:
        The folder's :class:`~shardkit.io.base.Destination`; its
        ``local_dir`` is set for local folders.

    Raises:
        UsageError: The scheme cannot be written to (``pipe:``, ``http(s)://``)
            or fsspec has no filesystem for it.
    """
    options = options or SourceOptions()
    if is_local(url):
        return LocalDestination(url)
    scheme = url_scheme(url)
    if scheme in ("pipe", "http", "https"):
        raise UsageError(
            f"{redact_url(url)}: cannot write to {scheme}: URLs; write to a directory, s3:// or another fsspec URL"
        )
    if scheme == "s3":
        from shardkit.io.s3 import S3Destination

        return S3Destination(url, options=options)
    from shardkit.io.fsspec import FsspecDestination

    return FsspecDestination(url, options=options)
