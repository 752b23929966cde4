"""A DataLoader for :class:`~shardkit.ShardDataset` with good defaults."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import (
    DataLoader,
    IterableDataset,
    default_collate,
    default_convert,
    get_worker_info,
)

from shardkit.errors import UsageError, WorkerStartError
from shardkit.read import block_output, stats
from shardkit.read.dataset import NO_LENGTH_MESSAGE, ShardDataset
from shardkit.read.frameworks import REBUILT_LOADER_MESSAGE, called_by_accelerate
from shardkit.read.loader_stats import LoaderStats, timed_batches
from shardkit.read.resume.state import Level, ReaderState, start_for
from shardkit.read.collate import collate_samples
from shardkit.read.worker_start import DEFAULT_STALL_S, StartWatch
from shardkit.world import World, detect_worker

log = logging.getLogger(__name__)


def supports_out_of_order() -> bool:
    """Whether the installed torch's DataLoader takes ``in_order=``."""
    return "in_order" in inspect.signature(DataLoader.__init__).parameters


def fork_can_deadlock(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    """Whether this CPython's forked child can hang before it runs any code
    when another thread held the interpreter's thread-state lock at the fork
    (CPython gh-112275). It is fixed in 3.12 and in 3.11.10; 3.10 is not
    known to be fixed."""
    return version < (3, 11, 10)


def _start_context(loader: DataLoader) -> Any:
    """The ``multiprocessing`` context that starts ``loader``'s workers
    (the DataLoader's default when it was given none)."""
    return loader.multiprocessing_context or multiprocessing.get_context()


def fork_hazard(loader: DataLoader) -> str | None:
    """Why starting ``loader``'s workers by ``fork`` here may hang, or None.

    torch.distributed's gloo thread makes and drops a Python thread state
    after each collective (it releases the tensors' Python objects), taking
    the interpreter's thread-state lock; a DataLoader worker forked at that
    moment can hang before its first line on CPython versions that
    :func:`fork_can_deadlock`. Lightning starts its loader's workers right
    after such collectives.
    """
    if loader.num_workers == 0 or not fork_can_deadlock():
        return None
    if _start_context(loader).get_start_method() != "fork":
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return (
        f"DataLoader workers are started by fork beside torch.distributed's threads, and on Python "
        f"{'.'.join(map(str, sys.version_info[:3]))} a worker forked while such a thread holds the interpreter's "
        "thread-state lock can hang before it starts (CPython gh-112275, fixed in 3.11.10 and 3.12): upgrade "
        "Python, or pass make_loader(..., multiprocessing_context=\"forkserver\") (the script then needs an "
        "`if __name__ == \"__main__\":` guard)"
    )


@functools.cache
def _warn_fork_hazard(message: str) -> None:
    log.warning(message)  # once per process


def default_num_workers() -> int:
    """Workers to use when not told: up to 4, leaving a core for the trainer."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


class _TaggedCollate:
    """Collates tagged items ``(worker, delivered count, item)`` and keeps
    the tag of the batch's last item (picklable for spawned workers). With
    loader statistics the tags hold a fourth part: an item's record, or
    None where the batch takes one record for all its items, with its
    collation timed."""

    def __init__(self, collate: Callable[[Any], Any], *, batched: bool):
        self.collate = collate
        self.batched = batched

    def __call__(self, data: Any) -> tuple[Any, ...]:
        if not self.batched:
            if len(data) == 3:
                worker, count, item = data
                return worker, count, self.collate(item)
            worker, count, item, record = data
            return worker, count, self.collate(item), record
        if len(data[-1]) == 3:
            return data[-1][0], data[-1][1], collate_samples([item[2] for item in data], collate=self.collate)
        clock = stats.current  # set in this process for the whole iteration (_TaggedSlots)
        samples = [item[2] for item in data]
        collate = functools.partial(collate_samples, collate=self.collate)
        if clock is None:
            return data[-1][0], data[-1][1], collate(samples), None
        batch, record = stats.collated(collate, samples, clock)  # the batch's record: its samples' time and its own
        return data[-1][0], data[-1][1], batch, record


def _tagged(items: Iterator[tuple[int, Any]], worker: int) -> Iterator[tuple[int, int, Any]]:
    for count, item in items:
        yield worker, count, item


def _tagged_timed(items: Iterator[tuple[int, Any]], clock: stats.StageClock, *, batched: bool) -> Iterator[tuple[Any, ...]]:
    """:func:`_tagged`, each item with the record of its time (loader
    statistics); where the DataLoader batches the items, the batch's
    collation takes one record for them all (:class:`_TaggedCollate`)."""
    for count, item in items:
        yield clock.worker, count, item, None if batched else clock.take()


class _TaggedSlots(IterableDataset):
    """What a :class:`ShardLoader` iterates: its dataset's slot streams,
    each item tagged ``(worker, delivered count, item)``.

    It also carries a resume start to the workers: the loader sets
    :attr:`resume` and :attr:`shift` just before its workers start, and each
    worker's copy uses them for one iteration. Picklable whenever the
    dataset is (``spawn`` and ``forkserver`` workers get a copy, sharing the
    dataset's epoch and skip counter).

    Args:
        dataset: The dataset.
    """

    def __init__(self, dataset: ShardDataset):
        super().__init__()
        self.dataset = dataset
        #: A loaded state for the next iteration, or None.
        self.resume: ReaderState | None = None
        #: With :attr:`resume`: worker process ``i`` reads slot ``(i + shift) % num_workers``,
        #: so that the first batch comes from the slot the interrupted run would have taken
        #: next (a DataLoader starts each iteration with worker 0).
        self.shift = 0
        #: The start flags of the workers being started, or None.
        self.start: StartWatch | None = None
        #: Whether items carry a record of their time (``make_loader(..., stats=True)``).
        self.stats = False
        #: Whether the DataLoader batches the items (set by the loader).
        self.batched = False
        #: Whether batches with boundaries may cross as objects that unpickle
        #: into them: the loader converts items with ``default_convert``,
        #: which leaves those be (set by the loader; see
        #: :data:`.block_output.lean_handoff`).
        self.lean_handoff = False

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """The dataset's :meth:`~ShardDataset.set_epoch` (``loader.dataset.set_epoch``
        as with any DataLoader).

        Raises:
            UsageError: accelerate calls it: ``accelerator.prepare`` rebuilt
                the loader around this wrapper.
        """
        frame = inspect.currentframe()
        rebuilt = called_by_accelerate(frame.f_back if frame is not None else None)
        del frame
        if rebuilt:
            raise UsageError(REBUILT_LOADER_MESSAGE)
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        info = get_worker_info()
        if self.start is not None and info is not None:
            self.start.mark_started(info.id)
        if info is not None:
            block_output.lean_handoff = self.lean_handoff
        dataset = self.dataset
        world = detect_worker(dataset.world)
        epoch = dataset.epoch
        resume, self.resume = self.resume, None
        base: tuple[Level, ...] = ()
        count = 0
        if resume is not None and resume.epoch == epoch:
            if world.num_workers > 1:
                world = world.with_worker((world.worker + self.shift) % world.num_workers, world.num_workers)
            base, count = start_for(resume, world)
        if not self.stats:
            # The dataset's own slot stream: the loader is its companion in this package.
            return _tagged(dataset._items(world, epoch=epoch, base=base, count=count), world.worker)
        stats.current = clock = stats.StageClock(world.worker)  # the reader's stages time themselves as they are built
        try:
            items = dataset._items(world, epoch=epoch, base=base, count=count)
        except BaseException:
            stats.current = None
            raise
        return _tagged_timed(items, clock, batched=self.batched)


class ShardLoader(DataLoader):
    """A DataLoader over a :class:`~shardkit.ShardDataset` that can checkpoint.

    Built by :func:`make_loader`. Each batch arrives from its worker with
    that worker's delivered-sample count; the loader keeps the count of the
    last batch each worker handed to the caller, so :meth:`state_dict`
    describes exactly what the training loop received (not what workers had
    prefetched), with any ``in_order`` setting. Per batch this costs one
    tuple; nothing is gathered until :meth:`state_dict` is called.

    Workers that never start (stuck before running any code, see
    :mod:`~shardkit.read.worker_start`) are stopped after
    ``worker_start_timeout_s`` seconds without CPU, and iterating raises
    :class:`~shardkit.errors.WorkerStartError` instead of waiting forever.

    Attributes:
        shard_dataset: The dataset given to :func:`make_loader` (``dataset``
            is a wrapper over it that tags its items).
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        batch_size: int | None,
        worker_start_timeout_s: float | None = DEFAULT_STALL_S,
        collate_fn: Callable[[Any], Any] | None = None,
        stats: bool = False,
        **kwargs: Any,
    ):
        batched = batch_size is not None
        collate = _TaggedCollate(collate_fn or (default_collate if batched else default_convert), batched=batched)
        self._slots = _TaggedSlots(dataset)
        self._slots.stats, self._slots.batched = stats, batched
        self._slots.lean_handoff = collate_fn is None and not batched
        self._stats = LoaderStats() if stats else None
        super().__init__(self._slots, batch_size=batch_size, collate_fn=collate, **kwargs)
        self.shard_dataset = dataset
        self._epoch = -1
        self._base: tuple[Level, ...] = ()
        self._counts: list[int] = []
        self._next = [0]  # the worker (slot) whose batch comes next
        self._started = False
        self._start_timeout_s = worker_start_timeout_s
        self._start_watch: StartWatch | None = None
        self._resumed_len: tuple[int, int] | None = None  # (epoch, len) of an iteration that resumed

    def _world(self) -> World:
        return self.shard_dataset.world.with_worker(0, max(self.num_workers, 1))

    def __len__(self) -> int:
        """Items this rank's loader yields per epoch: batches, or samples
        when nothing batches. Each worker batches its own share of the
        epoch, so every worker may end with a partial batch: counted per
        worker, this is exact, where ``ceil(samples / batch_size)`` (what a
        plain DataLoader reports) can fall short by up to a batch per
        worker. An upper bound when ``select=`` drops samples.

        After :meth:`load_state_dict`, for the resumed epoch (before its
        iteration starts, when trainers and progress bars ask, and while it
        runs), it counts what is left of that epoch: each worker's share
        less the samples the state says it delivered, batched as the resumed
        workers batch it. Every later epoch counts whole again. A state
        saved under another topology (world size or worker count), or
        resumed from one, leaves shares that only replaying its buffers
        tells: there it stays the whole epoch's count.

        Raises:
            TypeError: The epoch is endless (``mode="infinite"``) or its
                sample counts are unknown.
        """
        dataset = self.shard_dataset
        resumed = self._resumed_len
        if resumed is not None and self._started and resumed[0] == dataset.epoch == self._epoch:
            return resumed[1]
        counts = dataset.samples_per_worker(max(self.num_workers, 1))
        if counts is None:
            raise TypeError(NO_LENGTH_MESSAGE)
        counts = self._left_after_resume(counts)
        if self.batch_size is not None:
            size, partial = self.batch_size, not self.drop_last
        elif dataset.batch_size is not None:
            size, partial = dataset.batch_size, dataset._slots.output.partial_batches  # its companion, as in _items
        else:
            return sum(counts)
        return sum(-(-count // size) if partial else count // size for count in counts)

    def _left_after_resume(self, counts: list[int]) -> list[int]:
        """Each worker's samples left of the epoch when a loaded state of
        this epoch is waiting for the next iteration (``counts``: the whole
        epoch's), else ``counts`` as they are. Only a state of this
        topology, with no earlier topology in it, is counted here."""
        dataset = self.shard_dataset
        pending = dataset._pending  # its companion, as in __iter__ (which takes it)
        if pending is None or pending.epoch != dataset.epoch:
            return counts
        world = self._world()
        left = []
        for worker, share in enumerate(counts):
            base, delivered = start_for(pending, world.with_worker(worker, world.num_workers))
            if base:  # the slots split a remainder of other slots' reading
                return counts
            left.append(max(share - delivered, 0))
        return left

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset = self.shard_dataset
        world = self._world()
        epoch = dataset.epoch
        self._resumed_len = None
        if dataset._pending is not None and dataset._pending.epoch == epoch:
            with contextlib.suppress(TypeError):  # endless, or no counts: no length to keep
                self._resumed_len = (epoch, len(self))
        resume = dataset._take_pending(epoch)
        base: tuple[Level, ...] = ()
        counts = [0] * world.num_workers
        shift = 0
        if resume is not None:
            starts = [start_for(resume, world.with_worker(w, world.num_workers)) for w in range(world.num_workers)]
            base = starts[0][0]
            counts = [count for _, count in starts]
            if len(base) == len(resume.levels) - 1:  # the same topology: keep the order of workers
                shift = resume.levels[-1].first_worker(world.rank)
        self._slots.resume, self._slots.shift = resume, shift
        watch = self._watch_new_workers()
        try:
            batches = super().__iter__()  # workers start here, each with its copy of the start
        finally:
            self._slots.resume, self._slots.shift, self._slots.start = None, 0, None
        if watch is not None:
            watch.watch(batches)
            self._start_watch = watch
        self._epoch, self._base, self._counts, self._started = epoch, base, counts, True
        self._next = [shift]
        unwrapped = self._unwrap(batches, counts, self._next, world.num_workers, self._start_watch)
        return unwrapped if self._stats is None else timed_batches(unwrapped, self._stats)

    def stats(self) -> LoaderStats:
        """Where this loader's time went so far, over all its iterations
        (see :class:`~shardkit.read.loader_stats.LoaderStats`).

        Raises:
            UsageError: The loader was made without ``stats=True``.
        """
        if self._stats is None:
            raise UsageError("this loader keeps no statistics: build it with make_loader(..., stats=True)")
        return self._stats

    def _watch_new_workers(self) -> StartWatch | None:
        """Start flags for the workers this iteration starts, if it starts
        any (persistent workers start once), and warns of a fork hazard."""
        if self.num_workers == 0 or (self.persistent_workers and getattr(self, "_iterator", None) is not None):
            return None
        if (hazard := fork_hazard(self)) is not None:
            _warn_fork_hazard(hazard)
        if not self._start_timeout_s:
            return None
        self._slots.start = StartWatch(
            self.num_workers, context=_start_context(self), stall_s=self._start_timeout_s, cause=hazard
        )
        return self._slots.start

    @staticmethod
    def _unwrap(
        batches: Iterator[tuple[int, int, Any]],
        counts: list[int],
        turn: list[int],
        num_slots: int,
        watch: StartWatch | None,
    ) -> Iterator[Any]:
        try:
            for tagged in batches:  # (worker, count, batch), or with loader statistics (..., record)
                worker = tagged[0]
                counts[worker] = tagged[1]
                turn[0] = (worker + 1) % num_slots
                yield tagged[2] if len(tagged) == 3 else tagged[2:]
        except RuntimeError as exc:  # the DataLoader's report of a worker the watch stopped
            if watch is None or watch.failure is None:
                raise
            raise WorkerStartError(watch.failure) from exc

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: after the last batch handed to the caller.

        Returns:
            A small JSON-serializable dict. Each rank saves its own; to resume
            with another world size or worker count, combine all ranks' with
            :func:`shardkit.read.resume.merge_states` (or
            :func:`shardkit.read.resume.gather_states`).
        """
        dataset = self.shard_dataset
        if not self._started or self._epoch != dataset.epoch:
            return dataset.state_dict()
        return dataset._rank_state(
            self._epoch,
            base=self._base,
            world=self._world(),
            counts=list(self._counts),
            next_worker=self._next[0],
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` at the next iteration.

        Raises:
            UsageError: The loader's worker processes are already running
                (persistent workers keep their copy of the dataset): load
                before the first iteration, or build a new loader.
            StateError: See :meth:`ShardDataset.load_state_dict`.
        """
        if self._started and self.num_workers > 0 and self.persistent_workers:
            raise UsageError(
                "load_state_dict() must come before this loader's first iteration: its persistent workers "
                "already hold the dataset. Build a new loader with make_loader() and load the state into it."
            )
        self.shard_dataset.load_state_dict(state)
        # Check the topology now rather than in a worker.
        parsed = ReaderState.from_dict(state)
        world = self._world()
        for worker in range(world.num_workers):
            start_for(parsed, world.with_worker(worker, world.num_workers))
        self._started = False


def _order_needed_by(dataset: ShardDataset) -> str | None:
    """What about ``dataset`` makes ranks agree on a step's batch only when
    batches are delivered in worker order (None: nothing does).

    Out of order, the batch a rank takes at step s is whichever of its
    workers finished first: timing, which differs between processes. Each
    rank's multiset of batches is still right, so plain data parallelism
    does not care; these do:

    * ``replication > 1``: the ranks of a tensor- or sequence-parallel
      group read the same samples and must take the same batch each step;
    * ``batching="per_stream"``: every rank's batch at a step must be of
      the same stream.
    """
    replication = dataset._split.replication  # its companion, as in _items
    if replication > 1:
        return f"replication={replication} (ranks of a group must take identical batches)"
    if dataset.options.batching == "per_stream":
        return "batching='per_stream' (every rank's batch at a step must be of the same stream)"
    return None


def make_loader(
    dataset: ShardDataset,
    *,
    batch_size: int | None = None,
    num_workers: int | None = None,
    persistent_workers: bool = True,
    pin_memory: bool = False,
    prefetch_factor: int = 2,
    in_order: bool | None = None,
    drop_last: bool = False,
    timeout_s: float = 0,
    multiprocessing_context: Any = None,
    worker_start_timeout_s: float | None = DEFAULT_STALL_S,
    collate_fn: Callable[[Any], Any] | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
    stats: bool = False,
) -> ShardLoader:
    """Build a DataLoader over a ShardDataset, with checkpointing.

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
            than as soon as ready. None: False, unless ranks must agree on
            each step's batch, which they do only in order: ranks read in
            groups (``replication > 1``), or batches are per stream
            (``batching="per_stream"``). There False is refused.
        drop_last: Drop each worker's last partial DataLoader batch.
        timeout_s: Seconds to wait for a batch before raising (0: forever).
        multiprocessing_context: Passed to the DataLoader (e.g. ``"spawn"``).
        worker_start_timeout_s: A worker that has not started iterating and
            has used no CPU for this many seconds is stuck (e.g. a fork that
            hangs, see :func:`fork_hazard`): it is stopped and iterating
            raises :class:`~shardkit.errors.WorkerStartError`. None or 0:
            wait forever.

        collate_fn: As the DataLoader's: makes a batch of ``batch_size``
            samples (default ``default_collate``, with a clear error for
            images of different sizes), or converts each item when
            ``batch_size`` is None (default ``default_convert``). Checkpoints
            count samples, so any collation keeps them exact.
        worker_init_fn: As the DataLoader's: called with the worker id in
            each worker process before it reads.
        stats: Time each stage of each worker (waiting for bytes, parsing,
            decode, ``map``, collate), the hand-off and the loop's waits,
            and find stalls behind a slow worker: ``loader.stats()`` (a
            :class:`~shardkit.read.loader_stats.LoaderStats`). Off, nothing
            is timed.

    Returns:
        A :class:`ShardLoader` (a DataLoader with ``state_dict()`` /
        ``load_state_dict()``).

    Raises:
        UsageError: Batching asked for both here and in the dataset, or
            ``in_order=False`` where ranks must agree on each batch.
    """
    if batch_size is not None and dataset.batch_size is not None:
        raise UsageError("the dataset already batches (batch_size=...); leave make_loader's batch_size None")
    workers = default_num_workers() if num_workers is None else num_workers
    if workers < 0:
        raise UsageError(f"num_workers must be >= 0, not {workers}")
    ordered_by = _order_needed_by(dataset)
    if in_order is None:
        in_order = ordered_by is not None
    elif ordered_by is not None and not in_order:
        raise UsageError(
            f"{ordered_by} needs in-order delivery: at step s every rank takes worker s % num_workers's batch, "
            "and only in order is that batch the same on the ranks that must agree. Leave in_order at its "
            "default (True here)"
        )
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs.update(
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            multiprocessing_context=multiprocessing_context,
        )
        if supports_out_of_order():
            kwargs["in_order"] = in_order
    return ShardLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
        timeout=timeout_s,
        worker_start_timeout_s=worker_start_timeout_s,
        collate_fn=collate_fn,
        worker_init_fn=worker_init_fn,
        stats=stats,
        **kwargs,
    )
