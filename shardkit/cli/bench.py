"""``shardkit bench``: how fast this storage can feed this dataset, and what holds the loader back."""

from __future__ import annotations

import argparse
import os

from shardkit.cli.common import EXIT_OK, add_source_options, add_verbose, shown, source_options, whole_number
from shardkit.errors import UsageError

#: Worker counts tried when not told (those above the machine's cores are dropped).
DEFAULT_WORKERS = (0, 1, 2, 4, 8)


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure the storage's ceiling and the loader on a dataset, and what binds",
                       description=cmd_bench.__doc__)  # fmt: skip
    p.add_argument("dataset", help="dataset directory, manifest.json, shard pattern, or their http(s):// or s3:// URL")
    p.add_argument("--decode", choices=("pil", "tensor"), help="also measure with samples decoded so")
    p.add_argument("--map", metavar="MODULE:FUNCTION", help="also measure with this function applied to each sample")
    p.add_argument("--batch-size", default="32", metavar="N", help="samples per batch (default 32)")
    p.add_argument("--workers", metavar="LIST",
                   help="worker counts, e.g. 0,1,2,4,8 (default: those of 0,1,2,4,8 up to this machine's cores)")
    p.add_argument("--seconds", default="3", metavar="S", help="the most seconds each measurement runs (default 3)")
    p.add_argument("--out", default="shardkit-bench", metavar="DIR",
                   help="folder for bench.json, bench.md and bench.png (default ./shardkit-bench)")  # fmt: skip
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_bench)


def _workers(text: str | None) -> list[int]:
    if text is None:
        from shardkit.probe.measure import usable_cores

        return [w for w in DEFAULT_WORKERS if w <= max(usable_cores(), 1)]
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts) or int(max(parts, key=int)) > 256:
        raise UsageError(f"--workers must be worker counts from 0 to 256 separated by commas (e.g. 0,1,2,4), not {text!r}")
    return sorted({int(p) for p in parts})


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"--seconds must be a positive number, not {text!r}")
    return value


def _outside(out: str, dataset: str) -> None:
    """Refuse an output folder inside a local dataset (the bench never writes into one)."""
    from shardkit.io.urls import is_local

    if not is_local(dataset):
        return
    root = os.path.realpath(dataset if os.path.isdir(dataset) else os.path.dirname(dataset) or ".")
    here = os.path.realpath(out)
    if here == root or here.startswith(root + os.sep):
        raise UsageError(f"--out {shown(out)} is inside the dataset {shown(dataset)}; shardkit bench never writes "
                         "into a dataset: give a folder outside it")  # fmt: skip


def cmd_bench(args: argparse.Namespace) -> int:
    """For each worker count: the storage's ceiling (the shards read raw,
    in large requests, cold where the page cache can be dropped), the
    loader's samples/s and MB/s through make_loader with raw bytes and with
    --decode/--map, its first-batch time, worker memory and CPU per GB, and
    a verdict: storage-bound, CPU-bound (naming the stage) or
    hand-off-bound; then the fewest workers within 95% of the best. Prints
    a table and writes bench.json, bench.md and bench.png into --out.
    Nothing is written into the dataset."""
    from tqdm import tqdm

    from shardkit.cli.write import load_map
    from shardkit.probe.measure import bench_dataset
    from shardkit.probe.report import save, text

    workers = _workers(args.workers)
    seconds = _seconds(args.seconds)
    batch_size = whole_number("--batch-size", args.batch_size, 1)
    _outside(args.out, args.dataset)
    options = {"decode": args.decode, "map": load_map(args.map) if args.map else None}
    steps = len(workers) * (3 if any(options.values()) else 2)
    begun = []
    with tqdm(total=steps, desc="shardkit bench", unit="step", leave=False) as bar:

        def progress(step: str) -> None:  # told as each step starts: the one before is done
            bar.update(1 if begun else 0)
            begun.append(step)
            bar.set_description_str(step)

        rows = bench_dataset(
            args.dataset, workers=workers, seconds=seconds, batch_size=batch_size, options=options,
            dataset_kwargs={"source_options": source_options(args)}, progress=progress,
        )  # fmt: skip
        bar.update(1)
    for line in text(rows, args.dataset).splitlines():
        print(shown(line))
    settings = {"workers": workers, "seconds": seconds, "batch_size": batch_size, "decode": args.decode, "map": args.map}
    for path in save(rows, args.dataset, args.out, settings):
        print(f"wrote {shown(path)}")
    return EXIT_OK
