"""The subcommands over a dataset that exists: ``index``, ``info``, ``upgrade`` and ``verify``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from shardkit.cli.common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    add_source_options,
    add_verbose,
    by_reason,
    parse_workers,
    human_bytes,
    print_skipped,
    shown,
    source_options,
)
from shardkit.errors import UsageError

# -------------------------------------------------------------------- index


def add_index(sub: argparse._SubParsersAction) -> None:
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
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    """Read each shard of SOURCE once, in parallel, and publish a shard table,
    manifest and offset indexes for them (beside the shards, or into --out),
    so every reader feature works on the shards as published. A rerun reads
    only new or changed shards. Exit 1 when a shard could not be indexed
    (it is listed, the others are indexed)."""
    from shardkit.index.indexer import IndexOptions, index_dataset

    workers = parse_workers(args.workers)
    options = IndexOptions(
        workers=workers, engine=args.engine, ray_address=args.ray_address, source=source_options(args)
    )
    source = args.source[0] if len(args.source) == 1 else args.source
    bar = None

    def on_progress(result: Any) -> None:
        nonlocal bar
        if args.quiet:
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=result.num_to_read, unit=" shards", desc="index", file=sys.stderr)
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
            f"indexed {m.num_shards} shards ({report.num_indexed} read, "
            + (f"{report.num_resumed} read by the interrupted run, " if report.num_resumed else "")
            + f"{report.num_unchanged} unchanged, "
            f"{report.num_removed} removed), {m.num_samples} samples, {human_bytes(m.num_bytes)}; read "
            f"{human_bytes(report.bytes_read)} in {report.seconds:.2f}s ({human_bytes(rate)}/s)"
        )
        if report.num_compressed:
            print(
                f"  note: {report.num_compressed} compressed shards are stream-only (no offset index): "
                "the reader reads them whole"
            )
        print(f"manifest: {shown(report.location.rstrip('/') + '/' + 'manifest.json')}")
    print_skipped(report.skipped, len(report.skipped), "  skipped ", file=sys.stderr)
    if report.skipped:
        print(
            f"shardkit: {len(report.skipped)} shard(s) not indexed (listed above); fix or remove them and rerun "
            "`shardkit index`",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    return EXIT_OK


# --------------------------------------------------------------------- info


def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="summarize a dataset's manifest, or one shard", description=cmd_info.__doc__)
    p.add_argument("dataset", help="dataset directory, manifest.json, one shard (.tar, .tar.gz, .tar.zst), or their URL")
    p.add_argument("--shards", action="store_true", help="also list every shard")
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_info)


def _names_a_shard(location: str) -> bool:
    """Whether ``info``'s argument is one shard rather than a dataset: a local
    file other than a manifest, or a URL whose name is a shard's."""
    from shardkit.io.urls import is_local, local_path
    from shardkit.write.sources.tar import TAR_SUFFIXES

    if is_local(location):
        path = local_path(location)
        return os.path.isfile(path) and not path.endswith(".json")
    name = location.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()
    return name.endswith(TAR_SUFFIXES)


