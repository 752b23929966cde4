"""Load a dataset's manifest from wherever it is stored."""

from __future__ import annotations

from shardkit.format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, load_manifest
from shardkit.io.base import SourceOptions
from shardkit.io.ranged import RangedObject, stream_range
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, local_path, redact_url


def _read_limited(url: str, options: SourceOptions, limit: int) -> bytes:
    """The object at ``url``, or its first ``limit + 1`` bytes when it is longer
    (read in one streamed request, never held whole past the limit)."""
    source = open_source(url, options=options)
    if isinstance(source, RangedObject):  # one request, no size request first
        chunks = stream_range(source.fetcher, 0, None, options=options, chunk_bytes=options.chunk_bytes)
    else:
        chunks = source.iter_range(0, None, chunk_bytes=options.chunk_bytes)
    out: list[bytes] = []
    held = 0
    try:
        for chunk in chunks:
            out.append(chunk)
            held += len(chunk)
            if held > limit:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return b"".join(out)


def remote_manifest(url: str, options: SourceOptions) -> Manifest:
    """Load the manifest at ``url`` (a ``manifest.json`` URL).

    Raises:
        ManifestError: The manifest is larger than
            :data:`~shardkit.format.manifest.MAX_MANIFEST_BYTES`, or invalid.
    """
    text = _read_limited(url, options, MAX_MANIFEST_BYTES)
    return Manifest.from_json(text, location=url.rsplit("/", 1)[0], origin=redact_url(url))


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
    url = location if location.endswith(".json") else location.rstrip("/") + "/" + MANIFEST_NAME
    return remote_manifest(url, options or SourceOptions())
