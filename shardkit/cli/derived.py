"""The subcommands that make datasets over others without copies: ``view``
and ``extend``; and ``info`` of such a dataset (its lineage)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardkit.cli.common import EXIT_CHECK_FAILED, EXIT_OK, add_source_options, add_verbose, parse_workers, shown, source_options
from shardkit.errors import UsageError


def add_view(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view", help="a subset, split or merge of datasets, without copying them", description=cmd_view.__doc__
    )
    p.add_argument("paths", nargs="+", metavar="SOURCE... DEST", help="one or more datasets, then the view's folder")
    choice = p.add_mutually_exclusive_group()
    choice.add_argument("--keys", metavar="FILE", help="keep the samples of these keys (one per line, or a column)")
    choice.add_argument("--where", metavar="'FIELD OP VALUE'", help="keep the samples that pass, e.g. 'json.score > 0.5'")
    choice.add_argument("--split", nargs="+", metavar="NAME=FRACTION", help="one view per split, in DEST/NAME")
    p.add_argument("--column", help="with --keys: the column of a .parquet or .csv file (default 'key')")
    p.add_argument("--table", metavar="FILE", help="with --where: a .parquet or .csv table keyed by __key__")
    p.add_argument("--seed", type=int, default=0, help="with --split: the seed of the key hash (default 0)")
    p.add_argument("--workers", help="processes reading the sources (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already in DEST")
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    """Make a view: the samples of SOURCE (several: merged) that --keys lists, that
    --where keeps, or each --split, as a dataset that names its sources' shards and
    copies none. Takedowns on a source reach the view when it is read."""
    from shardkit.revise.view import view

    if len(args.paths) < 2:
        raise UsageError("view: give SOURCE... DEST")
    *sources, dest = args.paths
    split = None
    if args.split:
        split = {}
        for item in args.split:
            name, equals, fraction = item.partition("=")
            try:
                split[name] = float(fraction) if equals else float("nan")
            except ValueError:
                raise UsageError(f"--split {item!r}: expected NAME=FRACTION, e.g. val=0.02") from None
    made = view(
        sources, dest, keys=args.keys, key_column=args.column, where=args.where, table=args.table, split=split,
        seed=args.seed, workers=parse_workers(args.workers), overwrite=args.overwrite,
        source_options=source_options(args),
    )
    for name, report in (made.items() if isinstance(made, dict) else [("", made)]):
        print(f"{shown(report.location)}: {report.num_samples:,} of {report.num_source_samples:,} samples "
              f"in {report.num_shards:,} shards, nothing copied")
    return EXIT_OK


def add_extend(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "extend", help="add fields to every sample of a dataset, writing only the new fields", description=cmd_extend.__doc__
    )
    p.add_argument("parent", help="the dataset whose samples get new fields")
    p.add_argument("dest", help="the extension's folder")
    p.add_argument("--map", required=True, metavar="MODULE:FUNCTION", help="returns a dict of new fields (or None) per sample")
    p.add_argument("--fields", nargs="+", metavar="FIELD", help="the parent's fields the function is given (default: all)")
    p.add_argument("--workers", help="processes (default: all cores)")
    p.add_argument("--engine", choices=("local", "ray"), default="local", help="local: a process pool here; ray: Ray tasks")
    p.add_argument("--ray-address", help="with --engine ray: 'auto' or HOST:PORT of the cluster head")
    p.add_argument("--overwrite", action="store_true", help="replace what DEST holds")
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_extend)


def cmd_extend(args: argparse.Namespace) -> int:
    """Add fields to every sample of PARENT: --map's function gets each sample and
    returns its new fields; DEST holds only them, one shard per PARENT shard, and reads
    as PARENT's samples with the new fields. Run again after PARENT gained shards (or
    was killed): only the missing shards are written."""
    from shardkit.cli.write import load_map
    from shardkit.revise.extend import extend

    if args.engine == "ray":
        import ray

        if not ray.is_initialized():
            ray.init(address=args.ray_address, log_to_driver=False)
    report = extend(
        args.parent, args.dest, map=load_map(args.map), fields=args.fields, workers=parse_workers(args.workers),
        engine=args.engine, overwrite=args.overwrite, source_options=source_options(args),
    )
    print(f"{shown(report.location)}: fields {', '.join(map(shown, report.fields)) or 'none'} for {report.num_samples:,} "
          f"samples in {report.num_shards:,} shards ({report.num_extended:,} written now, {report.bytes_written:,} bytes)")
    return EXIT_OK


def print_derived(m: Any, options: Any) -> int:
    """``shardkit info`` of a view or an extension: what it is, its parents and what each step did."""
    from shardkit.read.catalog import open_location

    catalog = open_location(m.base, options=options)
    print(f"dataset:    {shown(m.base)}")
    print(f"kind:       {m.kind}, {shown(m.how)}")
    print(f"shards:     {m.num_shards} (of its parents; none copied)")
    taken = int(m.num_samples - catalog.counts.sum())
    removed = f" ({m.num_removed} removed with `shardkit remove`)" if m.num_removed else ""
    since = f", {taken} taken down in its parents since" if taken else ""
    print(f"samples:    {int(catalog.counts.sum())}{removed}{since}")
    print(f"extensions: {', '.join(shown(e) for e in m.extensions)}")
    if m.fields:
        print(f"fields:     {', '.join(shown(f) for f in m.fields)} (added; in {shown(m.fields_location)})")
    print("lineage:")
    _print_lineage(catalog, "  ")
    return EXIT_OK


def _print_lineage(catalog: Any, indent: str) -> None:
    from shardkit.read.derived import DerivedCatalog

    if isinstance(catalog, DerivedCatalog):
        m = catalog.manifest
        what = {"view": "view", "extension": f"extension adding {', '.join(m.fields) or 'no field'}"}[m.kind]
        print(f"{indent}{shown(m.base)}: {what} ({shown(m.how)}), {int(catalog.counts.sum()):,} samples, "
              f"revision {catalog.fingerprint[:16]}")
        for ref, parent in zip(m.parents, catalog.parents):
            now = "" if parent.fingerprint == ref.fingerprint else f" (made from {ref.fingerprint[:16]}; removals or appends since)"
            print(f"{indent}  of {shown(ref.path)}{now}")
            _print_lineage(parent, indent + "    ")
        return
    m = catalog.manifest
    appended = f", {len(m.appended)} appends" if m.appended else ""
    removed = f", {m.num_removed} removed" if m.num_removed else ""
    print(f"{indent}{shown(m.location)}: dataset, {m.num_samples:,} samples in {m.num_shards:,} shards{appended}{removed}, "
          f"revision {m.fingerprint[:16]}")


def verify_derived(location: str, options: Any, workers: int, max_member_bytes: int | None) -> int:
    """``shardkit verify`` of a view or an extension: every dataset of its chain, each once."""
    from shardkit.verify_derived import verify_chain

    def said(check: Any) -> None:
        what = f"{check.kind}, {check.num_shards} shards"
        if check.error is None:
            print(f"OK: {shown(check.location)} ({what})")
        else:
            print(f"FAILED: {shown(check.location)} ({what}): {shown(check.error)}", file=sys.stderr)

    report = verify_chain(location, options=options, workers=workers, max_member_bytes=max_member_bytes, on_check=said)
    bad = [c for c in report.checks if c.error is not None]
    if bad:
        print(f"FAILED: {len(bad)} of the {len(report.checks)} datasets of the chain (listed above)", file=sys.stderr)
        return EXIT_CHECK_FAILED
    print(f"OK: the chain of {len(report.checks)} datasets verified")
    return EXIT_OK
