"""The random generator of the sample being mapped: seeded by the sample.

A transform that draws at random (where a video clip starts, where an
audio clip starts) should draw the same for the same sample in the same
epoch of the same run, whichever rank, worker or restart reads it, and
differently in the next epoch. Drawing from torch's global generator, as
image transforms do, gives neither: DataLoader seeds that generator per
worker, so a sample's draw depends on which worker it landed on and on
what that worker read before.

:class:`~shardkit.ShardDataset` therefore names each sample while its
``map`` runs: ``(seed, epoch, stream, shard, position in the shard)``.
:func:`sample_generator` turns that name into a numpy generator. The name
is held in a :class:`contextvars.ContextVar`, set only for the call of
``map`` on that sample, so it is per thread and never outlives the call.
Outside such a call (a transform called directly, or ``IndexedDataset``,
which has no epochs) there is no name and :func:`sample_generator` returns
None: transforms then draw from torch's global generator.

In ``mode="infinite"`` the epoch is the one the iteration started with, so
a sample read again in a later pass of the same iteration draws the same.
"""

from __future__ import annotations

import contextvars

import numpy as np

__all__ = ["SampleName", "current", "sample_generator"]

#: ``(seed, epoch, stream, shard, position)`` of a sample.
SampleName = tuple[int, int, int, int, int]

#: Sets our numbers apart from other uses of the same seed.
_DOMAIN = 0x5EED_C11B

#: The sample whose ``map`` runs in this thread; the reader sets and resets it.
current: contextvars.ContextVar[SampleName | None] = contextvars.ContextVar("shardkit_sample", default=None)


def sample_generator() -> np.random.Generator | None:
    """A generator seeded by the sample whose ``map`` is running, or None.

    Every call during one sample's ``map`` returns a generator in the same
    state: two transforms of one sample (a video clip and its audio) draw
    the same numbers.
    """
    name = current.get()
    if name is None:
        return None
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence((_DOMAIN, *name))))

