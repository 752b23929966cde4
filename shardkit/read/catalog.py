"""Turn the reader's ``source`` argument into a list of shards to read.

A :class:`ShardCatalog` is what the split and the stream need: shard URLs,
and, when known, per-shard sample counts and offset-index URLs. With a
manifest all three are known, and the reader splits at sample precision.
With only shard paths (a list or a brace pattern), counts are taken from
local ``.idx`` sidecars when every shard has one; otherwise the reader works
at shard granularity (see :class:`shardkit.ShardDataset`).

Compressed shards (``.tar.gz``, ``.tgz``, ``.tar.zst``) cannot be entered in
the middle, so a catalog with any compressed shard has no counts and no
index URLs: the plan then deals whole shards to slots (shard granularity,
as without a manifest) and the stream reads each from byte 0. A shard is
known to be compressed by its name, and local shards listed with ``.idx``
sidecars also by their first bytes; a compressed shard that passes for a
plain one is still recognised by its magic bytes when read whole (see
:mod:`.pieces`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardkit.errors import ManifestError, UsageError
from shardkit.format.compression import compression_from_name, file_compression
from shardkit.format.index import index_path_for, load_index
from shardkit.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.io.base import SourceOptions
from shardkit.io.manifest import remote_manifest
from shardkit.io.urls import is_local, local_path


@dataclass(frozen=True, eq=False)
class ShardCatalog:
    """The shards a reader reads.

    Attributes:
        urls: Shard paths or URLs, in dataset order.
        counts: Samples per shard, or None when unknown (shard granularity).
        index_urls: Offset-index path or URL per shard, or None when the
            shards have no indexes.
        manifest: The manifest they came from, if any.
        compressed: Whether any shard is known to be compressed; such a
            catalog has no counts or index URLs, so shards are read whole.
    """

    urls: tuple[str, ...]
    counts: np.ndarray | None
    index_urls: tuple[str, ...] | None
    manifest: Manifest | None = None
    compressed: bool = False

    @property
    def num_shards(self) -> int:
        return len(self.urls)

    @property
    def has_indexes(self) -> bool:
        """Whether every shard has an offset index (see :meth:`index_url`)."""
        return self.index_urls is not None

    def url(self, shard: int) -> str:
        """The path or URL of shard number ``shard``."""
        return self.urls[shard]

    def index_url(self, shard: int) -> str:
        """The path or URL of shard number ``shard``'s offset index.

        Raises:
            UsageError: The shards have no indexes (see :attr:`has_indexes`).
        """
        if self.index_urls is None:
            raise UsageError(f"shard {shard} ({self.url(shard)}) has no offset index")
        return self.index_urls[shard]

    @property
    def num_samples(self) -> int | None:
        return None if self.counts is None else int(self.counts.sum())


def _local_shard_is_compressed(path: str) -> bool:
    try:
        return file_compression(path) is not None
    except OSError:
        return False  # reported when the shard is read


def from_manifest(manifest: Manifest, *, options: SourceOptions | None = None) -> ShardCatalog:
    """Catalog of a manifest's shards, resolved inside its base location.

    Args:
        manifest: The manifest.
        options: ``allowed_prefixes`` names locations outside the dataset
            that entries may point to (see :meth:`Manifest.resolve`).

    Raises:
        ManifestError: An entry leaves the dataset and no prefix allows it.
    """
    allowed = () if options is None else options.allowed_prefixes
    shards = range(manifest.num_shards)
    urls = tuple(manifest.shard_url(i, allowed_prefixes=allowed) for i in shards)
    if any(compression_from_name(s.path) for s in manifest.shards):
        return ShardCatalog(urls=urls, counts=None, index_urls=None, manifest=manifest, compressed=True)
    return ShardCatalog(
        urls=urls,
        counts=np.array([s.num_samples for s in manifest.shards], dtype=np.int64),
        index_urls=tuple(manifest.index_url(i, allowed_prefixes=allowed) for i in shards),
        manifest=manifest,
    )


def _from_shard_urls(urls: Sequence[str]) -> ShardCatalog:
    if not urls:
        raise UsageError("no shards given: the shard list or pattern is empty")
    urls = tuple(urls)
    if any(compression_from_name(u) for u in urls):
        return ShardCatalog(urls=urls, counts=None, index_urls=None, compressed=True)
    sidecars = [index_path_for(local_path(u)) for u in urls] if all(is_local(u) for u in urls) else []
    if sidecars and all(os.path.exists(p) for p in sidecars):
        if any(_local_shard_is_compressed(local_path(u)) for u in urls):
            return ShardCatalog(urls=urls, counts=None, index_urls=None, compressed=True)
        counts = np.array([len(load_index(p)) - 1 for p in sidecars], dtype=np.int64)
        return ShardCatalog(urls=urls, counts=counts, index_urls=tuple(sidecars))
    return ShardCatalog(urls=urls, counts=None, index_urls=None)


def expand_pattern(pattern: str) -> list[str]:
    """Expand a brace pattern such as ``shard-{000000..000099}.tar``."""
    import braceexpand

    return list(braceexpand.braceexpand(pattern))


def resolve_catalog(
    source: str | os.PathLike[str] | Sequence[str] | Manifest,
    *,
    options: SourceOptions,
) -> ShardCatalog:
    """Resolve the reader's ``source`` argument.

    Args:
        source: A :class:`Manifest`; a ``manifest.json`` path or URL; a local
            directory holding ``manifest.json`` (or a URL ending in ``/``); a
            brace pattern of shard paths/URLs; one shard path; or a list of
            shard paths/URLs.
        options: How to read remote manifests, and the locations outside
            the dataset a manifest may name (``allowed_prefixes``).

    Raises:
        UsageError: An empty shard list.
        ManifestError: A manifest that is missing or invalid, or that names
            a location outside the dataset.
    """
    if isinstance(source, Manifest):
        return from_manifest(source, options=options)
    if isinstance(source, (list, tuple)):
        return _from_shard_urls([os.fspath(s) for s in source])
    text = os.fspath(source)  # type: ignore[arg-type]
    if "{" in text and "}" in text:
        return _from_shard_urls(expand_pattern(text))
    if is_local(text):
        path = local_path(text)
        if os.path.isdir(path) or path.endswith(".json"):
            return from_manifest(load_manifest(path), options=options)
        if not os.path.exists(path):
            raise ManifestError(f"{path}: no such shard, manifest or dataset directory", path=path)
        return _from_shard_urls([text])
    if text.endswith("/"):
        return from_manifest(remote_manifest(text + MANIFEST_NAME, options), options=options)
    if text.endswith(".json"):
        return from_manifest(remote_manifest(text, options), options=options)
    return _from_shard_urls([text])
