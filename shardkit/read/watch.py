"""Loader statistics for a plain DataLoader: ``shardkit.watch(loader)``.

``make_loader(..., stats=True)`` gathers statistics for a
:class:`~shardkit.ShardDataset`. :func:`watch` does it for any DataLoader
the user built: over an :class:`~shardkit.IndexedDataset` with a sampler,
over a ``ShardDataset``, or over a dataset of their own. It gives the
DataLoader

* a worker init that starts each worker's :class:`~.stats.StageClock`
  (and times an ``IndexedDataset``'s reads, decoder and ``map``, see
  :func:`time_indexed`), calling the user's own init after;
* a collation that times itself and sends the batch with its record,

and iterates it timing the loop's waits into a
:class:`~.loader_stats.LoaderStats`, as ``make_loader`` does. The
DataLoader's other settings stay as they are. For a dataset of the user's
own, only ``collate``, the hand-off and the waits are timed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, get_worker_info

from shardkit.errors import UsageError
from shardkit.read import stats
from shardkit.read.loader_stats import LoaderStats, timed_batches


def time_indexed(dataset: Any, clock: stats.StageClock) -> None:
    """Time an :class:`~shardkit.IndexedDataset`'s stages in this process:
    its reads (a ``pread`` or ranged request and the parse of one sample,
    as ``read``), its decoder and its ``map``, each charged to the sample's
    shard. Other datasets are left alone."""
    from shardkit.read.indexed import IndexedDataset

    if not isinstance(dataset, IndexedDataset) or getattr(dataset, "_timed_by", None) is clock:
        return
    read = IndexedDataset._read.__get__(dataset)

    def timed_read(shard: int, position: int, **kwargs: Any) -> Any:
        clock.shard = dataset.shard_url(shard)
        started = time.monotonic()
        raw = read(shard, position, **kwargs)
        clock.add(stats.READ, time.monotonic() - started)
        clock.samples += 1
        clock.nbytes += raw.end - raw.start
        return raw

    dataset._untimed = (dataset._decoder, dataset._map)
    dataset._read = timed_read  # instance attributes: the class's own methods stay untimed
    if dataset._decoder is not None:
        dataset._decoder = stats.timed_call(dataset._decoder, clock, stats.DECODE)
    if dataset._map is not None:
        dataset._map = stats.timed_call(dataset._map, clock, stats.MAP)
    dataset._timed_by = clock


def untime_indexed(dataset: Any) -> None:
    """Undo :func:`time_indexed` (an in-process iteration that ended)."""
    if getattr(dataset, "_timed_by", None) is None:
        return
    dataset._decoder, dataset._map = dataset._untimed
    for name in ("_read", "_timed_by", "_untimed"):
        vars(dataset).pop(name, None)


class _StartClock:
    """The worker init :func:`watch` gives a DataLoader (picklable)."""

    def __init__(self, user: Callable[[int], None] | None):
        self.user = user

    def __call__(self, worker: int) -> None:
        stats.current = clock = stats.StageClock(worker)
        info = get_worker_info()
        if info is not None:
            time_indexed(info.dataset, clock)
        if self.user is not None:
            self.user(worker)


class _RecordingCollate:
    """The collation :func:`watch` gives a DataLoader: the user's, timed,
    the batch sent with the record of its time (picklable)."""

    def __init__(self, collate: Callable[[Any], Any]):
        self.collate = collate

    def __call__(self, samples: Any) -> tuple[Any, stats.Record | None]:
        clock = stats.current
        if clock is None:  # not started by watch's worker init: nothing to record
            return self.collate(samples), None
        return stats.collated(self.collate, samples, clock)


class WatchedLoader:
    """A DataLoader whose iterations gather statistics (see :func:`watch`);
    everything else is the DataLoader's (``len()``, its attributes)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self._stats = LoaderStats()

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        in_process = self.loader.num_workers == 0
        if in_process:
            _StartClock(None)(0)
            time_indexed(self.loader.dataset, stats.current)  # type: ignore[arg-type]
        ended = functools.partial(untime_indexed, self.loader.dataset) if in_process else None
        return timed_batches(iter(self.loader), self._stats, ended=ended)

    def stats(self) -> LoaderStats:
        """Where the loader's time went so far, over all its iterations."""
        return self._stats


def watch(loader: DataLoader) -> WatchedLoader:
    """``loader``, gathering loader statistics as it is iterated:
    ``watched.stats()`` is a :class:`~shardkit.read.loader_stats.LoaderStats`.
    Call it before the loader's first iteration (its workers take the
    timed worker init and collation when they start).

    Raises:
        UsageError: ``loader`` is not a DataLoader, already started its
            persistent workers, or is a :func:`~shardkit.make_loader`
            loader (pass ``stats=True`` to ``make_loader`` instead).
    """
    from shardkit.read.loader import ShardLoader

    if isinstance(loader, ShardLoader):
        raise UsageError("a make_loader() loader gathers its own statistics: build it with make_loader(..., stats=True)")
    if not isinstance(loader, DataLoader):
        raise UsageError(f"watch() takes a torch DataLoader, not {type(loader).__name__}")
    if getattr(loader, "_iterator", None) is not None:
        raise UsageError("watch() must come before the loader's first iteration: its persistent workers already run")
    loader.collate_fn = _RecordingCollate(loader.collate_fn)
    loader.worker_init_fn = _StartClock(loader.worker_init_fn)
    return WatchedLoader(loader)
