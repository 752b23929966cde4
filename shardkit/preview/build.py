"""A page, or a notebook cell's view, from a dataset opened for random access.

This module works on what :class:`~shardkit.IndexedDataset` offers (the
:class:`~shardkit.preview.draw.RandomAccess` protocol) and does not import
the reader's module, so that the reader's own ``_repr_html_`` can call it;
:mod:`shardkit.preview.api` opens datasets.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.errors import UsageError
from shardkit.preview.draw import DEFAULT_MAX_SAMPLE_BYTES, RandomAccess, pick_numbers, read_samples
from shardkit.preview.fields import Budget, FieldContext
from shardkit.preview.page import render_cards, render_fragment, render_page
from shardkit.preview.stats import gather, render_statistics
from shardkit.read.decoders.images import DEFAULT_MAX_IMAGE_PIXELS

#: Most samples a page shows.
MAX_SAMPLES = 1000
#: Most bytes of thumbnails and players one page embeds (32 MB); past it,
#: fields are named with their size instead (the page stays one to send).
DEFAULT_MAX_PAGE_BYTES = 32 << 20
#: Samples a notebook cell shows.
NOTEBOOK_SAMPLES = 6


@dataclass(frozen=True)
class ShowOptions:
    """What a page shows and the limits it keeps.

    Attributes:
        samples: Samples shown as cards (0 to :data:`MAX_SAMPLES`).
        seed: Seed of the random draw (same seed, same samples).
        stats_samples: Samples drawn for the field statistics (member sizes,
            presence, class balance); the cards are among them. At least
            ``samples`` are drawn.
        max_image_pixels: Most pixels an image's header may give for it to
            be drawn (None: no limit); past it, a placeholder says so.
        max_sample_bytes: Most bytes of one sample read; a larger one is
            named, not read.
        max_page_bytes: Most bytes of thumbnails and players embedded.
    """

    samples: int = 12
    seed: int = 0
    stats_samples: int = 100
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES

    def __post_init__(self) -> None:
        _check_whole("samples", self.samples, 0, MAX_SAMPLES)
        _check_whole("seed", self.seed, 0, None)
        _check_whole("stats_samples", self.stats_samples, 0, 100_000)
        if self.max_image_pixels is not None:
            _check_whole("max_image_pixels", self.max_image_pixels, 1, None)
        _check_whole("max_sample_bytes", self.max_sample_bytes, 1, None)
        _check_whole("max_page_bytes", self.max_page_bytes, 0, None)


def _check_whole(name: str, value: object, low: int, high: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise UsageError(f"{name} must be a whole number {bound}, not {value!r}")


def page_html(
    dataset: RandomAccess, *, name: str, options: ShowOptions, version: str, next_seed: int | None = None
) -> str:
    """The page of ``dataset`` (called ``name`` on it), as one HTML string;
    with ``next_seed``, linking to the page of that seed (``--serve``)."""
    drawn_count = max(options.samples, options.stats_samples)
    numbers = pick_numbers(len(dataset), drawn_count, options.seed)
    shown = set(numbers[: options.samples])
    drawn = read_samples(dataset, numbers, keep=shown, max_sample_bytes=options.max_sample_bytes)
    context = FieldContext(_class_names(dataset), options.max_image_pixels, Budget(options.max_page_bytes))
    cards = render_cards(sorted((s for s in drawn if s.number in shown), key=lambda s: s.number), context)
    stats = gather(dataset, drawn)
    summary = (
        f"{len(dataset):,} samples in {dataset.num_shards:,} shards; {len(shown)} random samples shown "
        f"(seed {options.seed}); field statistics over {len(drawn)} samples drawn."
    )
    footer = (
        f"Written by shardkit {version} (`shardkit show`). Self-contained: it fetches nothing and runs no script."
    )
    return render_page(
        title=f"shardkit show: {name}", summary=summary, cards=cards, statistics=render_statistics(stats),
        footer=footer, next_seed=next_seed,
    )  # fmt: skip


def notebook_html(dataset: RandomAccess) -> str:
    """A notebook cell's view of ``dataset``: its counts and a few samples
    (:data:`NOTEBOOK_SAMPLES`, seed 0); a fault is a line saying so, never an error."""
    numbers = pick_numbers(len(dataset), NOTEBOOK_SAMPLES, 0)
    limits = ShowOptions()
    drawn = read_samples(dataset, numbers, keep=set(numbers), max_sample_bytes=limits.max_sample_bytes)
    context = FieldContext(_class_names(dataset), limits.max_image_pixels, Budget(limits.max_page_bytes))
    summary = (
        f"{type(dataset).__name__}: {len(dataset):,} samples in {dataset.num_shards:,} shards; "
        f"{len(drawn)} random samples below (`shardkit show` writes a page of them with statistics)."
    )
    return render_fragment(summary=summary, cards=render_cards(sorted(drawn, key=lambda s: s.number), context))


def _class_names(dataset: RandomAccess) -> tuple[str, ...] | None:
    manifest = dataset.manifest
    return None if manifest is None else manifest.class_names
