"""Mid-epoch checkpoints of the reader.

A slot's stream is a pure function of (options, world, epoch): its plan
(:class:`~shardkit.read.plan.ReadPlan`) gives the samples it reads, in order,
and its shuffle buffer is seeded from ``(seed, epoch, rank, worker)``. The
position of a slot is therefore one number, the samples that have come out
of its shuffle buffer so far (*delivered*). Resuming replays the plan and the
buffer over sample positions to that count, reads the buffered samples back
through the offset index, and goes on reading from there: the same topology
continues with the identical sequence, another one splits the rest of the
epoch over its slots.

Modules:
    * :mod:`.state`: the state format (:class:`ReaderState`, versioned, with
      the shuffle algorithm it was saved with), its checks, and merging the
      rank-local states of a multi-rank run (:func:`merge_states`,
      :func:`gather_states`).
    * :mod:`.replay`: rebuilding one slot's position from its count.
    * :mod:`.elastic`: the rest of an epoch as a new sequence, re-split over
      another topology (``"infinite"`` mode included).
    * :mod:`.restore`: the I/O side: offset indexes and the buffered samples.

Users need only :func:`merge_states` / :func:`gather_states` (to move a
checkpoint to another world size or worker count); the loader's and the
dataset's ``state_dict()`` / ``load_state_dict()`` do the rest.
"""

from shardkit.read.resume.state import (
    STATE_VERSION,
    Level,
    ReaderState,
    gather_states,
    merge_states,
)

__all__ = ["STATE_VERSION", "Level", "ReaderState", "gather_states", "merge_states"]
