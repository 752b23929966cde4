"""The ``shardkit`` command line: ``write``, ``index``, ``info``, ``verify`` and ``upgrade``.

Each subcommand is a thin function over the library. Exit codes: 0 success,
1 a check failed (``verify`` found a bad shard), 2 a usage error, any
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
import collections
import logging
import os
import sys
import traceback
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

from shardkit.errors import ShardkitError, UsageError, VerifyError, redact_text

#: Loggers that log requests on the wire, with credentials (botocore logs the
#: signed headers: access key id, session token). Debug only with --debug-wire.
WIRE_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")

#: Invisible characters that reorder or hide the text around them.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() owns exit codes."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


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
    "max_unpack_bytes": "--max-unpack-bytes",
    "fields": "--field",
    "key_column": "--key",
    "resize": "--resize",
    "resize_mode": "--resize-mode",
    "image_format": "--image-format",
    "image_quality": "--image-quality",
    "download_threads": "--download-threads",
    "max_connections_per_host": "--max-connections-per-host",
    "connect_timeout_s": "--connect-timeout",
    "read_timeout_s": "--read-timeout",
    "download_retries": "--retries",
    "respect_opt_out": "--no-respect-opt-out",
    "user_agent_contact": "--user-agent-contact",
}

_WRITE_EPILOG = """tables (pip install 'shardkit[tables]' for Parquet and datasets folders):
  SOURCE may be a .parquet file, a folder or brace pattern of them, a .csv/.tsv
  file (UTF-8, header line) or a folder saved by datasets' save_to_disk.
  With --format hf, SOURCE may also be a dataset's Hub name that datasets
  has cached (NAME, NAME:SPLIT or NAME:CONFIG:SPLIT; split train by default),
  e.g. `shardkit write user/name:train out/ --format hf`: it is read from the
  cache ($HF_DATASETS_CACHE, else $HF_HOME/datasets) and never downloaded. Each
  row is a sample: --field EXT=COLUMN (repeatable) maps a column to a member,
  --field json=* stores the other columns as JSON; without --field, columns
  named after an extension (jpg, txt, json...) map to themselves. A string
  under a non-text extension is a URL (http(s):// or s3://), downloaded while
  the shard is written, images checked to decode (--resize to scale them).
  Rows whose download fails are skipped and counted by reason in the
  manifest (shown by `shardkit info`) unless --on-error raise is given.
  URL fields have no size before download, so such shards are cut by count:
  10000 samples unless --max-samples is given.
"""


def _add_write(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "write", help="pack a dataset into tar shards", description=cmd_write.__doc__, epilog=_WRITE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "source",
        help="ImageFolder tree, directory, JSONL file, tar shards (file, dir, brace pattern), or a table: "
        "Parquet (file, dir, brace pattern), CSV/TSV, datasets save_to_disk folder",
    )
    p.add_argument("dest", help="output directory, or an s3:// or other fsspec URL")
    p.add_argument(
        "--format",
        choices=("imagefolder", "directory", "jsonl", "tar", "parquet", "csv", "tsv", "hf"),
        help="source format (default: detect; hf: a datasets save_to_disk folder, or a Hub name "
        "datasets has cached, NAME[:SPLIT], looked up offline)",
    )
    p.add_argument("--max-samples", help="most samples per shard")
    p.add_argument("--max-bytes", help="most bytes per shard, e.g. 256MB, 1GiB (default 256MiB)")
    p.add_argument("--seed", help="shuffle seed (default 0)")
    p.add_argument("--no-shuffle", dest="shuffle", action="store_const", const=False, help="keep source order")
    p.add_argument("--workers", help="scanning and writer processes (default: all cores; with --engine ray: "
                   "Ray tasks in flight, default two per cluster CPU); output does not depend on it")
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        help="unusable inputs: stop or skip and record; default: stop for unreadable files, "
        "skip and record table rows whose download fails",
    )
    p.add_argument(
        "--compress-members",
        choices=("gzip", "zstd"),
        help="compress text-like members (txt, json, npy...; never images) as KEY.txt.gz / KEY.txt.zst",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        help="local: a process pool here (default); ray: one Ray task per partition to scan, then one per "
        "shard, on a Ray cluster (pip install 'shardkit[ray]'; every node must see the source by the same "
        "path, and DEST too unless it is a URL)",
    )
    p.add_argument("--ray-address", help="with --engine ray: 'auto' or HOST:PORT of the cluster head")
    p.add_argument(
        "--max-unpack-bytes",
        help="most temporary space (in TMPDIR) the plain copies of .tar.gz/.tar.zst inputs may take (default 64GiB)",
    )
    t = p.add_argument_group("tables and URL downloads")
    t.add_argument("--field", dest="fields", action="append", metavar="EXT=COLUMN",
                   help="store COLUMN as member EXT (repeatable); json=* stores the other columns as JSON")
    t.add_argument("--key", dest="key_column", metavar="COLUMN",
                   help="column of sample keys (default: the row position, 9 digits)")
    t.add_argument("--resize", metavar="N", help="scale images so the shorter side is N pixels (never up)")
    t.add_argument("--resize-mode", choices=("keep_ratio", "center_crop", "border"),
                   help="keep_ratio (default), center_crop to NxN, or border: fit in NxN, padded")
    t.add_argument("--image-format", choices=("jpg", "png", "webp"),
                   help="re-encode resized images in this format (default: keep each one's)")
    t.add_argument("--image-quality", metavar="Q", help="JPEG/WebP quality of re-encoded images (default 95)")
    t.add_argument("--download-threads", metavar="N", help="downloads in flight per writer process (default 16)")
    t.add_argument("--max-connections-per-host", metavar="N",
                   help="downloads in flight to one host per writer process (default 4)")
    t.add_argument("--connect-timeout", dest="connect_timeout_s", metavar="S",
                   help="seconds to connect to a URL's server (default 10)")
    t.add_argument("--read-timeout", dest="read_timeout_s", metavar="S",
                   help="longest silence in seconds while reading a URL (default 20)")
    t.add_argument("--retries", dest="download_retries", metavar="N",
                   help="retries after connection errors, timeouts, 429 and 5xx, with backoff (default 2)")
    t.add_argument("--no-respect-opt-out", dest="respect_opt_out", action="store_const", const=False,
                   help="also store answers whose X-Robots-Tag says noai/noimageai (left out by default)")
    t.add_argument("--user-agent-contact", metavar="URL_OR_EMAIL",
                   help="appended to the User-Agent (shardkit/VERSION) so site owners can reach you")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="keep finished shards of an interrupted run")
    mode.add_argument("--overwrite", action="store_true", help="replace an earlier shardkit output in DEST")
    p.add_argument("--config", help="YAML file with the same options (command-line flags win)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="scan and plan only: print the samples, shards, bytes and skipped inputs a write would give "
        "(also with -q); create nothing at DEST",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    _add_verbose(p)
    p.set_defaults(func=cmd_write)


def _dry_run(args: argparse.Namespace, options: Any) -> int:
    """``write --dry-run``: the plan's figures, one per line; nothing is written."""
    from shardkit.write.dry_run import plan_dataset

    plan = plan_dataset(args.source, options=options)
    rate = plan.num_samples / max(plan.seconds, 1e-9)
    print(f"dry run: scanned and planned in {plan.seconds:.2f}s ({rate:.0f} samples/s); "
          f"nothing written to {shown(args.dest)}")
    if options.engine == "ray":
        print("  engine:  ray; planned on this machine as a Ray write's driver plans, the cluster was not contacted")
    print(f"  inputs:  {plan.num_inputs} file{'s' * (plan.num_inputs != 1)} ({plan.format})")
    print(f"  samples: {plan.num_samples}")
    print(f"  shards:  {plan.num_shards}")
    at_most = "at most " if options.compress_members else ""  # planned with uncompressed member sizes
    fetched = " + the fields to download (sized once fetched)" if plan.has_urls else ""
    print(f"  bytes:   {at_most}{plan.num_bytes} ({_human_bytes(plan.num_bytes)}){fetched}")
    print(f"  skipped: {len(plan.skipped)}")
    for item in plan.skipped:
        print(f"    {shown(item.path)}: {shown(item.reason)}")
    for origin in plan.oversized:
        print(f"  warning: {shown(origin)} alone exceeds --max-bytes; it would have a shard of its own")
    return EXIT_OK


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
    if args.dry_run:
        return _dry_run(args, options)
    bar = None
    written_bytes = skipped = 0

    def on_progress(event: Any) -> None:
        nonlocal written_bytes, bar, skipped
        if not event.reused:  # a resumed run's finished shards are not written again
            written_bytes += event.num_bytes
        if not args.quiet:
            if bar is None:
                from tqdm import tqdm

                bar = tqdm(total=event.total_samples, unit=" samples", desc="write", file=sys.stderr)
                # Its clock starts with the writing, not with the first shard finished.
                bar.start_t -= event.elapsed_s
            bar.update(event.num_samples + event.num_skipped)
            skipped += event.num_skipped
            failed = f", {100 * skipped / max(bar.n, 1):.1f}% skipped" if skipped else ""
            rate = written_bytes / max(event.elapsed_s, 1e-9) / 1e6
            bar.set_postfix_str(f"{rate:.1f} MB/s{failed}, {event.shard}", refresh=False)

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
            f"skipped {len(m.skipped)}{_by_reason(m.skipped)}"
        )
        _print_skipped(m.skipped, "  skipped ")
        for origin in report.oversized:
            print(f"  warning: {shown(origin)} alone exceeds --max-bytes; it has a shard of its own")
        print(f"manifest: {shown(os.path.join(args.dest, 'manifest.json'))}")
    return EXIT_OK


