"""``shardkit write``: its flags, its dry run and its progress bar."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardkit.cli.common import EXIT_OK, S3_ANONYMOUS_HELP, add_verbose, by_reason, human_bytes, print_skipped, shown

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
  the shard is written, or else a local file path (relative to the table's
  folder, confined to --files-root), read as a JSONL row's path is; images
  are checked to decode (--resize to scale them).
  Rows whose download fails are skipped and counted by reason in the
  manifest (shown by `shardkit info`) unless --on-error raise is given.
  URL fields have no size before download, so such shards are cut by count:
  10000 samples unless --max-samples is given.
"""


def add_write(sub: argparse._SubParsersAction) -> None:
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
    _add_write_options(p)
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
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars; of the summary, only its first line (shards, samples, skipped)")
    add_verbose(p)
    p.set_defaults(func=cmd_write)


def add_append(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "append", help="add new data to a dataset as new shards (one new revision)", description=cmd_append.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dest", help="the dataset's folder (shardkit write's, or a local index with its shards beside it)")
    p.add_argument("source", help="the new data: anything `shardkit write` takes as SOURCE")
    _add_write_options(p)
    p.add_argument("--again", action="store_true",
                   help="append SOURCE although an earlier append added it already (same options): its samples twice")
    p.add_argument("--config", help="YAML file with the same options (command-line flags win)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars; a one-line summary")
    add_verbose(p)
    p.set_defaults(func=cmd_append)


