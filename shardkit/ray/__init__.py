"""Ray Data and shardkit datasets: :func:`read_shards` and :func:`write_shards`.

::

    import shardkit.ray
    ds = shardkit.ray.read_shards("s3://bucket/train/")          # ray.data.Dataset, one row per sample
    shardkit.ray.write_shards(ds, "s3://bucket/out/", max_samples=10_000)   # a shardkit dataset

Rows have a ``__key__`` column (str) and one column per member extension
(``jpg``, ``cls``...) holding the member's bytes. Importing this module needs
no Ray; calling its functions does (``pip install 'shardkit[ray]'``).

The writer engine for ``shardkit write --engine ray`` lives in
:mod:`shardkit.write.engine_ray`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardkit.io.base import SourceOptions
from shardkit.write.engine_ray import require_ray

if TYPE_CHECKING:
    from shardkit.format.manifest import Manifest

__all__ = ["read_shards", "write_shards"]

#: With Ray choosing the number of blocks, the smallest sample range cut out of a shard.
MIN_RANGE_BYTES = 32 << 20


def read_shards(
    source: str,
    *,
    override_num_blocks: int | None = None,
    source_options: SourceOptions | None = None,
    target_block_bytes: int = 64 << 20,
) -> Any:
    """Read a shardkit dataset as a ``ray.data.Dataset``, one row per sample.

    One read task per shard, or per sample range of a shard when the dataset
    has fewer shards than the requested number of blocks (the ranges come
    from the shards' offset indexes; when Ray picks the number of blocks, a
    shard is cut into ranges of at least ``MIN_RANGE_BYTES``, 32 MiB). Row counts and sizes come from the
    manifest, so Ray samples nothing to estimate them.

    Args:
        source: The dataset folder or its ``manifest.json``: a local path
            (on a file system every node shares), ``http(s)://``, ``s3://``
            or another fsspec URL. A manifest is required (a bare list of
            shards has no counts to plan read tasks with: write one with
            ``shardkit write SHARDS DEST``).
        override_num_blocks: Read tasks to aim for, met by cutting shards
            into sample ranges however small (Ray's own choice when None).
        source_options: How remote shards are read (timeouts, retries, S3
            endpoint); defaults when None.
        target_block_bytes: A read task hands Ray a block each time it has
            read this many bytes (default 64 MiB).

    Returns:
        A ``ray.data.Dataset`` with columns ``__key__`` (string) and one
        binary column per extension in the manifest (null where a sample
        lacks that member).

    Raises:
        ImportError: Ray is not installed.
        ManifestError: No manifest at ``source``.
    """
    ray = require_ray()
    from shardkit.ray.datasource import ShardkitDatasource

    datasource = ShardkitDatasource(
        source,
        source_options=source_options or SourceOptions(),
        target_block_bytes=target_block_bytes,
        min_range_bytes=0 if override_num_blocks else MIN_RANGE_BYTES,
    )
    return ray.data.read_datasource(datasource, override_num_blocks=override_num_blocks)


def write_shards(
    dataset: Any,
    dest: str,
    *,
    max_samples: int | None = None,
    max_bytes: int | None = None,
    key_column: str = "__key__",
    overwrite: bool = False,
    max_retries: int = 3,
) -> Manifest:
    """Write a ``ray.data.Dataset`` as a shardkit dataset (shards, indexes, manifest).

    See :mod:`shardkit.ray.sink` for what decides each shard's contents and
    how to make the output reproducible byte for byte.

    Args:
        dataset: Rows with a string ``key_column`` and one column per member
            extension; values are bytes, str, int, float, dict or list (see
            :func:`shardkit.format.codecs.encode_value`); null values leave
            the member out. Columns named ``__*`` other than the key are
            dropped (``__url__`` from ``read_webdataset``).
        dest: Output folder on a file system every node shares, or an
            ``s3://`` or other fsspec URL.
        max_samples: Most samples per shard.
        max_bytes: Most bytes per shard (the tar's size); None means no
            limit. At least one limit is needed.
        key_column: The column holding sample keys.
        overwrite: Replace an earlier shardkit dataset at ``dest`` (which
            may be the dataset ``dataset`` reads: every block is read
            before anything there is removed).
        max_retries: Retries of a failed shard task before the write stops.

    Returns:
        The written :class:`~shardkit.format.manifest.Manifest`.

    Raises:
        ImportError: Ray is not installed.
        UsageError: No limit given, or rows without a usable key.
        DestinationError: ``dest`` holds a dataset and ``overwrite`` is off.
    """
    require_ray()
    from shardkit.ray.sink import write_dataset_shards

    return write_dataset_shards(
        dataset,
        dest,
        max_samples=max_samples,
        max_bytes=max_bytes,
        key_column=key_column,
        overwrite=overwrite,
        max_retries=max_retries,
    )
