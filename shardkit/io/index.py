"""Load a shard's offset index from wherever it is stored, checked: the one loader.

Every reader (the streaming reader, :class:`~shardkit.IndexedDataset`,
``shardkit verify``, the Ray datasource) loads indexes here, so an index
fault is the same :class:`~shardkit.errors.CorruptShardError` whoever finds
it, naming the ``.idx`` file, what is wrong and what to do (see
:func:`shardkit.format.index.corrupt_index`).
"""

from __future__ import annotations

import os

import numpy as np

from shardkit.errors import CorruptShardError
from shardkit.format.index import (
    IndexLayout,
    OffsetIndex,
    check_bounds,
    corrupt_index,
    decode_offset_index,
    load_offset_index,
    max_index_bytes,
    read_document_tokens,
    read_index_file,
    too_long,
)
from shardkit.format.location import open_regular_fd
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, local_path, redact_url


def fetch_offset_index(
    url: str,
    *,
    num_samples: int | None = None,
    shard_bytes: int | None = None,
    options: SourceOptions | None = None,
) -> OffsetIndex:
    """A shard's offset index, checked before anything trusts it.

    A local index is memory-mapped (DataLoader workers share its pages); a
    remote one is fetched in one request. With ``num_samples`` known, an
    index longer than any index of that many samples
    (:func:`~shardkit.format.index.max_index_bytes`) is refused before it is
    read whole. The boundaries are then checked
    (:func:`~shardkit.format.index.check_bounds`): they list
    ``num_samples`` samples, start at 0, rise by whole tar blocks and, with
    ``shard_bytes``, leave the end marker inside the shard.

    Args:
        url: The ``.idx`` path or URL.
        num_samples: The shard's sample count from the manifest, or None.
        shard_bytes: The shard's size in bytes from the manifest, or None.
        options: How to read a remote index.

    Returns:
        Its boundaries and, when it stores them, per-sample checksums.

    Raises:
        CorruptShardError: The index is missing (locally), truncated, too
            long, malformed, or disagrees with the manifest; naming the
            file, what is wrong and what to do.
        ManifestError: The local path is not a regular file.
        RemoteError: A remote index could not be fetched.
    """
    path = redact_url(url)
    max_bytes = None if num_samples is None else max_index_bytes(num_samples)
    if is_local(url):
        index = load_offset_index(local_path(url), max_bytes=max_bytes)
    else:
        index = decode_offset_index(_fetch_remote(url, path, max_bytes=max_bytes, options=options), path=path)
    check_bounds(index.bounds, path=path, num_samples=num_samples, shard_bytes=shard_bytes)
    return index


def open_local_index(path: str, *, num_samples: int, shard_bytes: int | None = None) -> tuple[int, IndexLayout]:
    """A local index file, open and checked whole (as :func:`fetch_offset_index`
    checks one), for reading single entries at :class:`IndexLayout`'s offsets
    with ``pread``: what a random reader holds per shard, no mapping and no
    copy of the boundaries.

    Returns:
        The open descriptor (the caller closes it) and the arrays' offsets.

    Raises:
        CorruptShardError: As :func:`fetch_offset_index`.
        ManifestError: The path is not a regular file.
    """
    fd, size = _open_local(path)
    try:
        bounds, layout = read_index_file(fd, size, path=path, max_bytes=max_index_bytes(num_samples))
        check_bounds(bounds, path=path, num_samples=num_samples, shard_bytes=shard_bytes)
    except BaseException:
        os.close(fd)
        raise
    return fd, layout


def fetch_document_tokens(
    url: str,
    *,
    num_samples: int,
    totals: np.ndarray,
    options: SourceOptions | None = None,
    removed: np.ndarray | None = None,
    check_totals: bool = True,
) -> np.ndarray:
    """A shard's per-sample token counts, from the third array of its offset
    index, checked before anything trusts them
    (:func:`~shardkit.format.index.read_document_tokens`: their shape,
    dtype and place in the file, and that they add up to the table's totals).

    A local index is read with ``pread`` (its headers, then the counts
    alone); a remote one is fetched in one request, refused when longer than
    an index of ``num_samples`` samples and ``len(totals)`` token fields
    (:func:`~shardkit.format.index.max_index_bytes`) before it is read whole.

    Args:
        url: The ``.idx`` path or URL.
        num_samples: The shard's sample count (the table's).
        totals: The shard's token total per recorded field (the table's), in column order.
        options: How to read a remote index.
        removed: Stored positions of samples removed from the shard (see
            :mod:`shardkit.format.removed`): their counts are left out, and
            ``totals`` are those of the samples kept.
        check_totals: Whether the counts must add up to ``totals`` (see
            :func:`~shardkit.format.index.read_document_tokens`).

    Returns:
        An int64 array of shape ``(num_samples - len(removed), len(totals))``.

    Raises:
        CorruptShardError: The index is missing (locally), too long, or its
            counts are absent, malformed or disagree with the table; naming
            the file, what is wrong and what to do.
        ManifestError: The local path is not a regular file.
        RemoteError: A remote index could not be fetched.
    """
    path = redact_url(url)
    max_bytes = max_index_bytes(num_samples, len(totals))
    if is_local(url):
        fd, size = _open_local(local_path(url), name=path)
        try:
            return read_document_tokens(
                lambda at, n: os.pread(fd, n, at), size, path=path, num_samples=num_samples, totals=totals,
                removed=removed, check_totals=check_totals,
            )
        finally:
            os.close(fd)
    data = _fetch_remote(url, path, max_bytes=max_bytes, options=options)
    view = memoryview(data)
    return read_document_tokens(
        lambda at, n: bytes(view[at : at + n]), len(data), path=path, num_samples=num_samples, totals=totals,
        removed=removed, check_totals=check_totals,
    )


def _open_local(path: str, *, name: str | None = None) -> tuple[int, int]:
    """A local index file open for reading, and its size; a missing one is a
    :class:`CorruptShardError` naming it (``name``, default ``path``)."""
    try:
        return open_regular_fd(path, what="offset index")
    except FileNotFoundError:
        raise corrupt_index(path if name is None else name, "the file is missing") from None


def _fetch_remote(url: str, path: str, *, max_bytes: int | None, options: SourceOptions | None) -> bytes:
    """A remote index's bytes in one request, refused past ``max_bytes``
    (named ``path``, the URL without credentials)."""
    try:
        return open_source(url, options=options).read_all(max_bytes=max_bytes)
    except CorruptShardError:  # with no expected size, only a too-long object is
        assert max_bytes is not None
        raise too_long(path, max_bytes) from None


__all__ = ["fetch_document_tokens", "fetch_offset_index", "open_local_index"]