#: Skipped inputs listed one per line by `write` and `info`; past it, counts by reason only.
_LISTED_SKIPS = 20


def _by_reason(skipped: Sequence[Any]) -> str:
    """`` (by reason: http_404 3, timeout 1)``, or "" when there is nothing to count."""
    from shardkit.write.table_source import skip_reason

    counts = collections.Counter(skip_reason(item.reason) for item in skipped)
    if not counts or set(counts) == {"input"}:
        return ""
    return " (by reason: " + ", ".join(f"{shown(reason)} {n}" for reason, n in sorted(counts.items())) + ")"


def _print_skipped(skipped: Sequence[Any], prefix: str) -> None:
    for item in skipped[:_LISTED_SKIPS]:
        print(f"{prefix}{shown(item.path)}: {shown(item.reason)}")
    if len(skipped) > _LISTED_SKIPS:
        print(f"{prefix}... and {len(skipped) - _LISTED_SKIPS} more (all are in manifest.json)")


# -------------------------------------------------------------------- index


def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index", help="index published tar shards in place (no copy)", description=cmd_index.__doc__
    )
    p.add_argument(
        "source",
        nargs="+",
        help="folder of shards (local, s3://... or fsspec URL ending in /), brace pattern, or shards",
    )
    p.add_argument(
        "--out",
        help="folder for manifest.json, the shard table and offset indexes (needed when the shards are "
        "remote or read-only; default: beside the shards)",
    )
    p.add_argument("--workers", help="processes reading shards (default: all cores)")
    p.add_argument(
        "--engine", choices=("local", "ray"), default="local",
        help="local: a process pool here (default); ray: one Ray task per shard",
    )
    p.add_argument("--ray-address", help="with --engine ray: 'auto' or HOST:PORT of the cluster head")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    _add_verbose(p)
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    """Read each shard of SOURCE once, in parallel, and publish a shard table,
    manifest and offset indexes for them (beside the shards, or into --out),
    so every reader feature works on the shards as published. A rerun reads
    only new or changed shards. Exit 1 when a shard could not be indexed
    (it is listed, the others are indexed)."""
    from shardkit.write.indexer import IndexOptions, index_dataset

    workers = None
    if args.workers is not None:
        if not args.workers.isdigit() or int(args.workers) < 1:
            raise UsageError(f"--workers must be a whole number of at least 1, not {args.workers!r}")
        workers = int(args.workers)
    options = IndexOptions(workers=workers, engine=args.engine, ray_address=args.ray_address)
    source = args.source[0] if len(args.source) == 1 else args.source
    bar = None

    def on_progress(result: Any) -> None:
        nonlocal bar
        if args.quiet:
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(unit=" shards", desc="index", file=sys.stderr)
        bar.update(1)

    try:
        report = index_dataset(source, out=args.out, options=options, progress=on_progress)
    finally:
        if bar is not None:
            bar.close()
    m = report.manifest
    if not args.quiet:
        rate = report.bytes_read / max(report.seconds, 1e-9)
        print(
            f"indexed {m.num_shards} shards ({report.num_indexed} read, {report.num_unchanged} unchanged, "
            f"{report.num_removed} removed), {m.num_samples} samples, {_human_bytes(m.num_bytes)}; read "
            f"{_human_bytes(report.bytes_read)} in {report.seconds:.2f}s ({_human_bytes(rate)}/s)"
        )
        if report.num_compressed:
            print(
                f"  note: {report.num_compressed} compressed shards are stream-only (no offset index): "
                "the reader reads them whole"
            )
        print(f"manifest: {shown(report.location.rstrip('/') + '/' + 'manifest.json')}")
    for item in report.skipped:
        print(f"  skipped {shown(item.path)}: {shown(item.reason)}", file=sys.stderr)
    if report.skipped:
        print(
            f"shardkit: {len(report.skipped)} shard(s) not indexed (listed above); fix or remove them and rerun "
            "`shardkit index`",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
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
    from shardkit.format.manifest import FORMAT_VERSION
    from shardkit.io.manifest import fetch_manifest

    m = fetch_manifest(args.dataset)
    # Every field comes from a file someone else may have written: shown() escapes it.
    counts = m.table.counts if m.num_shards else [0]  # an array view of the shard table
    print(f"dataset:    {shown(m.location)}")
    if m.shards_base is not None:
        print(f"shards in:  {shown(m.shards_base)} (indexed by `shardkit index --out`)")
    print(f"source:     {shown(m.source.get('format'))} {shown(m.source.get('path', ''))}")
    print(f"shards:     {m.num_shards} (samples per shard: min {int(min(counts))}, max {int(max(counts))})")
    print(f"format:     {m.loaded_version}" + ("" if m.loaded_version == FORMAT_VERSION else
          f" (run `shardkit upgrade {shown(args.dataset)}` to bring it to {FORMAT_VERSION})"))
    print(f"samples:    {m.num_samples}")
    print(f"bytes:      {m.num_bytes} ({_human_bytes(m.num_bytes)})")
    print(f"extensions: {', '.join(shown(e) for e in m.extensions)}")
    if m.class_names is not None:
        names = [shown(name) for name in m.class_names[:8]]
        listed = ", ".join(names) + (", ..." if len(m.class_names) > 8 else "")
        print(f"classes:    {len(m.class_names)} ({listed})")
    print(f"seed:       {shown(m.seed) if m.seed is not None else 'none (source order)'}")
    options = ", ".join(f"{shown(k)}={shown(v)}" for k, v in sorted(m.options.items()))
    print(f"options:    {options or 'none recorded'}")
    print(f"skipped:    {len(m.skipped)}{_by_reason(m.skipped)}")
    _print_skipped(m.skipped, "  ")
    if args.shards:
        for number in range(m.num_shards):
            s = m.table.entry(number)
            print(f"  {shown(s.path)}  {s.num_samples:>8} samples  {s.num_bytes:>12} bytes  {shown(s.sha256[:16])}")
    return EXIT_OK


# ------------------------------------------------------------------ upgrade


def _add_upgrade(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "upgrade", help="bring a dataset of an earlier shardkit to the current format", description=cmd_upgrade.__doc__
    )
    p.add_argument("dataset", help="dataset directory or s3:// (or other writable) URL")
    _add_verbose(p)
    p.set_defaults(func=cmd_upgrade)


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Rewrite a dataset's manifest in the current format (a shard table beside
    a small manifest.json), in place: the shards are untouched, a crash leaves
    the old or the new manifest, and a second run changes nothing."""
    from shardkit.format.manifest import FORMAT_VERSION
    from shardkit.write.publish import upgrade_dataset

    report = upgrade_dataset(args.dataset)
    where = shown(report.location)
    if report.upgraded:
        print(
            f"upgraded {where} from format {report.from_version} to {FORMAT_VERSION}: {report.num_shards} shards, "
            f"shard table {report.table_name} ({_human_bytes(report.table_bytes)}); shards untouched"
        )
    else:
        removed = f"; removed {len(report.removed)} stray table(s) of an interrupted run" if report.removed else ""
        print(f"{where} is already in format {FORMAT_VERSION}; nothing to do{removed}")
    return EXIT_OK


# ------------------------------------------------------------------- verify


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-read every shard and check it", description=cmd_verify.__doc__)
    p.add_argument("dataset", help="dataset directory, manifest.json, or their URL")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--max-member-bytes",
        help="most bytes a compressed member may decompress to, e.g. 1GiB (default 256MiB, as the readers)",
    )
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
    from shardkit.verify import SkippedEntries, StreamOnlyShard, verify_shard

    from shardkit.config import parse_size
    from shardkit.format.compression import DEFAULT_MAX_MEMBER_BYTES

    limit = DEFAULT_MAX_MEMBER_BYTES if args.max_member_bytes is None else parse_size(args.max_member_bytes)
    options = SourceOptions(allowed_prefixes=tuple(args.allow_prefix))
    manifest = fetch_manifest(args.dataset, options=options)
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=manifest.num_bytes, unit="B", unit_scale=True, desc="verify", file=sys.stderr)
    samples = 0
    skipped: list[SkippedEntries] = []
    stream_only: list[StreamOnlyShard] = []
    try:
        for number in range(manifest.num_shards):  # one entry at a time, from the shard table
            entry = manifest.table.entry(number)
            try:
                samples += verify_shard(
                    manifest, entry, options=options, number=number, max_member_bytes=limit, skipped=skipped,
                    stream_only=stream_only,
                )
            except VerifyError as exc:
                print(f"FAILED: {shown(exc)}", file=sys.stderr)
                return EXIT_CHECK_FAILED
            if bar is not None:
                bar.update(entry.num_bytes)
    finally:
        if bar is not None:
            bar.close()
    for item in [*skipped, *stream_only]:
        print(f"WARNING: {shown(item.warning())}", file=sys.stderr)
    entries = sum(item.count for item in skipped)
    note = f" ({entries} entries that belong to no sample skipped in {len(skipped)} shards)" if skipped else ""
    if stream_only:
        note += f" ({len(stream_only)} compressed shards stream-only: no offset index to check)"
    if left := len(manifest.skipped):
        note += f" ({left} input{'s' if left > 1 else ''} left out when it was made: `shardkit info` lists them)"
    print(f"OK: {manifest.num_shards} shards, {samples} samples, {_human_bytes(manifest.num_bytes)} verified{note}")
    return EXIT_OK


# --------------------------------------------------------------------- main


_VERBOSE_HELP = "log shardkit's debug details; tracebacks on errors (no wire logs: see --debug-wire)"
_DEBUG_WIRE_HELP = (
    "also log the HTTP and S3 wire traffic (urllib3, botocore, boto3, s3transfer) at debug level. "
    "WARNING: these logs contain credentials (AWS access key ids, session tokens, signed headers "
    "and URLs); never share them"
)


def _add_verbose(parser: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    # Also after the subcommand (`shardkit write SRC DEST -v`); SUPPRESS keeps
    # a `shardkit -v write ...` given before it.
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help=_VERBOSE_HELP)
    parser.add_argument("--debug-wire", action="store_true", default=default, help=_DEBUG_WIRE_HELP)


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
    _add_write, _add_index, _add_info, _add_verify, _add_upgrade
)


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="shardkit", description="Tar-shard training data: write, inspect, verify.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _add_verbose(parser, default=False)
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
    except (ShardkitError, OSError, ImportError) as exc:
        # One line naming the file (or the missing extra) and what to do; the traceback only with -v.
        if verbose:
            # Redacted: a chained library error (urllib3, botocore) may quote a URL whole.
            print(redact_text(traceback.format_exc()), end="", file=sys.stderr)
        print(f"shardkit: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("shardkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
