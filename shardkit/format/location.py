"""Where a manifest may send a reader: inside its dataset, or under a prefix the user allows.

A manifest is data, often data someone else wrote. Its shard and index
locations are therefore resolved by one rule (:func:`resolve_inside`), used
by :meth:`shardkit.format.manifest.Manifest.resolve` and so by every reader:

* an entry is a relative path inside the dataset's base location (the
  manifest's folder or URL prefix): ``shard-000000.tar``, ``train/a.tar``;
* no ``..`` segment (also percent-encoded, ``%2e%2e``, for URLs), no encoded
  ``/`` or ``\\`` inside a segment, no absolute path, no scheme of its own
  (``file://``, ``local://``, ``http://``, ``s3://``, ``pipe:``...): the
  result is the base plus the entry, so it keeps the base's scheme and origin;
* on a local disk, the real path (symlinks followed) must stay under the
  base's real path too: a symlink inside the dataset that leads out of it
  is an escape like ``..``;
* a location outside the dataset is accepted only under one of the
  ``allowed_prefixes`` the user names (``SourceOptions.allowed_prefixes``),
  matched on normalised locations: a prefix ``https://a/x/`` admits
  ``https://a/x/s.tar``, never ``https://a/x/../y`` nor ``https://a/xy``;
* a ``pipe:`` entry is never accepted, whatever the options: a manifest never
  runs a command.

The rule takes one base per dataset. A manifest written by ``shardkit index
SOURCE --out DIR`` keeps its shards elsewhere and declares their base once,
``"shards_base"``: the folder or URL prefix the user indexed. Its shard
entries then resolve under that base by the same checks (its offset indexes
and table still resolve under the manifest's own folder). The declared base
itself is data too, so :func:`check_shards_base` admits only an absolute
local folder or a plain URL prefix (no ``..``, no query, no credentials, no
``pipe:``), and a manifest fetched from a URL may declare only a URL: a
remote manifest never sends a reader to local files. A manifest without the
field keeps the rules above.

A local entry is checked twice: when it is resolved, and again on the file
actually opened. :func:`resolve_inside` returns it as a :class:`ConfinedPath`
(a ``str`` that remembers the real folders it must lie under), and
:func:`open_regular` opens it first and then asks where the descriptor it
got really points (``/proc/self/fd``, or ``fstat`` against the real path
where there is no ``/proc``). A symlink swapped between the two, to lead
out of the dataset, is refused there instead of read.

The module also holds the two other guards for bytes shardkit did not write:
:func:`open_regular` opens a local file only if it is a regular file (never
waiting on a FIFO or a device), and :func:`redact_url`, which strips secrets
from every location put into a message.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import urllib.parse
from collections.abc import Sequence
from typing import BinaryIO

from shardkit.errors import ManifestError, UsageError, redact_url

#: A location with a scheme of its own (RFC 3986: a relative reference whose
#: first segment holds a ``:`` must be written ``./a:b``).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def scheme_of(location: str) -> str | None:
    """The lower-case scheme of ``location`` (``"pipe"`` for ``pipe:CMD``), or None for a path."""
    match = _SCHEME.match(location)
    return None if match is None else match.group(1).lower()


def _is_url(location: str) -> bool:
    return "://" in location and scheme_of(location) not in (None, "file")


def _local(location: str) -> str:
    return location[len("file://") :] if location.lower().startswith("file://") else location


def _url_segments(path: str) -> list[str] | None:
    """The segments of a URL path, without ``.`` and empty ones; None if a
    segment is ``..`` or hides a separator, once percent-decoded."""
    out = []
    for segment in path.split("/"):
        decoded = urllib.parse.unquote(segment)
        if decoded in ("", "."):
            continue
        if decoded == ".." or "/" in decoded or "\\" in decoded or "\0" in decoded:
            return None
        out.append(segment)
    return out


def _normal_url(url: str) -> str | None:
    """``url`` with its scheme and host in lower case and no empty or ``.``
    segments, or None when it has a ``..`` segment (plain or encoded)."""
    parts = urllib.parse.urlsplit(url)
    segments = _url_segments(parts.path)
    if segments is None:
        return None
    path = "/" + "/".join(segments) + ("/" if parts.path.endswith("/") and segments else "")
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def path_under(path: str, root: str) -> bool:
    """Whether normalised local ``path`` is folder ``root`` or lies inside it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def normalise_prefix(prefix: str) -> str:
    """Check and normalise one ``allowed_prefixes`` entry.

    A local prefix is an absolute path (or ``file://`` URL) and comes back
    as a normalised absolute path; a URL prefix comes back with its scheme
    and host in lower case and a trailing ``/`` (a prefix names a folder).

    Raises:
        UsageError: A ``pipe:`` prefix, a relative path, or a ``..`` segment.
    """
    where = f"SourceOptions.allowed_prefixes: {redact_url(prefix)!r}"
    if not isinstance(prefix, str) or not prefix:
        raise UsageError(f"{where} is not a location; name a folder such as '/data/shards/' or 'https://host/prefix/'")
    scheme = scheme_of(prefix)
    if scheme == "pipe":
        raise UsageError(f"{where}: pipe: commands cannot be allowed for manifests; name a folder or URL prefix")
    if _is_url(prefix):
        normal = _normal_url(prefix)
        if normal is None or not urllib.parse.urlsplit(prefix).netloc and scheme in ("http", "https", "s3"):
            raise UsageError(f"{where} is not a plain URL prefix (a '..' segment or no host); write it out in full")
        return normal if normal.endswith("/") else normal + "/"
    path = _local(prefix)
    if not os.path.isabs(path) or ".." in path.split(os.sep):
        raise UsageError(f"{where} must be an absolute path without '..' segments, such as '/data/shards/'")
    return os.path.normpath(path)


