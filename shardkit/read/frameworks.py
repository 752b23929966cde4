"""Training frameworks that split a DataLoader across processes themselves.

A :class:`~shardkit.ShardDataset` splits each epoch across ranks on its own:
under ``torchrun`` each rank reads only its share. Hugging Face
``accelerate`` (and the ``Trainer``, which prepares its loaders with it)
assumes the opposite of a DataLoader over an ``IterableDataset``: that every
process's loader holds the whole stream, which it splits itself. By default
process 0 reads the stream and sends every process its part of each batch
(``DataLoaderDispatcher``); with ``dispatch_batches=False`` every process
reads the stream and keeps its part of each batch (``IterableDatasetShard``).
Over a dataset that read one rank's share either way would lose the rest:
half the samples on two processes.

So the dataset looks at its caller where accelerate first reaches it: the
wrapper's ``set_epoch``, which both call as each of their iterations begins,
before any batch is read, and ``len()``, which the ``Trainer`` asks before
that (:func:`accelerate_split`). A dataset that found its rank for itself
then becomes the whole stream, rank 0 of 1, its DataLoader workers still
dividing it; the same on every process, so with ``dispatch_batches=False``
each process reads the same samples in the same order and accelerate's
slices of each batch partition it. Each process logs once what that costs
(:class:`SplitWatch`). Only a dataset given ``rank=``/``world_size=`` of more
than one rank is refused (:func:`split_again_message`): it was told to read
one rank's share, which accelerate would split again.

What accelerate's split does at the end of an epoch is its own: a batch it
cannot fill is completed by repeating samples from the epoch's start, or
left out with ``drop_last=True`` (:func:`split_cost` counts both). Lightning
needs none of this: it gives a ``DistributedSampler`` only to map-style
datasets and leaves an ``IterableDataset``'s loader as it is.

A loader from :func:`~shardkit.make_loader` cannot be prepared at all:
accelerate builds a new DataLoader from its dataset, a wrapper whose items
are tagged for checkpoints. That wrapper refuses accelerate's ``set_epoch``
call (see :data:`REBUILT_LOADER_MESSAGE`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from shardkit.errors import UsageError
from shardkit.world import World

log = logging.getLogger(__name__)

#: The module whose loaders re-split a dataset.
ACCELERATE_MODULE = "accelerate.data_loader"

#: accelerate's wrapper that reads the stream on process 0 and sends each process its part.
DISPATCHER = "DataLoaderDispatcher"
#: accelerate's wrapper that every process reads the stream through, keeping its part.
#: (Its ``DataLoaderShard`` calling a dataset directly does not split it.)
SHARD = "IterableDatasetShard"

#: Modules of the DataLoaders between accelerate's wrapper and the dataset
#: (``len(loader)`` reaches the dataset through the base loader's ``__len__``).
LOADER_MODULES = ("torch.utils.data.", "torchdata.")

#: How many frames above a wrapper may hold the DataLoader that iterates it.
LOADER_DEPTH = 3


@dataclass(frozen=True)
class AccelerateSplit:
    """How one of accelerate's wrappers splits a dataset's stream.

    Attributes:
        wrapper: :data:`DISPATCHER` or :data:`SHARD`.
        num_processes: Processes the stream is split across (2 or more).
        batch_size: The DataLoader's ``batch_size`` (per process, or the
            whole batch with ``split_batches``); None when it does not batch.
        drop_last: The DataLoader's ``drop_last``.
        split_batches: accelerate's ``split_batches``.
        num_workers: The DataLoader's workers (0: in the process), or None
            when the loader was not found.
    """

    wrapper: str
    num_processes: int
    batch_size: int | None
    drop_last: bool
    split_batches: bool
    num_workers: int | None

    @property
    def dispatches(self) -> bool:
        """Whether process 0 alone reads the stream."""
        return self.wrapper == DISPATCHER


def called_by_accelerate(caller: FrameType | None) -> bool:
    """Whether ``caller`` is code of accelerate's data loaders."""
    return caller is not None and caller.f_globals.get("__name__") == ACCELERATE_MODULE