def _print_shard(args: argparse.Namespace) -> int:
    from shardkit.index.shard import summarize_shard

    s = summarize_shard(args.dataset, source_options(args))
    print(f"shard:      {shown(args.dataset)}")
    print("format:     tar" + (f" ({s.compression}-compressed whole)" if s.compression else ""))
    keys = f" (keys {shown(s.first_key)} .. {shown(s.last_key)})" if s.num_samples else ""
    print(f"samples:    {s.num_samples}{keys}")
    print(f"bytes:      {s.num_bytes} ({human_bytes(s.num_bytes)}; largest sample {human_bytes(s.largest_sample)})")
    counts = ", ".join(f"{shown(ext)} {n}" for ext, n in s.fields.items())
    print(f"fields:     {counts or 'none'} (samples that have each)")
    print(f"sha256:     {s.sha256}")
    print("one shard: `shardkit index FOLDER --out DIR` makes a dataset of a folder of shards")
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """Print the summary of a dataset's manifest, or of one shard (read through)."""
    from shardkit.format.manifest import FORMAT_VERSION
    from shardkit.io.manifest import fetch_manifest

    if _names_a_shard(args.dataset):
        return _print_shard(args)
    m = fetch_manifest(args.dataset, options=source_options(args))
    if not hasattr(m, "table"):  # a view or an extension
        from shardkit.cli.derived import print_derived

        return print_derived(m, source_options(args))
    # Every field comes from a file someone else may have written: shown() escapes it.
    counts = m.table.counts if m.num_shards else [0]  # an array view of the shard table
    print(f"dataset:    {shown(m.location)}")
    if m.shards_base is not None:
        print(f"shards in:  {shown(m.shards_base)} (indexed by `shardkit index --out`)")
    print(f"source:     {' '.join(shown(m.source[k]) for k in ('format', 'path') if m.source.get(k))}")
    print(f"shards:     {m.num_shards} (samples per shard: min {int(min(counts))}, max {int(max(counts))})")
    print(f"format:     {m.loaded_version}" + ("" if m.loaded_version >= FORMAT_VERSION else
          f" (run `shardkit upgrade {shown(args.dataset)}` to bring it to {FORMAT_VERSION})"))
    removed = f" ({m.num_removed} removed with `shardkit remove`, still in the shards)" if m.num_removed else ""
    print(f"samples:    {m.num_samples}{removed}")
    print(f"bytes:      {m.num_bytes} ({human_bytes(m.num_bytes)})")
    print(f"extensions: {', '.join(shown(e) for e in m.extensions)}")
    if m.token_fields and m.table.tokens is not None:
        totals = m.table.tokens.sum(axis=0).tolist()
        print(f"tokens:     {', '.join(f'{shown(f)} {int(n):,}' for f, n in zip(m.token_fields, totals))}")
    if m.class_names is not None:
        names = [shown(name) for name in m.class_names[:8]]
        listed = ", ".join(names) + (", ..." if len(m.class_names) > 8 else "")
        print(f"classes:    {len(m.class_names)} ({listed})")
    print(f"seed:       {shown(m.seed) if m.seed is not None else 'none (source order)'}")
    options = ", ".join(f"{shown(k)}={shown(v)}" for k, v in sorted(m.options.items()))
    print(f"options:    {options or 'none recorded'}")
    print(f"skipped:    {m.num_skipped}{by_reason(m.skipped_by_category)}")
    print_skipped(m.skipped, m.num_skipped, "  ")
    _print_revisions(m)
    if args.shards:
        for number in range(m.num_shards):
            s = m.table.entry(number)
            print(f"  {shown(s.path)}  {s.num_samples:>8} samples  {s.num_bytes:>12} bytes  {shown(s.sha256[:16])}")
    return EXIT_OK


def _print_revisions(m: Any) -> None:
    """The revisions before the one shown: each append (where it began, what
    it added), then the removals, newest last."""
    if not m.appended and not m.num_removed:
        return
    print(f"revision:   {shown(m.fingerprint[:16])}")
    ends = [a.num_shards for a in m.appended[1:]] + [m.num_shards]
    for a, end in zip(m.appended, ends):
        what = f" of {shown(a.source.rpartition(' #')[0])}" if a.source else ""
        print(f"  appended: shards {a.num_shards}-{end - 1}{what}, after revision {shown(a.fingerprint[:16])}")
    if m.num_removed:
        print(f"  removed:  {m.num_removed} samples in {len(m.earlier_fingerprints)} removal(s)")


# ------------------------------------------------------------------ upgrade


def add_upgrade(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "upgrade", help="bring a dataset of an earlier shardkit to the current format", description=cmd_upgrade.__doc__
    )
    p.add_argument("dataset", help="dataset directory or s3:// (or other writable) URL")
    add_verbose(p)
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
            f"shard table {report.table_name} ({human_bytes(report.table_bytes)}); shards untouched"
        )
    else:
        removed = f"; removed {len(report.removed)} stray table(s) of an interrupted run" if report.removed else ""
        print(f"{where} is already in format {FORMAT_VERSION}; nothing to do{removed}")
    return EXIT_OK


# ------------------------------------------------------------------- remove


