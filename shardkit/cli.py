"""The ``shardkit`` command line: ``write``, ``info`` and ``verify``.

Each subcommand is a thin function over the library. Exit codes: 0 success,
1 a check failed (``verify`` found a bad shard), 2 a usage error, any
:class:`~shardkit.errors.ShardkitError` or an I/O error (one line on stderr
naming the file and what to do; the traceback too with ``-v``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from shardkit.errors import ShardkitError, UsageError, VerifyError

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() owns exit codes."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


# -------------------------------------------------------------------- write

# Command-line flags of `write` that set a WriteOptions field (flags win over --config).
_WRITE_FLAGS = {
    "format": "--format",
    "max_samples": "--max-samples",
    "max_bytes": "--max-bytes",
    "shuffle": "--no-shuffle",
    "seed": "--seed",
    "workers": "--workers",
    "on_error": "--on-error",
    "compress_members": "--compress-members",
    "engine": "--engine",
    "ray_address": "--ray-address",
}


def _add_write(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("write", help="pack a dataset into tar shards", description=cmd_write.__doc__)
    p.add_argument("source", help="ImageFolder tree, directory, JSONL file, or tar shards (file, dir, brace pattern)")
    p.add_argument("dest", help="output directory, or an s3:// or other fsspec URL")
    p.add_argument("--format", choices=("imagefolder", "directory", "jsonl", "tar"), help="source format (default: detect)")
    p.add_argument("--max-samples", help="most samples per shard")
    p.add_argument("--max-bytes", help="most bytes per shard, e.g. 256MB, 1GiB (default 256MiB)")
    p.add_argument("--seed", help="shuffle seed (default 0)")
    p.add_argument("--no-shuffle", dest="shuffle", action="store_const", const=False, help="keep source order")
    p.add_argument("--workers", help="writer processes (default: all cores); output does not depend on it")
    p.add_argument("--on-error", choices=("raise", "skip"), help="unreadable inputs: stop (default) or skip and record")
    p.add_argument(
        "--compress-members",
        choices=("gzip", "zstd"),
        help="compress text-like members (txt, json, npy...; never images) as KEY.txt.gz / KEY.txt.zst",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        help="local: a process pool here (default); ray: one Ray task per shard on a Ray cluster "
        "(pip install 'shardkit[ray]'; sources and DEST shared by every node, or URLs)",
    )
    p.add_argument("--ray-address", help="with --engine ray: 'auto' or HOST:PORT of the cluster head")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="keep finished shards of an interrupted run")
    mode.add_argument("--overwrite", action="store_true", help="replace an earlier shardkit output in DEST")
    p.add_argument("--config", help="YAML file with the same options (command-line flags win)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    _add_verbose(p)
    p.set_defaults(func=cmd_write)


def cmd_write(args: argparse.Namespace) -> int:
    """Pack SOURCE into tar shards under DEST with a manifest and offset indexes."""
    from shardkit.config import load_options
    from shardkit.write.parallel import WriteOptions, write_dataset

    overrides = {field: getattr(args, field, None) for field in _WRITE_FLAGS}
    overrides["resume"] = args.resume or None
    overrides["overwrite"] = args.overwrite or None
    options = load_options(
        WriteOptions, args.config, section="write", overrides=overrides, override_names=_WRITE_FLAGS
    )
    bar = None
    written_bytes = 0

    def on_progress(event: Any) -> None:
        nonlocal written_bytes, bar
        written_bytes += event.num_bytes
        if not args.quiet:
            if bar is None:
                from tqdm import tqdm

                bar = tqdm(total=event.total_samples, unit=" samples", desc="write", file=sys.stderr)
            bar.update(event.num_samples)
            elapsed = bar.format_dict.get("elapsed") or 1e-9
            bar.set_postfix_str(f"{written_bytes / elapsed / 1e6:.1f} MB/s, {event.shard}", refresh=False)

    try:
        report = write_dataset(args.source, args.dest, options=options, progress=on_progress)
    finally:
        if bar is not None:
            bar.close()
    if not args.quiet:
        m = report.manifest
        rate = m.num_bytes / max(report.seconds, 1e-9)
        print(
            f"wrote {m.num_shards} shards ({report.num_written} written, {report.num_reused} reused), "
            f"{m.num_samples} samples, {_human_bytes(m.num_bytes)} in {report.seconds:.2f}s "
            f"({m.num_samples / max(report.seconds, 1e-9):.0f} samples/s, {_human_bytes(rate)}/s); "
            f"skipped {len(m.skipped)}"
        )
        for item in m.skipped:
            print(f"  skipped {item.path}: {item.reason}")
        for origin in report.oversized:
            print(f"  warning: {origin} alone exceeds --max-bytes; it has a shard of its own")
        print(f"manifest: {os.path.join(args.dest, 'manifest.json')}")
    return EXIT_OK


# --------------------------------------------------------------------- info


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="summarize a dataset's manifest", description=cmd_info.__doc__)
    p.add_argument("dataset", help="dataset directory, manifest.json, or their URL")
    p.add_argument("--shards", action="store_true", help="also list every shard")
    _add_verbose(p)
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    """Print the summary of a dataset's manifest."""
    from shardkit.io.manifest import fetch_manifest

    m = fetch_manifest(args.dataset)
    counts = [s.num_samples for s in m.shards] or [0]
    print(f"dataset:    {m.location}")
    print(f"source:     {m.source.get('format')} {m.source.get('path', '')}")
    print(f"shards:     {m.num_shards} (samples per shard: min {min(counts)}, max {max(counts)})")
    print(f"samples:    {m.num_samples}")
    print(f"bytes:      {m.num_bytes} ({_human_bytes(m.num_bytes)})")
    print(f"extensions: {', '.join(m.extensions)}")
    if m.class_names is not None:
        shown = ", ".join(m.class_names[:8]) + (", ..." if len(m.class_names) > 8 else "")
        print(f"classes:    {len(m.class_names)} ({shown})")
    print(f"seed:       {m.seed if m.seed is not None else 'none (source order)'}")
    print(f"options:    {', '.join(f'{k}={v}' for k, v in sorted(m.options.items()))}")
    print(f"skipped:    {len(m.skipped)}")
    for item in m.skipped:
        print(f"  {item.path}: {item.reason}")
    if args.shards:
        for s in m.shards:
            print(f"  {s.path}  {s.num_samples:>8} samples  {s.num_bytes:>12} bytes  {s.sha256[:16]}")
    return EXIT_OK