class ConfinedPath(str):
    """A local path :func:`resolve_inside` checked, with the real folders
    (``roots``) the file it names must lie under when it is opened:
    :func:`open_regular` checks the opened descriptor against them. It is
    a ``str`` in every other way, so it goes wherever a path goes; a path
    built from it by string operations is a plain ``str`` again."""

    roots: tuple[str, ...]

    def __new__(cls, path: str, roots: Sequence[str]) -> ConfinedPath:
        made = super().__new__(cls, path)
        made.roots = tuple(roots)
        return made

    def __reduce__(self) -> tuple:
        return (ConfinedPath, (str(self), self.roots))


def _local_roots(prefixes: Sequence[str]) -> list[str]:
    """The real paths of the local ``allowed_prefixes``."""
    return [os.path.realpath(p) for p in prefixes if not _is_url(p)]


def _allowed(candidate: str, prefixes: Sequence[str]) -> bool:
    """Whether ``candidate`` (an absolute path or a URL) lies under one of
    the (normalised) ``prefixes``; local paths are compared by real path."""
    if _is_url(candidate):
        normal = _normal_url(candidate)
        if normal is None:
            return False
        return any(_is_url(p) and (normal.startswith(p) or normal == p.rstrip("/")) for p in prefixes)
    real = os.path.realpath(_local(candidate))
    return any(not _is_url(p) and path_under(real, os.path.realpath(p)) for p in prefixes)


def _suggest(target: str) -> str | None:
    """The ``allowed_prefixes`` entry that would admit ``target`` (its folder),
    or None when no prefix can (a ``..`` in a URL, a scheme without ``//``)."""
    if "://" not in target and scheme_of(target) is not None:
        return None
    if _is_url(target):
        if _normal_url(target) is None:
            return None
        parts = urllib.parse.urlsplit(target)
        folder = parts.path.rsplit("/", 1)[0]
        return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{folder}/"
    return os.path.dirname(os.path.normpath(_local(target))).rstrip(os.sep) + os.sep


def _refuse(what: str, entry: str, problem: str, base: str, target: str | None) -> ManifestError:
    prefix = None if target is None else _suggest(target)
    hint = (
        f" If you trust this manifest, allow the location with SourceOptions(allowed_prefixes=({prefix!r},))."
        if prefix is not None
        else ""
    )
    return ManifestError(
        f"{what} {redact_url(entry)!r} {problem}; shards and indexes must lie under the manifest's "
        f"folder ({redact_url(base)}).{hint}",
        path=base,
    )


