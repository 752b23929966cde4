"""Per-sample token counts, as the dataset records them (issue #55).

``shardkit write`` and ``shardkit index`` record, for each 1-D integer
``.npy`` field (``token_fields`` in the manifest), every sample's token
count in its shard's offset index and each shard's total in the shard
table. :func:`token_counts` hands them over without reading a sample: what
a token-budget sampler, a length histogram or a packing plan needs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from shardkit.format.manifest import Manifest
from shardkit.io.base import SourceOptions
from shardkit.read.catalog import resolve_catalog


def token_counts(
    dataset: str | os.PathLike[str] | Sequence[str] | Manifest,
    field: str,
    *,
    shard: int | None = None,
    source_options: SourceOptions | None = None,
) -> np.ndarray:
    """Each sample's token count of ``field``, in dataset order (int64).

    Args:
        dataset: A dataset folder, manifest, URL or :class:`Manifest`.
        field: A recorded token field, e.g. ``"tokens.npy"``.
        shard: One shard's samples only (its number), instead of all.
        source_options: How to read a remote dataset's offset indexes.

    Samples removed with ``shardkit remove`` are left out, as every reader
    leaves them out: entry ``i`` is sample ``i`` of ``IndexedDataset``. The
    whole dataset's counts take 8 bytes a sample (each shard's offset index
    is read once, its counts checked against the shard table's total).

    Raises:
        UsageError: The dataset records no counts of ``field`` (naming the
            ones it records, and how to record them).
        IndexError: ``shard`` is out of range.
        CorruptShardError: An index's counts disagree with the table.
    """
    options = source_options or SourceOptions()
    catalog = resolve_catalog(dataset, options=options)
    if shard is not None:
        return catalog.document_tokens(int(shard), field, options=options)
    catalog.shard_tokens(field)  # refuses an unrecorded field before anything is read
    starts = catalog.starts
    out = np.empty(int(starts[-1]), dtype=np.int64)
    for number in range(catalog.num_shards):
        lo, hi = int(starts[number]), int(starts[number + 1])
        if hi > lo:
            out[lo:hi] = catalog.document_tokens(number, field, options=options)
    return out
