"""``shardkit show``: a self-contained HTML page of a dataset's samples and statistics."""

from __future__ import annotations

import argparse

from shardkit.cli.common import EXIT_OK, add_source_options, add_verbose, human_bytes, shown, source_options
from shardkit.errors import UsageError


def _whole(flag: str, text: str, low: int) -> int:
    if not text.isdigit() or int(text) < low:
        raise UsageError(f"{flag} must be a whole number of at least {low}, not {text!r}")
    return int(text)


def add_show(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show", help="write an HTML page of random samples and the dataset's statistics", description=cmd_show.__doc__
    )
    p.add_argument("dataset", help="dataset directory, manifest.json, their URL, or the --out folder of `shardkit index`")
    p.add_argument("--out", required=True, metavar="FILE.html", help="the page to write (replaced whole, never half)")
    p.add_argument("--samples", default="12", metavar="N", help="samples shown as cards (default 12, at most 1000)")
    p.add_argument("--seed", default="0", metavar="S", help="seed of the random draw (default 0)")
    p.add_argument(
        "--stats-samples", default="100", metavar="N",
        help="samples drawn for member sizes, field presence and class balance (default 100)",
    )  # fmt: skip
    p.add_argument(
        "--max-image-pixels", metavar="N",
        help="most pixels an image header may give to be drawn (default ~89.5 million, Pillow's limit)",
    )  # fmt: skip
    add_source_options(p)
    add_verbose(p)
    p.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    """Write one self-contained HTML file: N random samples of DATASET as
    cards (images as thumbnails, text, JSON, labels with their class names,
    arrays, audio and video players), read through the offset index, and
    the dataset's statistics (samples and bytes per shard, member sizes,
    field presence, class balance, skipped inputs, removed samples, options
    and fingerprint). The page fetches nothing and runs no script: open it
    from disk or attach it to a bug report."""
    from shardkit.preview.api import show, write_page
    from shardkit.preview.build import ShowOptions

    if not args.out.lower().endswith((".html", ".htm")):
        raise UsageError(f"--out {shown(args.out)}: name the page FILE.html")
    pixels = None if args.max_image_pixels is None else _whole("--max-image-pixels", args.max_image_pixels, 1)
    options = ShowOptions(
        samples=_whole("--samples", args.samples, 0),
        seed=_whole("--seed", args.seed, 0),
        stats_samples=_whole("--stats-samples", args.stats_samples, 0),
        **({} if pixels is None else {"max_image_pixels": pixels}),
    )
    page = show(args.dataset, options=options, source_options=source_options(args))
    size = write_page(args.out, page)
    print(f"wrote {shown(args.out)} ({human_bytes(size)}): open it in a browser")
    return EXIT_OK
