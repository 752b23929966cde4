"""The writer users roll by hand before shardkit (BACKGROUND.md, field note 4).

Shuffle the items with a seed, deal them into ``num_shards`` lists, and give a
``multiprocessing.Pool`` of ``num_workers`` processes one task per shard: call
``map_func`` on each of that shard's items and write what it returns with one
``webdataset.TarWriter``. No manifest, no temporary names, no checksums: the
baseline shardkit's writer must match at 2 workers.
"""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Callable, Sequence
from typing import Any

import webdataset as wds

MapFunc = Callable[[Any], Any]


def _write_shard(task: tuple[str, list[Any], MapFunc]) -> int:
    """One pool task: map and write one shard; the number of samples written."""
    path, items, map_func = task
    written = 0
    with wds.TarWriter(path) as sink:
        for item in items:
            result = map_func(item)
            if result is None:  # the function dropped this item
                continue
            for sample in [result] if isinstance(result, dict) else result:
                sink.write(sample)
                written += 1
    return written


def make_wds_shards(
    pattern: str,
    num_shards: int,
    num_workers: int,
    samples: Sequence[Any],
    map_func: MapFunc,
    *,
    seed: int = 0,
) -> int:
    """Write ``samples``, each through ``map_func``, as ``num_shards`` tar files.

    Args:
        pattern: Path of shard ``i`` as ``pattern % i``, e.g. ``"out/shard-%06d.tar"``.
        num_shards: Tar files to write (a shard may be empty when there are fewer items).
        num_workers: Processes of the pool.
        samples: The items; a shuffled copy is dealt round-robin into the shards.
        map_func: A picklable function from an item to a sample dict, None (dropped),
            or a list of sample dicts.
        seed: Seed of the shuffle.

    Returns:
        The number of samples written.
    """
    order = list(samples)
    random.Random(seed).shuffle(order)
    tasks = [(pattern % shard, order[shard::num_shards], map_func) for shard in range(num_shards)]
    with multiprocessing.Pool(num_workers) as pool:
        return sum(pool.imap_unordered(_write_shard, tasks))