def accelerate_split(caller: FrameType | None) -> AccelerateSplit | None:
    """How accelerate splits the dataset that ``caller`` called, if ``caller``
    is (or, through a DataLoader's own methods, was called by) one of
    accelerate's wrappers that split its stream across two or more
    processes; else None.

    Args:
        caller: The frame that called the dataset (``set_epoch``'s or ``__len__``'s caller).
    """
    while caller is not None and caller.f_globals.get("__name__", "").startswith(LOADER_MODULES):
        caller = caller.f_back
    if caller is None or not called_by_accelerate(caller):
        return None
    wrapper = caller.f_locals.get("self")
    name = type(wrapper).__name__
    if name == DISPATCHER:  # a DataLoader itself (its attributes are its base loader's)
        processes, loader = wrapper.state.num_processes, wrapper
    elif name == SHARD:  # the dataset of the DataLoader that iterates it
        processes, loader = wrapper.num_processes, _loader_of(wrapper, caller.f_back)
    else:
        return None
    if processes < 2:
        return None
    return AccelerateSplit(
        wrapper=name,
        num_processes=processes,
        batch_size=wrapper.batch_size,
        drop_last=bool(wrapper.drop_last),
        split_batches=bool(wrapper.split_batches),
        num_workers=None if loader is None else loader.num_workers,
    )


