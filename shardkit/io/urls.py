"""URL helpers shared by the remote sources: scheme checks and redaction.

A URL may carry secrets: a presigned query string, ``user:password@`` in the
authority. Everything shardkit logs or puts into an error message goes
through :func:`redact_url` first (kept in :mod:`shardkit.format.location`,
which manifests use too).
"""

from __future__ import annotations

from shardkit.format.location import redact_url


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path (``file://`` included, ``pipe:`` not)."""
    if url.startswith("pipe:"):
        return False
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """The file-system path of a local path or ``file://`` URL."""
    return url[len("file://") :] if url.startswith("file://") else url


def url_scheme(url: str) -> str:
    """The lower-case scheme of ``url`` (``"file"`` for plain paths, ``"pipe"`` for ``pipe:CMD``)."""
    if url.startswith("pipe:"):
        return "pipe"
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


__all__ = ["is_local", "local_path", "redact_url", "url_scheme"]