def resolve_inside(base: str, relative: str, *, allowed_prefixes: Sequence[str] = (), what: str = "path") -> str:
    """Resolve a manifest entry against the dataset's base location, refusing escapes.

    Args:
        base: The dataset's base location: an absolute local folder, or a URL
            prefix (``https://host/data``), without the trailing ``/``.
        relative: The entry as the manifest records it.
        allowed_prefixes: Locations outside the dataset the user trusts
            (see :func:`normalise_prefix`; ``SourceOptions.allowed_prefixes``).
        what: Names the entry in messages, e.g. ``"ds/manifest.json: shard 3 path"``.

    Returns:
        The path or URL to open.

    Raises:
        ManifestError: The entry leaves the dataset and no prefix allows it,
            or it is a ``pipe:`` command, or not a usable path.
    """
    prefixes = [normalise_prefix(p) for p in allowed_prefixes]
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise _refuse(what, str(relative), "is not a usable path", base, None)
    scheme = scheme_of(relative)
    if scheme == "pipe":
        raise ManifestError(
            f"{what} {redact_url(relative)!r} is a pipe: command; a manifest never runs commands, whatever "
            "the options. Remove the entry, or read the dataset's shards by URL.",
            path=base,
        )
    if scheme is not None or relative.startswith("/") or os.path.isabs(relative):
        # A location of its own: allowed only under a prefix the user names.
        target = relative if scheme not in (None, "file") else os.path.normpath(_local(relative))
        if _allowed(relative, prefixes):
            if scheme not in (None, "file"):
                return target
            return ConfinedPath(_local(relative) if scheme == "file" else target, _local_roots(prefixes))
        problem = f"names a location of its own ({scheme}:)" if scheme else "is an absolute path"
        raise _refuse(what, relative, problem + " outside the dataset", base, target)
    if _is_url(base):
        cut = min((i for i in (relative.find("?"), relative.find("#")) if i >= 0), default=len(relative))
        segments = _url_segments(relative[:cut])
        if not segments:
            raise _refuse(what, relative, "leaves the dataset (a '..' or an encoded separator)", base, None)
        return base.rstrip("/") + "/" + "/".join(segments) + relative[cut:]
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        target = os.path.normpath(os.path.join(base, relative))
        if parts and _allowed(target, prefixes):
            return ConfinedPath(target, _local_roots(prefixes))
        raise _refuse(what, relative, "leaves the dataset (a '..' segment)", base, target if parts else None)
    path = os.path.join(base, *parts)
    real_base = _real_folder(base)
    real = _real_inside(real_base, parts)
    if not path_under(real, real_base) and not _allowed(path, prefixes):
        raise _refuse(what, relative, f"is a symlink that leads to {real}, outside the dataset", base, real)
    return ConfinedPath(path, [real_base, *_local_roots(prefixes)])


def check_shards_base(value: object, *, manifest_location: str | None, where: str) -> str:
    """Check a manifest's declared ``shards_base``; return it without a trailing ``/``.

    Args:
        value: The field's value as loaded.
        manifest_location: Where the manifest itself was loaded from (a local
            folder or a URL prefix), or None for one built in memory.
        where: The manifest, for messages.

    Raises:
        ManifestError: Not a string; a relative path; a ``..`` segment; a
            ``pipe:`` or other scheme without ``//``; a URL with credentials,
            a query or a fragment, or without a host; or a local base
            declared by a manifest loaded from a URL.
    """

    def bad(problem: str) -> ManifestError:
        return ManifestError(
            f"{where}: shards_base {redact_url(str(value))[:200]!r} {problem}; it must be the absolute folder or "
            "URL prefix the shards were indexed from. Rerun `shardkit index SOURCE --out DIR` to write it again.",
            path=where,
        )

    if not isinstance(value, str) or not value or "\0" in value:
        raise bad("is not a location")
    scheme = scheme_of(value)
    if scheme == "pipe":
        raise bad("is a pipe: command (a manifest never runs commands)")
    if _is_url(value):
        parts = urllib.parse.urlsplit(value)
        if not parts.netloc or "@" in parts.netloc or parts.query or parts.fragment:
            raise bad("is not a plain URL prefix (a host and a path, no credentials, query or fragment)")
        normal = _normal_url(value)
        if normal is None:
            raise bad("has a '..' segment")
        return value.rstrip("/")
    if scheme not in (None, "file"):
        raise bad(f"names a {scheme}: location without '//'")
    if manifest_location is not None and _is_url(manifest_location):
        raise bad("is a local folder, but the manifest came from a URL (a remote manifest never reads local files)")
    path = _local(value)
    if not os.path.isabs(path) or ".." in path.split(os.sep):
        raise bad("must be an absolute path without '..' segments")
    return os.path.normpath(path)


