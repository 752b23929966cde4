"""Training frameworks that split a DataLoader across processes themselves.

A :class:`~shardkit.ShardDataset` splits each epoch across ranks on its own:
under ``torchrun`` each rank reads only its share. Hugging Face
``accelerate`` (and the ``Trainer``, which prepares its loaders with it)
assumes the opposite of a DataLoader over an ``IterableDataset``: that every
process's loader holds the whole stream, which it splits itself. By default
process 0 reads the stream and sends every process its part of each batch
(``DataLoaderDispatcher``); with ``dispatch_batches=False`` every process
reads the stream and keeps its part of each batch (``IterableDatasetShard``).
Over a dataset that already reads one rank's share either way loses the
rest, silently: half the samples on two processes.

Both wrappers call the dataset's ``set_epoch`` as each of their iterations
begins, before any batch is read. :meth:`ShardDataset.set_epoch` looks at
its caller there, and a dataset that splits by rank refuses, naming what to
pass: ``rank=0, world_size=1`` makes the dataset the one stream accelerate
expects (its split is then the only one), or the loader stays out of
``accelerator.prepare``. Lightning needs none of this: it gives a
``DistributedSampler`` only to map-style datasets and leaves an
``IterableDataset``'s loader as it is.

A loader from :func:`~shardkit.make_loader` cannot be prepared at all:
accelerate builds a new DataLoader from its dataset, a wrapper whose items
are tagged for checkpoints. That wrapper refuses accelerate's ``set_epoch``
call (see :data:`REBUILT_LOADER_MESSAGE`).
"""

from __future__ import annotations

from types import FrameType

#: The module whose loaders re-split a dataset.
ACCELERATE_MODULE = "accelerate.data_loader"

#: accelerate's wrappers that split an ``IterableDataset``'s stream across
#: processes (its ``DataLoaderShard`` calling the dataset directly does not).
ACCELERATE_SPLITTERS = frozenset({"DataLoaderDispatcher", "IterableDatasetShard"})


def called_by_accelerate(caller: FrameType | None) -> bool:
    """Whether ``caller`` is code of accelerate's data loaders."""
    return caller is not None and caller.f_globals.get("__name__") == ACCELERATE_MODULE


def splitting_wrapper(caller: FrameType | None) -> str | None:
    """The name of the accelerate wrapper whose code is ``caller``, if that
    wrapper splits the dataset's stream across two or more processes; else
    None.

    Args:
        caller: The frame that called the dataset (``set_epoch``'s caller).
    """
    if caller is None or not called_by_accelerate(caller):
        return None
    wrapper = caller.f_locals.get("self")
    name = type(wrapper).__name__
    if name not in ACCELERATE_SPLITTERS:
        return None
    # IterableDatasetShard knows its processes; a dispatcher asks accelerate's state (one process: no split).
    processes = getattr(wrapper, "num_processes", None) or getattr(getattr(wrapper, "state", None), "num_processes", 1)
    return name if processes > 1 else None


def split_again_message(wrapper: str, rank: int, world_size: int) -> str:
    """What to do when accelerate's ``wrapper`` would split a dataset that
    already reads rank ``rank``'s share of ``world_size``."""
    return (
        f"accelerate's {wrapper} splits this DataLoader across processes again, and this ShardDataset "
        f"already reads only rank {rank}'s share of {world_size}: build it with rank=0, world_size=1 "
        "(one stream, which accelerate splits), or iterate shardkit.make_loader(dataset) without "
        "accelerator.prepare()"
    )


#: Why a loader from :func:`~shardkit.make_loader` cannot go through
#: ``accelerator.prepare``: accelerate rebuilds a DataLoader from the loader's
#: dataset (a wrapper whose items carry checkpoint tags) and collate function.
REBUILT_LOADER_MESSAGE = (
    "accelerator.prepare() rebuilt a loader from shardkit.make_loader(), whose items would come out as "
    "shardkit's internal (worker, count, batch) tuples: prepare torch.utils.data.DataLoader(dataset) "
    "instead, or iterate the make_loader() loader without accelerator.prepare()"
)
