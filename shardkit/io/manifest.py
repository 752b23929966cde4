"""Load a dataset's manifest from wherever it is stored."""

from __future__ import annotations

from shardkit.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, local_path


def remote_manifest(url: str, options: SourceOptions) -> Manifest:
    """Load the manifest at ``url`` (a ``manifest.json`` URL)."""
    text = open_source(url, options=options).read_all()
    return Manifest.from_json(text, location=url.rsplit("/", 1)[0])


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