@functools.lru_cache(maxsize=64)
def _real_folder(base: str) -> str:
    return os.path.realpath(base)


def _real_inside(real_base: str, parts: Sequence[str]) -> str:
    """The real path of ``real_base/parts...`` with one ``lstat`` per part
    (``realpath`` would walk the base's every component again for each shard)."""
    current = real_base
    for i, part in enumerate(parts):
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            return os.path.realpath(os.path.join(candidate, *parts[i + 1 :]))
        current = candidate
    return current


def describe_kind(mode: int) -> str | None:
    """What a file of ``mode`` is, if it is not a regular file."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def _not_regular(path: str, kind: str, what: str) -> ManifestError:
    return ManifestError(
        f"{path}: {what} is {kind}, not a regular file; shardkit reads shards, indexes and manifests only "
        "from regular files. Point the manifest or the reader at the file itself.",
        path=path,
    )


def _opened_path(fd: int, path: str) -> str | None:
    """The real path of the file open as ``fd`` (opened from ``path``), or
    None when it cannot be told (the path now names another file)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the path's real path, if it is still the file we hold
        real = os.path.realpath(path)
        try:
            now = os.stat(real)
        except OSError:
            return None
        held = os.fstat(fd)
        return real if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino) else None


def _check_opened_inside(fd: int, path: ConfinedPath, what: str) -> None:
    """Refuse the open file ``fd`` unless it lies under one of ``path.roots``."""
    real = _opened_path(fd, path)
    if real is not None and any(path_under(real, root) for root in path.roots):
        return
    where = "a file that cannot be told" if real is None else real
    raise ManifestError(
        f"{path}: the {what} opened is {where}, outside the dataset ({path.roots[0] if path.roots else '?'}): "
        "a symlink on its path changed after the manifest entry was checked, to lead out of the dataset. "
        "Nothing was read from it; check who changes links in the dataset folder.",
        path=path,
    )


def open_regular(path: str, *, what: str = "file", buffering: int = -1) -> tuple[BinaryIO, int]:
    """:func:`open_regular_fd` as a file object (``buffering`` as for :func:`open`)."""
    fd, size = open_regular_fd(path, what=what)
    try:
        return os.fdopen(fd, "rb", buffering=buffering), size
    except BaseException:
        os.close(fd)
        raise


def open_regular_fd(path: str, *, what: str = "file") -> tuple[int, int]:
    """Open a local file for reading if it is a regular file, without ever waiting.

    The file is opened with ``O_NONBLOCK`` (a FIFO without a writer would
    otherwise block the open) and checked with ``fstat``. A
    :class:`ConfinedPath` (a manifest entry :func:`resolve_inside` checked)
    is checked once more on the descriptor: the file opened must lie under
    one of its ``roots``, whatever links on the way were changed since.

    Args:
        path: The file.
        what: What the file is for messages (``"shard"``, ``"offset index"``...).

    Returns:
        The open descriptor (the caller closes it) and the file's size in bytes.

    Raises:
        ManifestError: The path names a FIFO, device, socket or directory,
            or (a :class:`ConfinedPath`) the file opened lies outside its roots.
        OSError: The file cannot be opened (missing, no permission...).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):  # a socket
            mode = os.stat(path).st_mode
            raise _not_regular(path, describe_kind(mode) or "not a regular file", what) from None
        raise
    try:
        info = os.fstat(fd)
        kind = describe_kind(info.st_mode)
        if kind is not None:
            raise _not_regular(path, kind, what)
        if isinstance(path, ConfinedPath):
            _check_opened_inside(fd, path, what)
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise


__all__ = [
    "ConfinedPath",
    "check_shards_base",
    "describe_kind",
    "normalise_prefix",
    "open_regular",
    "open_regular_fd",
    "redact_url",
    "resolve_inside",
    "scheme_of",
]
