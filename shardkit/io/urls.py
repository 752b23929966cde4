"""URL helpers shared by the remote sources: scheme checks and redaction.

A URL may carry secrets: a presigned query string, ``user:password@`` in the
authority. Everything shardkit logs or puts into an error message goes
through :func:`redact_url` first (:func:`redact_text` for free text that may
hold URLs). Both live in :mod:`shardkit.errors`, the ground floor, so that
every error message is redacted too; they are re-exported here.
"""

from __future__ import annotations

import urllib.parse

from shardkit.errors import redact_text, redact_url


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


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its ``user:password@``, and the percent-decoded user
    and password (None when absent).

    >>> split_userinfo("https://al%40ice:p%3Aw@host:8080/a.tar?x=1")
    ('https://host:8080/a.tar?x=1', 'al@ice', 'p:w')
    """
    parts = urllib.parse.urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url, None, None
    user, colon, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, urllib.parse.unquote(user), urllib.parse.unquote(password) if colon else None


def url_origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of ``url``, the port filled in for http(s)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


__all__ = ["is_local", "local_path", "redact_text", "redact_url", "split_userinfo", "url_origin", "url_scheme"]
