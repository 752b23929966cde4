"""Writing a ``ray.data.Dataset`` as a shardkit dataset (behind :func:`shardkit.ray.write_shards`).

How it runs:

1. The dataset is executed into its blocks (``Dataset.to_arrow_refs``), in
   the dataset's block order. The whole dataset then sits in Ray's object
   store (which spills to local disk beyond its memory) until the shards are
   written: cutting shards across blocks needs every row's size first.
2. One small Ray task per block measures each row's encoded tar size.
3. The driver cuts the rows, in block order, into shards that respect
   ``max_samples`` / ``max_bytes`` (:func:`plan_pieces`, a pure function of
   the sizes), named ``shard-000000.tar``, ``shard-000001.tar``... in order.
4. One Ray task per shard (with retries) fetches its rows from the blocks and
   writes the shard with shardkit's tar encoding, offset index and checksum,
   and publishes it with the writer's one publish step
   (:class:`~shardkit.write.publisher.ShardPublisher`): in place on a shared
   file system, or staged on its node and uploaded to ``s3://``/fsspec.
5. The manifest is written last, by the driver.

What decides the bytes: the rows and their order, block by block. The
shards are a pure function of that sequence and the limits (members sorted by
extension, fixed header fields, names by position), so the same rows in the
same order give the same bytes. Ray keeps a dataset's order only when asked:
for a reproducible output set
``ray.data.DataContext.get_current().execution_options.preserve_order = True``
and feed a deterministic pipeline (``read_shards`` of a shardkit dataset, a
seeded ``random_shuffle(seed=...)``, ``sort("__key__")``); without it, blocks
from parallel tasks may arrive in any order and the samples land in other
shards (every sample is still written exactly once).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.format.manifest import Manifest, ShardEntry
from shardkit.format.tar import END_OF_ARCHIVE, encoded_sample_size
from shardkit.io.base import Destination
from shardkit.io.registry import open_destination
from shardkit.write.encode import sample_fields
from shardkit.write.destination import (
    check_destination,
    holding_destination,
    output_error,
    prepare_destination,
    shard_name,
)
from shardkit.write.engine_ray import check_nodes_see
from shardkit.write.limits import ShardLimits
from shardkit.write.publisher import ShardPublisher
from shardkit.write.publish import publish_manifest
from shardkit.write.shard import ShardFile
from shardkit.write.upload import refuse_existing_dataset

#: One shard's rows: ``(block number, first row, end row)`` pieces in order.
Pieces = list[tuple[int, int, int]]


def plan_pieces(block_sizes: Sequence[np.ndarray], *, limits: ShardLimits) -> list[Pieces]:
    """Cut rows, in block order, into shards that respect ``limits``.

    Args:
        block_sizes: Per block, each row's encoded tar size in bytes.
        limits: Samples and bytes per shard.

    Returns:
        Per shard, the row ranges of blocks it holds, in order. A row alone
        over ``max_bytes`` gets a shard of its own.
    """
    shards: list[Pieces] = []
    current: Pieces = []
    count = used = 0

    def close() -> None:
        nonlocal current, count, used
        if current:
            shards.append(current)
        current, count, used = [], 0, 0

    def take(block: int, row: int) -> None:
        nonlocal count
        if current and current[-1][0] == block and current[-1][2] == row:
            current[-1] = (block, current[-1][1], row + 1)
        else:
            current.append((block, row, row + 1))
        count += 1

    for block, sizes in enumerate(block_sizes):
        for row, size in enumerate(sizes.tolist()):
            if not limits.fits(count, used, size):
                close()
            take(block, row)
            used += size
            if limits.max_bytes is not None and used + len(END_OF_ARCHIVE) > limits.max_bytes:
                close()
    close()
    return shards


def row_fields(row: dict[str, Any], key_column: str) -> tuple[str, list[tuple[str, bytes]]]:
    """A row as ``(key, [(extension, bytes)...])`` with members sorted by
    extension, encoded as :class:`~shardkit.ShardWriter` encodes a sample
    (numpy columns too); a missing value (None) is left out."""
    key = row.get(key_column)
    if not isinstance(key, str) or not key:
        raise UsageError(
            f"every row needs a non-empty string {key_column!r} column, got {key!r}; "
            "add one, e.g. ds.map(lambda r: {**r, '__key__': f\"{r['id']:08d}\"})"
        )
    return sample_fields(row, key_field=key_column, skip_none=True)


def _rows(table: Any, start: int, end: int) -> list[dict[str, Any]]:
    return table.slice(start, end - start).to_pylist()


def _block_sizes(table: Any, key_column: str) -> np.ndarray:
    """Body of a sizing task: each row's encoded size."""
    sizes = []
    for row in table.to_pylist():
        key, fields = row_fields(row, key_column)
        sizes.append(encoded_sample_size(key, [(ext, len(data)) for ext, data in fields]))
    return np.asarray(sizes, dtype=np.int64)


