"""The ``shardkit`` command line: ``write``, ``index``, ``info``, ``show``, ``verify``, ``upgrade``, ``remove``,
``append``, ``view``, ``extend`` and ``bench``.

Each subcommand is a thin function over the library. Exit codes: 0 success,
1 a check failed (``verify`` found a bad shard; ``remove`` was given keys
no sample has), 2 a usage error, any
:class:`~shardkit.errors.ShardkitError` or an I/O error (one line on stderr
naming the file and what to do; the traceback too with ``-v``).

What the CLI prints never holds secrets or raw control characters: URLs go
through :func:`~shardkit.io.urls.redact_text` (messages, tracebacks, log
lines), and text from a manifest or an error (names written by others) has
its control and bidi characters escaped (:func:`shown`). ``-v`` turns on
shardkit's debug logs only; the wire logs of urllib3, botocore, boto3 and
s3transfer, which carry credentials, need ``--debug-wire``.
"""


from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from shardkit.cli.bench import add_bench
from shardkit.cli.common import EXIT_USAGE, add_verbose, shown
from shardkit.cli.datasets import add_index, add_info, add_remove, add_upgrade, add_verify
from shardkit.cli.derived import add_extend, add_view
from shardkit.cli.show import add_show
from shardkit.cli.write import add_append, add_write
from shardkit.errors import ShardkitError, UsageError, redact_text

__all__ = ["build_parser", "configure_logging", "main", "shown"]

#: Exit code when stdout's reader closed the pipe early (128 + SIGPIPE, as git and the shell give).
EXIT_BROKEN_PIPE = 141

#: Loggers that log requests on the wire, with credentials (botocore logs the
#: signed headers: access key id, session token). Debug only with --debug-wire.
WIRE_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


class _ParseError(UsageError):
    """A command line argparse refused; ``prog`` is the (sub)command's name,
    which main() puts first, once, as argparse itself would."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() owns exit codes."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("argument command: invalid choice"):
            message += "; `shardkit --help` describes each command"
        raise _ParseError(self.prog, message)


class _RedactingFilter(logging.Filter):
    """Redacts every URL in a log line (a handler filter: sees every logger's records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def configure_logging(*, verbose: bool, debug_wire: bool) -> None:
    """Log to stderr: warnings; shardkit's debug lines with ``verbose``; the
    wire loggers (:data:`WIRE_LOGGERS`) at debug only with ``debug_wire``,
    otherwise at warning even under ``verbose``."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        handler.addFilter(_RedactingFilter())
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("shardkit").setLevel(logging.DEBUG if verbose else logging.NOTSET)
    for name in WIRE_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if debug_wire else logging.WARNING)
    if debug_wire:
        logging.getLogger("shardkit.cli").warning(
            "--debug-wire: the following logs contain credentials (access key ids, session tokens, "
            "signed headers); do not share them"
        )


_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    add_write, add_index, add_info, add_show, add_verify, add_upgrade, add_remove, add_append, add_view, add_extend,
    add_bench,
)


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="shardkit", description="Tar-shard training data: write, inspect, verify.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    add_verbose(parser, default=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    for add in _COMMANDS:
        add(sub)
    return parser


def _version() -> str:
    from shardkit import __version__

    return __version__


def _one_line(exc: BaseException) -> str:
    text = shown(" ".join(str(exc).split()))
    if isinstance(exc, ShardkitError):
        return text
    return f"{type(exc).__name__}: {text}"  # an OSError shardkit did not expect: say what it is


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in argv or "--verbose" in argv
    if all(arg in ("-v", "--verbose", "--debug-wire") for arg in argv):
        # No command: the usage line and where to read more, not argparse's "arguments are required".
        print(build_parser().format_usage(), end="", file=sys.stderr)
        print("shardkit: no command given; `shardkit --help` lists the commands, `shardkit COMMAND --help` "
              "describes one", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    try:
        args = build_parser().parse_args(argv)
        verbose = args.verbose
        configure_logging(verbose=verbose, debug_wire=args.debug_wire)
        return args.func(args)
    except BrokenPipeError:
        # The reader of our output went away (`shardkit info DS | head`): stop
        # quietly, as other command-line tools do, and let no later flush fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (ShardkitError, OSError, ImportError) as exc:
        # One line naming the file (or the missing extra) and what to do; the traceback only with -v.
        if verbose:
            # Redacted: a chained library error (urllib3, botocore) may quote a URL whole.
            print(redact_text(traceback.format_exc()), end="", file=sys.stderr)
            if getattr(exc, "frames", ""):  # a --map function's own traceback, from whichever process ran it
                print(f"the function's traceback (last frames):\n{redact_text(exc.frames)}", end="", file=sys.stderr)
        prog = exc.prog if isinstance(exc, _ParseError) else "shardkit"
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("shardkit: interrupted", file=sys.stderr)
        return 130

