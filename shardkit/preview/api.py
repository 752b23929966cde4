""":func:`shardkit.show` and the page file of ``shardkit show``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

from shardkit.io.atomic import atomic_write_bytes
from shardkit.io.base import SourceOptions
from shardkit.io.urls import redact_url
from shardkit.preview.build import ShowOptions, notebook_html, page_html
from shardkit.read.indexed import IndexedDataset
from shardkit.read.notebook import INDEXED, STREAM, register_notebook_view

if TYPE_CHECKING:
    from shardkit.format.manifest import Manifest
    from shardkit.read.catalog import ShardCatalog


class _Streamed(Protocol):
    """What :func:`stream_html` needs of a :class:`~shardkit.ShardDataset`
    (named so that this module and the dataset's need not import each other)."""

    @property
    def mixture(self) -> Any: ...
    @property
    def catalog(self) -> ShardCatalog: ...
    @property
    def source_options(self) -> SourceOptions: ...


def show(
    dest: str | os.PathLike[str] | Manifest,
    *,
    samples: int = 12,
    seed: int = 0,
    stats_samples: int = 100,
    options: ShowOptions | None = None,
    source_options: SourceOptions | None = None,
    next_seed: int | None = None,
) -> str:
    """A self-contained HTML page of a dataset: random samples as cards and
    its statistics (see docs/show.md).

    The samples are read through the offset index (one ranged read each), so
    the cost does not grow with the dataset. The page embeds everything
    (thumbnails and players as ``data:`` URIs, plots as inline SVG), fetches
    nothing and runs no script; every text from the data is escaped.

    Example::

        html = shardkit.show("shards/train", samples=12)

    Args:
        dest: A dataset folder, its ``manifest.json``, their URL (HTTP,
            ``s3://``, fsspec), the ``--out`` folder of ``shardkit index``,
            or a :class:`~shardkit.Manifest`.
        samples: Samples shown as cards (up to 1,000).
        seed: Seed of the draw: the same seed shows the same samples.
        stats_samples: Samples drawn for the field statistics (member
            sizes, field presence, class balance); the cards are among them.
        options: All of the page's settings and limits
            (:class:`~shardkit.ShowOptions`); when given,
            ``samples``, ``seed`` and ``stats_samples`` are taken from it.
        source_options: Storage options for a remote dataset.
        next_seed: Link to the page of this seed (a served page's "next samples").

    Returns:
        The page, as HTML text.

    Raises:
        UsageError: A bad option; a dataset that cannot be read at random
            (compressed shards, or shards without offset indexes).
        ManifestError: No dataset at ``dest``.
    """
    if options is None:
        options = ShowOptions(samples=samples, seed=seed, stats_samples=stats_samples)
    dataset = IndexedDataset(dest, decode=None, source_options=source_options)
    try:
        return page_html(dataset, name=_name(dest, dataset), options=options, version=_version(), next_seed=next_seed)
    finally:
        dataset.close()


def write_page(path: str | os.PathLike[str], page: str) -> int:
    """Write ``page`` to ``path`` whole or not at all (a temporary file
    renamed); returns its size in bytes."""
    data = page.encode("utf-8")
    atomic_write_bytes(os.fspath(path), data)
    return len(data)


def stream_html(dataset: _Streamed) -> str:
    """A notebook cell's view of a :class:`~shardkit.ShardDataset`: the
    samples of its (first) dataset read at random when it has offset
    indexes, else one line of counts."""
    catalogs = dataset.mixture.catalogs if dataset.mixture is not None else [dataset.catalog]
    catalog = catalogs[0]
    if catalog.manifest is None or not catalog.has_indexes or catalog.compressed:
        from html import escape

        return f"<p>{escape(repr(dataset))} (no offset index: no samples shown)</p>"
    indexed = IndexedDataset(catalog.manifest, decode=None, source_options=dataset.source_options)
    try:
        return notebook_html(indexed)
    finally:
        indexed.close()


def _version() -> str:
    """shardkit's installed version, for the page's footer (asked of the
    package metadata: the package's ``__init__`` is a floor above)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardkit")
    except PackageNotFoundError:
        return "(version unknown)"


def _name(dest: str | os.PathLike[str] | Manifest, dataset: IndexedDataset) -> str:
    """What the page calls the dataset: where its manifest is, credentials taken out."""
    manifest = dataset.manifest
    if manifest is not None and manifest.location is not None:
        return redact_url(manifest.location)
    return redact_url(os.fspath(dest)) if isinstance(dest, (str, os.PathLike)) else "a manifest built in memory"


# The reader's datasets draw themselves in a notebook with these (see shardkit.read.notebook).
register_notebook_view(STREAM, stream_html)
register_notebook_view(INDEXED, notebook_html)