def _loader_of(dataset: object, frame: FrameType | None) -> Any:
    """The DataLoader over ``dataset`` whose method is one of the
    :data:`LOADER_DEPTH` frames from ``frame`` up, or None."""
    for _ in range(LOADER_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if getattr(owner, "dataset", None) is dataset and hasattr(owner, "num_workers"):
            return owner
        frame = frame.f_back
    return None


def split_cost(split: AccelerateSplit, worker_counts: Sequence[int]) -> tuple[int, int]:
    """What accelerate's split does to an epoch whose DataLoader workers
    read ``worker_counts`` samples each (worker 0 first): ``(repeated,
    left_out)``, the samples it repeats to complete a batch and those it
    leaves out, over all processes. Follows accelerate 1.x's code:

    * :data:`SHARD` runs in each worker and cuts the worker's stream into
      batches of ``batch_size`` per process; the last one it completes with
      the worker's first samples, or leaves out with ``drop_last``.
    * :data:`DISPATCHER` takes the DataLoader's batches in turn from the
      workers (round-robin, a finished worker skipped) and joins
      ``num_processes`` of them (one with ``split_batches``) into each batch
      it cuts among the processes; a remainder that does not divide is left
      out, but at the very end (without ``drop_last``) completed from the
      epoch's first samples. Each worker's last, short batch can so lose
      samples before the end.

    Args:
        split: The split.
        worker_counts: Samples each DataLoader worker reads this epoch.

    Raises:
        ValueError: ``split`` has no batch size.
    """
    if not split.batch_size:
        raise ValueError("accelerate's split is counted in batches")
    size, processes = split.batch_size, split.num_processes
    if not split.dispatches:
        whole = size if split.split_batches else size * processes
        short = [count % whole for count in worker_counts if count % whole]
        return (0, sum(short)) if split.drop_last else (sum(whole - count for count in short), 0)
    left_out = sum(count % size for count in worker_counts) if split.drop_last else 0
    per_worker = [[size] * (count // size) for count in worker_counts]
    if not split.drop_last:
        per_worker = [batches + [count % size] if count % size else batches for batches, count in zip(per_worker, worker_counts)]
    rounds = range(max(map(len, per_worker), default=0))
    turns = [batches[turn] for turn in rounds for batches in per_worker if turn < len(batches)]
    step = 1 if split.split_batches else processes
    joined = [sum(turns[start : start + step]) for start in range(0, len(turns), step)]
    if split.drop_last and len(turns) % step:
        left_out += joined.pop()
    repeated = 0
    for position, total in enumerate(joined):
        if total % processes and position == len(joined) - 1 and not split.drop_last:
            repeated += processes - total % processes
        else:
            left_out += total % processes
    return repeated, left_out


def split_message(split: AccelerateSplit, cost: tuple[int, int] | None) -> str:
    """The line :func:`note_split` logs: what accelerate's split costs, and
    how to read each sample once.

    Args:
        split: The split.
        cost: :func:`split_cost` for this epoch, or None when it is not known
            (no sample counts, batches made in the dataset, or the loader not
            found).
    """
    if split.dispatches:
        reads = "process 0 reads every sample and sends each process its part of each batch"
    else:
        reads = (
            f"every process reads every sample and keeps its part of each batch ({split.num_processes}x the reading; "
            "the same order on every process)"
        )
    if cost is None:
        end = " accelerate may repeat or leave out a few samples to even out its last batches (not counted here)."
    else:
        repeated, left_out = cost
        parts = [f"repeats {_samples(repeated)} to complete its last batches"] if repeated else []
        parts += [f"leaves out {_samples(left_out)} (batches it cannot fill or divide among the processes)"] if left_out else []
        end = f" This epoch accelerate {' and '.join(parts)}." if parts else ""
    return (
        f"accelerate's {split.wrapper} splits this ShardDataset across {split.num_processes} processes: {reads}, "
        f"so the dataset reads the whole stream (rank 0 of 1; its DataLoader workers still divide it).{end} "
        "shardkit.make_loader(dataset) without accelerator.prepare() reads each sample once, on the process that "
        "trains on it."
    )


def _samples(count: int) -> str:
    return f"{count} sample{'' if count == 1 else 's'}"


@functools.cache
def note_split(message: str) -> None:
    """Log ``message`` (a :func:`split_message`), once per process."""
    log.warning(message)


class SplitWatch:
    """A dataset's side of accelerate's split: whether its rank was given,
    what it can count of the split's cost, and whether it noted the split.

    Args:
        rank_given: The dataset was given ``rank=`` and ``world_size=``.
        endless: Its epochs never end (``mode="infinite"``): no last batch.
        batched: It batches in its workers (accelerate's batches are of
            those batches: not counted).
        replication: Ranks that read as one group (``replication=``).
    """

    def __init__(self, *, rank_given: bool, endless: bool, batched: bool, replication: int = 1):
        self.rank_given = rank_given
        self.replication = replication
        self.endless = endless
        self.batched = batched
        self.noted = False

    def world(self, frame: FrameType | None, world: World, worker_counts: Callable[..., list[int] | None]) -> World:
        """The world the dataset reads in: ``world``, or the whole stream
        (rank 0 of 1) if the caller of ``frame`` is accelerate splitting the
        dataset's stream; then, the first time, logs :func:`split_message`.

        Args:
            frame: The dataset's method's frame (``set_epoch``, ``__len__``).
            world: The dataset's world.
            worker_counts: ``worker_counts(N, world=W)``: the samples each
                of N DataLoader workers of world W reads this epoch, or None
                when not known (``ShardDataset.samples_per_worker``).

        Raises:
            UsageError: accelerate splits the stream of a dataset given a
                rank among more than one (:func:`split_again_message`), or
                one whose ranks read in groups (``replication``).
        """
        split = accelerate_split(frame.f_back if frame is not None else None)
        if split is None:
            return world
        if self.replication > 1:
            raise UsageError(
                f"accelerate's {split.wrapper} splits this DataLoader across processes, and this ShardDataset was "
                f"built with replication={self.replication}: the ranks of a group would get different batches. "
                "Iterate shardkit.make_loader(dataset) without accelerator.prepare()"
            )
        if world.world_size > 1:
            if self.rank_given:
                raise UsageError(split_again_message(split.wrapper, world.rank, world.world_size))
            # Before any DataLoader worker starts (accelerate asks len() or sets the epoch first): they inherit it.
            world = World()
        if not self.noted:
            self.noted = True
            counts = None
            if split.num_workers is not None and split.batch_size and not (self.endless or self.batched):
                counts = worker_counts(max(split.num_workers, 1), world=world)
            cost = (0, 0) if self.endless else None if counts is None else split_cost(split, counts)
            note_split(split_message(split, cost))
        return world


def split_again_message(wrapper: str, rank: int, world_size: int) -> str:
    """What to do when accelerate's ``wrapper`` would split a dataset that was
    told to read rank ``rank``'s share of ``world_size``."""
    return (
        f"accelerate's {wrapper} splits this DataLoader across processes, and this ShardDataset was built with "
        f"rank={rank}, world_size={world_size} to read only that rank's share: leave rank= and world_size= out "
        "(under accelerate the dataset then reads the whole stream, which accelerate splits), or iterate "
        "shardkit.make_loader(dataset) without accelerator.prepare()"
    )


#: Why a loader from :func:`~shardkit.make_loader` cannot go through
#: ``accelerator.prepare``: accelerate rebuilds a DataLoader from the loader's
#: dataset (a wrapper whose items carry checkpoint tags) and collate function.
REBUILT_LOADER_MESSAGE = (
    "accelerator.prepare() rebuilt a loader from shardkit.make_loader(), whose items would come out as "
    "shardkit's internal (worker, count, batch) tuples: prepare torch.utils.data.DataLoader(dataset) "
    "instead, or iterate the make_loader() loader without accelerator.prepare()"
)
