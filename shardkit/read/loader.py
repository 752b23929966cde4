"""A DataLoader for :class:`~shardkit.ShardDataset` with good defaults."""

from __future__ import annotations

import inspect
import os
from typing import Any

from torch.utils.data import DataLoader

from shardkit.errors import UsageError
from shardkit.read.dataset import ShardDataset


def supports_out_of_order() -> bool:
    """Whether the installed torch's DataLoader takes ``in_order=``."""
    return "in_order" in inspect.signature(DataLoader.__init__).parameters


def default_num_workers() -> int:
    """Workers to use when not told: up to 4, leaving a core for the trainer."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


def make_loader(
    dataset: ShardDataset,
    *,
    batch_size: int | None = None,
    num_workers: int | None = None,
    persistent_workers: bool = True,
    pin_memory: bool = False,
    prefetch_factor: int = 2,
    in_order: bool = False,
    drop_last: bool = False,
    timeout_s: float = 0,
    multiprocessing_context: Any = None,
) -> DataLoader:
    """Build a DataLoader over a ShardDataset.

    Defaults: a few persistent workers (so worker start-up and the read-ahead
    threads are paid once, and :meth:`ShardDataset.set_epoch` still reaches
    them), and out-of-order delivery where torch supports it (``in_order=False``)
    so one slow worker does not hold back batches the others have ready.
    Out-of-order delivery keeps each worker's sequence deterministic but not
    the interleaving between workers; pass ``in_order=True`` for a fully
    reproducible order.

    Args:
        dataset: The dataset.
        batch_size: Batch in the DataLoader (default collation); None yields
            what the dataset yields (use ``ShardDataset(batch_size=...)`` to
            batch inside workers instead).
        num_workers: Worker processes; default :func:`default_num_workers`.
            0 loads in the calling process.
        persistent_workers: Keep workers alive between epochs.
        pin_memory: Copy batches into pinned memory (for CUDA training).
        prefetch_factor: Items each worker prepares ahead.
        in_order: Deliver in worker round-robin order (deterministic) rather
            than as soon as ready.
        drop_last: Drop each worker's last partial DataLoader batch.
        timeout_s: Seconds to wait for a batch before raising (0: forever).
        multiprocessing_context: Passed to the DataLoader (e.g. ``"spawn"``).

    Raises:
        UsageError: Batching asked for both here and in the dataset.
    """
    if batch_size is not None and dataset.batch_size is not None:
        raise UsageError("the dataset already batches (batch_size=...); leave make_loader's batch_size None")
    workers = default_num_workers() if num_workers is None else num_workers
    if workers < 0:
        raise UsageError(f"num_workers must be >= 0, not {workers}")
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs.update(
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            multiprocessing_context=multiprocessing_context,
        )
        if supports_out_of_order():
            kwargs["in_order"] = in_order
    return DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
        timeout=timeout_s,
        **kwargs,
    )