def _write_piece_shard(
    name: str, pieces: list[tuple[Any, int, int]], publisher: ShardPublisher, key_column: str
) -> tuple[ShardEntry, list[str]]:
    """Body of a shard task: fetch its rows, write one shard and publish it."""
    return publisher.publish(name, lambda folder: _write_pieces(os.path.join(folder, name), pieces, key_column))


def _write_pieces(path: str, pieces: list[tuple[Any, int, int]], key_column: str) -> tuple[ShardEntry, list[str]]:
    import ray

    extensions: set[str] = set()
    try:
        with ShardFile(path) as shard:
            for ref, start, end in pieces:
                for row in _rows(ray.get(ref), start, end):
                    key, fields = row_fields(row, key_column)
                    extensions.update(ext for ext, _ in fields)
                    shard.add(key, fields)
            written = shard.commit()
    except ShardkitError:
        raise
    except OSError as exc:
        raise output_error(exc, path, resume_hint=False) from exc
    return written.entry(), sorted(extensions)


#: write_shards' spelling of the option a refused destination advises (it has no resume).
_FLAGS = (None, "overwrite=True")


def write_dataset_shards(
    dataset: Any,
    dest: str,
    *,
    max_samples: int | None,
    max_bytes: int | None,
    key_column: str,
    overwrite: bool,
    max_retries: int,
) -> Manifest:
    """See :func:`shardkit.ray.write_shards`."""
    if max_samples is None and max_bytes is None:
        raise UsageError("write_shards needs max_samples or max_bytes (or both) to cut shards")
    limits = ShardLimits(max_samples=max_samples, max_bytes=max_bytes)
    destination = open_destination(dest)
    if destination.local_dir is None:
        refuse_existing_dataset(destination, overwrite=overwrite)
        return _write_into(dataset.to_arrow_refs(), destination, limits, key_column, max_retries)
    with holding_destination(destination.local_dir, rerun="stop it and write again"):  # one write at a time
        check_destination(destination.local_dir, overwrite=overwrite, resume=False, flags=_FLAGS)  # before any read
        # Ray Data reads lazily, and the dataset may be this folder's own shards: every block is read
        # before --overwrite removes what the folder holds.
        refs = dataset.to_arrow_refs()
        prepare_destination(destination.local_dir, overwrite=overwrite, resume=False, flags=_FLAGS)
        return _write_into(refs, destination, limits, key_column, max_retries)


def _write_into(
    refs: list[Any], destination: Destination, limits: ShardLimits, key_column: str, max_retries: int
) -> Manifest:
    """:func:`write_dataset_shards` for the dataset's blocks ``refs``, once
    ``destination`` is ready (and held, when local)."""
    import ray

    publisher = ShardPublisher(destination.local_dir or "", url=None if destination.local_dir else destination.url)
    sizer = ray.remote(_block_sizes).options(max_retries=max_retries)
    block_sizes = ray.get([sizer.remote(ref, key_column) for ref in refs])
    plan = plan_pieces(block_sizes, limits=limits)

    writer = ray.remote(_write_piece_shard).options(
        max_retries=max_retries, retry_exceptions=[OSError], name="shardkit_write_shard"
    )
    if not publisher.remote:
        check_nodes_see([], folder=publisher.folder)  # every node writes into it: a shared file system
    futures = [
        writer.remote(shard_name(i), [(refs[b], s, e) for b, s, e in pieces], publisher, key_column)
        for i, pieces in enumerate(plan)
    ]
    try:
        results = ray.get(futures)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ShardkitError):
            raise exc.cause from None
        raise
    extensions = sorted({ext for _, exts in results for ext in exts})
    manifest = Manifest(
        shards=tuple(entry for entry, _ in results),
        extensions=tuple(extensions),
        source={"format": "ray.data"},
        options={"max_samples": limits.max_samples, "max_bytes": limits.max_bytes, "shuffle": False},
        seed=None,
        location=destination.local_dir or destination.url,
    )
    publish_manifest(destination, manifest)
    return manifest