def _add_write_options(p: argparse.ArgumentParser) -> None:
    """The options of what is written and how: ``write``'s and ``append``'s."""
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
        help="most temporary space (in DEST's work folder) the plain copies of .tar.gz/.tar.zst inputs may take (default 64GiB)",
    )
    p.add_argument(
        "--files-root", metavar="DIR",
        help="the folder a JSONL's or a table's rows may name files in (default: the JSONL file's or the "
        "table's folder); a row naming a file outside it (absolute path, ..) is refused",
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
    t.add_argument("--s3-anonymous", action="store_const", const=True, help=S3_ANONYMOUS_HELP)
    p.add_argument(
        "--map", metavar="MODULE:FUNCTION",
        help="run your function on each sample before it is written (imported from the current folder or "
        "PYTHONPATH): it gets {'__key__': ..., EXT: bytes} and returns a sample dict, None to drop it, or a "
        "list of samples; runs in the worker processes, output independent of --workers",
    )


#: Seconds of scanning before its bar shows (a small source's scan is over at once).
SCAN_BAR_DELAY_S = 1.0


@contextlib.contextmanager
def _scan_bar(quiet: bool) -> Iterator[Callable[[Any], None] | None]:
    """A progress bar while the source is scanned (over its partitions: a
    large source takes minutes before the first shard), then while ``--map``
    runs (over the items, with items/s and the time left); None when quiet."""
    if quiet:
        yield None
        return
    bar = None
    mapping = False

    def on_scan(event: Any) -> None:
        nonlocal bar, mapping
        if event.total_items and not mapping:  # the map stage begins: the items' bar replaces the scan's
            mapping = True
            if bar is not None:
                bar.close()
            bar = None
        if bar is None:
            from tqdm import tqdm

            if mapping:
                bar = tqdm(total=event.total_items, unit=" items", desc="map", file=sys.stderr, delay=SCAN_BAR_DELAY_S)
            else:
                bar = tqdm(total=event.num_partitions, unit=" partitions", desc="scan", file=sys.stderr,
                           delay=SCAN_BAR_DELAY_S)
        bar.set_postfix_str(f"{event.num_samples:,} samples", refresh=False)
        bar.update((event.num_items if mapping else event.done) - bar.n)
        if event.done == event.num_partitions:
            bar.close()  # the next stage's bar comes next

    try:
        yield on_scan
    finally:
        if bar is not None:
            bar.close()


def load_map(spec: str) -> Callable[[Any], Any]:
    """The function ``--map MODULE:FUNCTION`` names, imported as ``python -m``
    would (the current folder first, then ``PYTHONPATH``).

    Raises:
        UsageError: Not MODULE:FUNCTION, a module that cannot be imported or
            fails while importing, no such name in it, or not a callable.
    """
    import importlib

    from shardkit.errors import UsageError

    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        raise UsageError(f"--map must be MODULE:FUNCTION (e.g. prep:resize for resize() in prep.py), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # kept: the writer's processes import it by the same path
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise UsageError(f"--map {spec}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
        raise UsageError(
            f"--map {spec}: cannot import module {module_name!r} ({exc}); run from the folder that holds it, "
            "or add that folder to PYTHONPATH"
        ) from exc
    except Exception as exc:
        raise UsageError(f"--map {spec}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    fn: Any = module
    for part in name.split("."):
        if not hasattr(fn, part):
            where = getattr(module, "__file__", None) or module_name
            raise UsageError(f"--map {spec}: module {module_name} ({where}) has no {name!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        kind = type(fn).__name__
        raise UsageError(f"--map {spec}: {module_name}.{name} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a function")
    return fn


def _dry_run(args: argparse.Namespace, options: Any, fn: Callable[[Any], Any] | None) -> int:
    """``write --dry-run``: the plan's figures, one per line; nothing is written."""
    from shardkit.write.dry_run import plan_dataset

    with _scan_bar(args.quiet) as on_scan:
        plan = plan_dataset(args.source, options=options, scan_progress=on_scan, map=fn)
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
    print(f"  bytes:   {at_most}{plan.num_bytes} ({human_bytes(plan.num_bytes)}){fetched}")
    print(f"  skipped: {len(plan.skipped)}")
    print_skipped(plan.skipped, len(plan.skipped), "    ")
    if plan.map_not_run:
        print("  note:    a dry run does not run --map or resize images: samples and bytes are the inputs', before them")
    _warn_oversized(plan.oversized, plan.num_oversized, "would have")
    return EXIT_OK


def _warn_oversized(examples: Sequence[str], count: int, verb: str) -> None:
    """One line for the samples over --max-bytes (a limit set too small makes every sample one)."""
    if count == 1:
        print(f"  warning: {shown(examples[0])} alone exceeds --max-bytes; it {verb} a shard of its own")
    elif count:
        print(f"  warning: {count} samples alone exceed --max-bytes, each getting a shard of its own "
              f"(e.g. {shown(examples[0])}); raise --max-bytes")  # fmt: skip


def _write_options(args: argparse.Namespace) -> Any:
    """The :class:`~shardkit.write.options.WriteOptions` of ``write`` or ``append``: flags over ``--config``."""
    from shardkit.config import load_options
    from shardkit.write.flags import WRITE_FLAGS
    from shardkit.write.parallel import WriteOptions

    overrides = {field: getattr(args, field, None) for field in WRITE_FLAGS}
    overrides["resume"] = getattr(args, "resume", False) or None
    overrides["overwrite"] = getattr(args, "overwrite", False) or None
    return load_options(WriteOptions, args.config, section="write", overrides=overrides, override_names=WRITE_FLAGS)


def cmd_append(args: argparse.Namespace) -> int:
    """Add SOURCE's samples to the dataset at DEST as new shards after its last,
    published as one new revision; DEST's shards and indexes are not touched.
    A killed append finishes when run again with the same SOURCE and options."""
    from shardkit.revise.append import append

    options = _write_options(args)
    fn = load_map(args.map) if args.map else None
    with _write_bar(args.quiet) as on_progress, _scan_bar(args.quiet) as on_scan:
        report = append(args.dest, args.source, map=fn, options=options, progress=on_progress,
                                scan_progress=on_scan, again=args.again)  # fmt: skip
    m = report.manifest
    done = "already appended by an earlier run" if report.write is None else "appended"
    print(f"{done} {report.num_samples} samples in {report.num_shards} shards; the dataset holds {m.num_samples} "
          f"samples in {m.num_shards} shards (revision {m.fingerprint[:16]}, was {report.fingerprint_before[:16]})")  # fmt: skip
    if report.write is not None and not args.quiet:
        written = report.write.manifest
        print_skipped(written.skipped, written.num_skipped, "  skipped ")
    return EXIT_OK


@contextlib.contextmanager
def _write_bar(quiet: bool) -> Iterator[Callable[[Any], None]]:
    """A progress callback for the shards written: a bar over the samples
    (with MB/s, the share skipped and the last shard) unless ``quiet``; it
    adds up the bytes written either way (``on_progress.written_bytes``)."""
    bar = None
    skipped = 0

    def on_progress(event: Any) -> None:
        nonlocal bar, skipped
        if not event.reused:  # a resumed run's finished shards are not written again
            on_progress.written_bytes += event.num_bytes  # type: ignore[attr-defined]
        if not quiet:
            if bar is None:
                from tqdm import tqdm

                bar = tqdm(total=event.total_samples, unit=" samples", desc="write", file=sys.stderr)
                # Its clock starts with the writing, not with the first shard finished.
                bar.start_t -= event.elapsed_s
            bar.update(event.num_samples + event.num_skipped)
            skipped += event.num_skipped
            failed = f", {100 * skipped / max(bar.n, 1):.1f}% skipped" if skipped else ""
            rate = on_progress.written_bytes / max(event.elapsed_s, 1e-9) / 1e6  # type: ignore[attr-defined]
            bar.set_postfix_str(f"{rate:.1f} MB/s{failed}, {event.shard}", refresh=False)

    on_progress.written_bytes = 0  # type: ignore[attr-defined]
    try:
        yield on_progress
    finally:
        if bar is not None:
            bar.close()


def cmd_write(args: argparse.Namespace) -> int:
    """Pack SOURCE into tar shards under DEST with a manifest and offset indexes."""
    from shardkit.write.parallel import write_dataset

    options = _write_options(args)
    fn = load_map(args.map) if args.map else None
    if args.dry_run:
        return _dry_run(args, options, fn)
    with _write_bar(args.quiet) as on_progress, _scan_bar(args.quiet) as on_scan:
        report = write_dataset(args.source, args.dest, map=fn, options=options, progress=on_progress,
                               scan_progress=on_scan)  # fmt: skip
    m = report.manifest
    rate = m.num_bytes / max(report.seconds, 1e-9)
    print(  # the one line -q keeps, as `remove -q` does
        f"wrote {m.num_shards} shards ({report.num_written} written, {report.num_reused} reused), "
        f"{m.num_samples} samples, {human_bytes(m.num_bytes)} in {report.seconds:.2f}s "
        f"({m.num_samples / max(report.seconds, 1e-9):.0f} samples/s, {human_bytes(rate)}/s); "
        f"skipped {m.num_skipped}{by_reason(m.skipped_by_category)}"
    )
    if not args.quiet:
        if report.num_items:
            print(f"map: {report.num_items} items read, {m.num_samples} samples written, "
                  f"{report.num_filtered} filtered, {report.num_failed} failed")  # fmt: skip
        print_skipped(m.skipped, m.num_skipped, "  skipped ")
        _warn_oversized(report.oversized, report.num_oversized, "has")
        print(f"manifest: {shown(os.path.join(args.dest, 'manifest.json'))}")
    return EXIT_OK