# ------------------------------------------------------------------- verify


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-read every shard and check it", description=cmd_verify.__doc__)
    p.add_argument("dataset", help="dataset directory, manifest.json, or their URL")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--allow-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="a folder or URL prefix outside the dataset that its manifest may name shards in "
        "(repeatable; SourceOptions.allowed_prefixes)",
    )
    _add_verbose(p)
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every shard's size, checksum, tar structure, sample count and offset index."""
    from shardkit.io.base import SourceOptions
    from shardkit.io.manifest import fetch_manifest
    from shardkit.verify import verify_shard

    options = SourceOptions(allowed_prefixes=tuple(args.allow_prefix))
    manifest = fetch_manifest(args.dataset, options=options)
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=manifest.num_bytes, unit="B", unit_scale=True, desc="verify", file=sys.stderr)
    samples = 0
    try:
        for number, entry in enumerate(manifest.shards):
            try:
                samples += verify_shard(manifest, entry, options=options, number=number)
            except VerifyError as exc:
                print(f"FAILED: {exc}", file=sys.stderr)
                return EXIT_CHECK_FAILED
            if bar is not None:
                bar.update(entry.num_bytes)
    finally:
        if bar is not None:
            bar.close()
    print(f"OK: {manifest.num_shards} shards, {samples} samples, {_human_bytes(manifest.num_bytes)} verified")
    return EXIT_OK


# --------------------------------------------------------------------- main


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    # Also after the subcommand (`shardkit write SRC DEST -v`); SUPPRESS keeps
    # a `shardkit -v write ...` given before it.
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log debug details; tracebacks on errors"
    )


_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_write, _add_info, _add_verify)


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="shardkit", description="Tar-shard training data: write, inspect, verify.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    for add in _COMMANDS:
        add(sub)
    return parser


def _version() -> str:
    from shardkit import __version__

    return __version__


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, ShardkitError):
        return text
    return f"{type(exc).__name__}: {text}"  # an OSError shardkit did not expect: say what it is


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in argv or "--verbose" in argv
    try:
        args = build_parser().parse_args(argv)
        verbose = args.verbose
        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s: %(message)s")
        return args.func(args)
    except (ShardkitError, OSError, ImportError) as exc:
        # One line naming the file (or the missing extra) and what to do; the traceback only with -v.
        if verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"shardkit: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("shardkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
