"""What the subcommands share: exit codes, text made safe for a terminal,
the ``-v``/``--debug-wire`` flags and the listing of skipped inputs."""

from __future__ import annotations

import argparse
import unicodedata
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from shardkit.config import human_bytes  # noqa: F401 - the commands take it from here
from shardkit.errors import UsageError, redact_text

if TYPE_CHECKING:
    from shardkit.io.base import SourceOptions

#: Invisible characters that reorder or hide the text around them.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


def shown(value: object) -> str:
    """``value`` as text safe for a terminal: URLs redacted, and control
    characters (C0, DEL, C1: ESC, CR, BEL...), bidi overrides and other
    invisible format characters escaped the way ``repr`` does (``\\x1b``,
    ``\\u202e``), backslashes included, so a name from a manifest written by
    someone else can neither drive the terminal nor pass for another."""
    text = redact_text(str(value))
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"):
            out.append(ascii(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)


_VERBOSE_HELP = "log shardkit's debug details; tracebacks on errors (no wire logs: see --debug-wire)"
_DEBUG_WIRE_HELP = (
    "also log the HTTP and S3 wire traffic (urllib3, botocore, boto3, s3transfer) at debug level. "
    "WARNING: these logs contain credentials (AWS access key ids, session tokens, signed headers "
    "and URLs); never share them"
)


S3_ANONYMOUS_HELP = (
    "read s3:// URLs unsigned, without credentials, as public buckets allow (the AWS CLI's --no-sign-request)"
)


def whole_number(flag: str, text: str, low: int) -> int:
    """``text``, the value of ``flag``, as a whole number of at least ``low``."""
    if not text.isdigit() or int(text) < low:
        raise UsageError(f"{flag} must be a whole number of at least {low}, not {text!r}")
    return int(text)


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`~shardkit.io.base.SourceOptions` a reading command takes."""
    parser.add_argument("--s3-anonymous", action="store_true", help=S3_ANONYMOUS_HELP)


def source_options(args: argparse.Namespace, **fields: Any) -> SourceOptions:
    """The :class:`~shardkit.io.base.SourceOptions` of :func:`add_source_options`' flags, and ``fields``."""
    from shardkit.io.base import SourceOptions

    return SourceOptions(s3_anonymous=args.s3_anonymous, **fields)


def add_verbose(parser: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    # Also after the subcommand (`shardkit write SRC DEST -v`); SUPPRESS keeps
    # a `shardkit -v write ...` given before it.
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help=_VERBOSE_HELP)
    parser.add_argument("--debug-wire", action="store_true", default=default, help=_DEBUG_WIRE_HELP)


#: Skipped inputs listed one per line by `write` and `info`; past it, counts by reason only.
_LISTED_SKIPS = 20


def by_reason(counts: Mapping[str, int]) -> str:
    """`` (by reason: http_404 3, timeout 1)`` for skipped inputs counted by
    category, or "" when there is nothing to count."""
    if not counts or set(counts) == {"input"}:
        return ""
    return " (by reason: " + ", ".join(f"{shown(reason)} {n}" for reason, n in sorted(counts.items())) + ")"


def print_skipped(listed: Sequence[Any], total: int, prefix: str, file: TextIO | None = None) -> None:
    """The first skipped inputs, one per line, and how many more there are
    (``listed``: those a manifest lists, of ``total``), to ``file`` (stdout)."""
    for item in listed[:_LISTED_SKIPS]:
        # A reason that names its input first (`rows.jsonl:7: line 7 ...`) is not given the path again.
        named = item.reason.startswith(f"{item.path}:")
        line = f"{prefix}{shown(item.reason)}" if named else f"{prefix}{shown(item.path)}: {shown(item.reason)}"
        print(line, file=file)
    more = total - min(len(listed), _LISTED_SKIPS)
    if more > 0:
        where = "all are in manifest.json" if len(listed) == total else f"manifest.json lists the first {len(listed)}"
        print(f"{prefix}... and {more} more ({where})", file=file)


def parse_workers(text: str | None) -> int | None:
    """``--workers``: None when not given."""
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--workers must be a whole number of at least 1, not {text!r}")
    return int(text)
