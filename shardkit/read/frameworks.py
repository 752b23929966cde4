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
"""

from __future__ import annotations

from types import FrameType

#: The module whose loaders re-split a dataset.
ACCELERATE_MODULE = "accelerate.data_loader"

#: accelerate's wrappers that split an ``IterableDataset``'s stream across
#: processes (its ``DataLoaderShard`` calling the dataset directly does not).
ACCELERATE_SPLITTERS = frozenset({"DataLoaderDispatcher", "IterableDatasetShard"})


def splitting_wrapper(caller: FrameType | None) -> str | None:
    """The name of the accelerate wrapper whose code is ``caller``, if that
    wrapper splits the dataset's stream across two or more processes; else
    None.

    Args:
        caller: The frame that called the dataset (``set_epoch``'s caller).
    """
    if caller is None or caller.f_globals.get("__name__") != ACCELERATE_MODULE:
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