def add_remove(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "remove", help="remove samples by key without rewriting the shards", description=cmd_remove.__doc__
    )
    p.add_argument("dataset", help="local dataset directory (or a local index of published shards: `index --out`)")
    p.add_argument("--keys", required=True, metavar="FILE",
                   help="the samples' keys: one per line, or a column of a .parquet or .csv file")  # fmt: skip
    p.add_argument("--column", help="the keys' column of a .parquet or .csv file (default 'key')")
    p.add_argument("--workers", help="processes reading shards to find the keys (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_remove)


def cmd_remove(args: argparse.Namespace) -> int:
    """Remove the samples of the given keys: the shards and their indexes stay
    byte for byte as they are; a new revision of the shard table and
    manifest.json (replaced in one rename) leaves the samples out of every
    reader. Keys no sample has are listed, and the exit code is then 1;
    removing the same keys again changes nothing."""
    from tqdm import tqdm

    from shardkit.format.manifest import load_manifest
    from shardkit.revise.remove import read_keys, remove_samples

    keys = read_keys(args.keys, column=args.column)
    workers = parse_workers(args.workers) or os.cpu_count() or 1
    if "://" in args.dataset:
        raise UsageError(f"{shown(args.dataset)}: remove works on a local dataset folder (see `shardkit remove -h`)")
    total = load_manifest(args.dataset).num_bytes
    bar = None if args.quiet else tqdm(total=total, unit="B", unit_scale=True, desc="remove", file=sys.stderr)
    try:
        report = remove_samples(
            args.dataset, keys, options=source_options(args), workers=workers,
            progress=None if bar is None else bar.update,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    where = shown(report.location)
    if report.changed:
        print(
            f"removed {report.num_removed:,} samples from {where}; {report.num_removed_total:,} removed in all, "
            f"{report.num_samples:,} left; shards untouched"
        )
    else:
        print(f"removed nothing from {where}: {report.num_samples:,} samples, {report.num_removed_total:,} removed")
    if report.num_already_removed:
        print(f"{report.num_already_removed:,} of the keys' samples were removed before")
    if report.num_missing:
        for key in report.missing:
            print(f"not found: {shown(key)}", file=sys.stderr)
        more = report.num_missing - len(report.missing)
        tail = f" ({more:,} more not listed)" if more else ""
        print(f"{report.num_missing:,} of {report.num_keys:,} keys are not in the dataset{tail}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return EXIT_OK


# ------------------------------------------------------------------- verify


def add_verify(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--workers", help="processes checking shards (default: all cores)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first bad shard (default: check them all)")
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every shard's size, checksum, tar structure, sample count and
    offset index; every shard is checked, and every bad one named."""
    from tqdm import tqdm

    from shardkit.config import parse_size
    from shardkit.format.compression import DEFAULT_MAX_MEMBER_BYTES
    from shardkit.io.manifest import fetch_manifest
    from shardkit.verify import LISTED, ShardCheck, verify_dataset

    limit = DEFAULT_MAX_MEMBER_BYTES if args.max_member_bytes is None else parse_size(args.max_member_bytes)
    workers = parse_workers(args.workers) or os.cpu_count() or 1
    options = source_options(args, allowed_prefixes=tuple(args.allow_prefix))
    manifest = fetch_manifest(args.dataset, options=options)
    if not hasattr(manifest, "table"):  # a view or an extension: its whole chain
        from shardkit.cli.derived import verify_derived

        return verify_derived(args.dataset, options, workers, limit)
    bar = None if args.quiet else tqdm(total=manifest.num_bytes, unit="B", unit_scale=True, desc="verify", file=sys.stderr)
    printed = 0

    def progress(check: ShardCheck) -> None:
        nonlocal printed
        if check.error is not None and printed < LISTED:  # as found, above the bar
            printed += 1
            (bar or tqdm).write(f"FAILED: {shown(check.error)}", file=sys.stderr)
        if bar is not None:
            bar.update(check.num_bytes)

    try:
        report = verify_dataset(
            manifest, options=options, progress=progress, max_member_bytes=limit, workers=workers,
            fail_fast=args.fail_fast, raise_on_failure=False,
        )
    finally:
        if bar is not None:
            bar.close()
    for warning in report.warnings:
        print(f"WARNING: {shown(warning)}", file=sys.stderr)
    if report.num_warnings > len(report.warnings):
        print(f"WARNING: ... and {report.num_warnings - len(report.warnings)} more warnings", file=sys.stderr)
    if report.num_failed:
        more = f" (the first {printed} listed above)" if report.num_failed > printed else ""
        stopped = ""
        if report.num_shards_checked < manifest.num_shards:
            stopped = f"; stopped there (--fail-fast), {report.num_shards_checked} checked"
        print(
            f"FAILED: {report.num_failed} of {manifest.num_shards} shards{more}{stopped}. Restore them from a good "
            "copy, or rewrite the dataset (`shardkit write`, or `shardkit index` for shards you did not write)",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    note = ""
    if report.num_entries_skipped:
        shards = report.num_warnings - report.num_stream_only
        note += f" ({report.num_entries_skipped} entries that belong to no sample skipped in {shards} shards)"
    if report.num_stream_only:
        note += f" ({report.num_stream_only} compressed shards stream-only: no offset index to check)"
    if left := manifest.num_skipped:
        note += f" ({left} input{'s' if left > 1 else ''} left out when it was made: `shardkit info` lists them)"
    if report.num_removed:
        note += f" ({report.num_removed} removed samples checked too, left out by every reader)"
    samples = report.num_samples_checked
    print(f"OK: {manifest.num_shards} shards, {samples} samples, {human_bytes(manifest.num_bytes)} verified{note}")
    return EXIT_OK
