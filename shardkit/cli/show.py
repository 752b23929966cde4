"""``shardkit show``: a self-contained HTML page of a dataset's samples and statistics."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from shardkit.cli.common import (
    EXIT_OK,
    add_source_options,
    add_verbose,
    human_bytes,
    shown,
    source_options,
    whole_number,
)
from shardkit.errors import UsageError

if TYPE_CHECKING:
    from shardkit.preview.build import ShowOptions


def add_show(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show", help="write an HTML page of random samples and the dataset's statistics", description=cmd_show.__doc__
    )
    p.add_argument("dataset", help="dataset directory, manifest.json, their URL, or the --out folder of `shardkit index`")
    p.add_argument("--out", metavar="FILE.html", help="the page to write (replaced whole, never half)")
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
    p.add_argument(
        "--serve", action="store_true",
        help="serve the page on 127.0.0.1 instead (each load a new page; it links to the next seed's samples)",
    )  # fmt: skip
    p.add_argument("--port", default="0", help="with --serve: the port (default 0: one the system picks)")
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
    from disk or attach it to a bug report. With --serve, the page is
    served on 127.0.0.1 instead, drawn anew on each load, with a link to
    the next seed's samples."""
    from shardkit.preview.api import show, write_page
    from shardkit.preview.build import ShowOptions

    if (args.out is None) == (not args.serve):
        raise UsageError("give --out FILE.html to write the page, or --serve to serve it (one of them)")
    if args.out is not None and not args.out.lower().endswith((".html", ".htm")):
        raise UsageError(f"--out {shown(args.out)}: name the page FILE.html")
    pixels = None if args.max_image_pixels is None else whole_number("--max-image-pixels", args.max_image_pixels, 1)
    options = ShowOptions(
        samples=whole_number("--samples", args.samples, 0),
        seed=whole_number("--seed", args.seed, 0),
        stats_samples=whole_number("--stats-samples", args.stats_samples, 0),
        **({} if pixels is None else {"max_image_pixels": pixels}),
    )
    if args.serve:
        return _serve(args, options)
    page = show(args.dataset, options=options, source_options=source_options(args))
    size = write_page(args.out, page)
    print(f"wrote {shown(args.out)} ({human_bytes(size)}): open it in a browser")
    return EXIT_OK


def _serve(args: argparse.Namespace, options: ShowOptions) -> int:
    """``--serve``: the page of each seed, made when asked, until Ctrl-C."""
    import dataclasses

    from shardkit.preview.api import show
    from shardkit.preview.serve import make_server
    from shardkit.read.indexed import IndexedDataset

    port = whole_number("--port", args.port, 0)
    storage = source_options(args)
    IndexedDataset(args.dataset, source_options=storage).close()  # a missing dataset fails now, not at each load

    def page(seed: int, next_seed: int) -> str:
        drawn = dataclasses.replace(options, seed=seed)
        return show(args.dataset, options=drawn, source_options=storage, next_seed=next_seed)

    server = make_server(page, seed=options.seed, port=port)
    host, bound = server.server_address[:2]
    print(f"serving {shown(args.dataset)} at http://{host}:{bound}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK
