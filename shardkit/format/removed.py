"""Samples removed from a dataset without rewriting its shards (``shardkit
remove``, issue #41).

A takedown request, a curation list or a sample found broken late need not
cost a copy of the dataset: the shards and their offset indexes stay as they
are, byte for byte, and the dataset's shard table gets a new revision that
says which of their samples are gone:

- its ``counts`` (and ``starts``, and the ``tokens`` totals) count the
  samples that are left, so every number planned from the table (``len()``,
  the split over ranks and workers, a mixture's shares, ``IndexedDataset``'s
  numbering) leaves the removed samples out without knowing of them;
- an optional last column, ``removed``, lists them: one ``<u8`` per removed
  sample, ``shard << 32 | position``, where ``position`` is the sample's
  place in its shard's tar file and offset index (the *stored* position),
  strictly rising (so sorted by shard, then position).

Readers see *kept* positions: sample ``k`` of a shard is the ``k``-th sample
of its tar file that was not removed. :func:`stored_positions` and
:func:`kept_positions` turn one into the other for one shard's removed
positions (:meth:`Removed.in_shard`), in O(log r) for r removed there.

The manifest records ``"removed": {"num_samples": R, "earlier_fingerprints":
[...]}`` (format 4, :data:`~shardkit.format.manifest.REMOVED_VERSION`: an
older shardkit refuses it by its version instead of reading the removed
samples back) and the fingerprint of the new revision, which covers the
``removed`` column; ``earlier_fingerprints`` lets a reader state saved
before a removal be told apart from one of another dataset.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: The ``removed`` column's dtype: one ``shard << 32 | position`` each.
REMOVED_DTYPE = np.dtype("<u8")
#: Bits of the position in a packed entry.
POSITION_BITS = 32
#: Most samples one shard may hold for its samples to be removed (positions
#: are 32-bit in the column).
MAX_POSITION = (1 << POSITION_BITS) - 1


def pack(shards: np.ndarray | Iterable[int], positions: np.ndarray | Iterable[int]) -> np.ndarray:
    """``(shard, stored position)`` pairs as the ``removed`` column's values,
    sorted and without repeats."""
    shard = np.asarray(shards, dtype=np.uint64).reshape(-1)
    position = np.asarray(positions, dtype=np.uint64).reshape(-1)
    if len(shard) != len(position):
        raise ValueError(f"{len(shard)} shards for {len(position)} positions")
    if len(position) and int(position.max()) > MAX_POSITION:
        raise ValueError(f"a position past {MAX_POSITION}: a shard that long cannot have samples removed")
    return np.unique((shard << np.uint64(POSITION_BITS)) | position).astype(REMOVED_DTYPE)


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``removed`` column's values as (shards, stored positions), int64."""
    values = np.asarray(packed, dtype=np.uint64)
    return (values >> np.uint64(POSITION_BITS)).astype(np.int64), (values & np.uint64(MAX_POSITION)).astype(np.int64)


def column_problem(packed: np.ndarray, counts: np.ndarray) -> str | None:
    """What is wrong with a ``removed`` column beside a table's kept
    ``counts``, or None: it must rise strictly, name shards of the table,
    and positions inside their shards (kept and removed together)."""
    if packed.ndim != 1:
        return f"column removed has shape {packed.shape}, not one value a removed sample"
    if not len(packed):
        return None
    if (packed[1:] <= packed[:-1]).any():
        return "column removed does not rise strictly (each removed sample once, in order)"
    shards, positions = unpack(packed)
    if int(shards[-1]) >= len(counts):
        return f"column removed names shard {int(shards[-1])}, the table has {len(counts)} shards"
    stored = np.asarray(counts, dtype=np.int64) + np.bincount(shards, minlength=len(counts))
    beyond = np.flatnonzero(positions >= stored[shards])
    if len(beyond):
        i = int(beyond[0])
        return (
            f"column removed names sample {int(positions[i])} of shard {int(shards[i])}, which holds "
            f"{int(stored[shards[i]])} samples"
        )
    return None


class Removed:
    """A table's ``removed`` column, looked up by shard.

    Args:
        packed: The column (a read-only view of the table), or None for a
            table without one (nothing removed).
    """

    def __init__(self, packed: np.ndarray | None):
        self.packed = np.zeros(0, dtype=REMOVED_DTYPE) if packed is None else packed

    def __len__(self) -> int:
        return len(self.packed)

    def in_shard(self, shard: int) -> np.ndarray:
        """Stored positions removed from shard ``shard``, rising (int64)."""
        base = np.uint64(int(shard) << POSITION_BITS)
        lo, hi = np.searchsorted(self.packed, [base, base + np.uint64(1 << POSITION_BITS)])
        return (self.packed[lo:hi] & np.uint64(MAX_POSITION)).astype(np.int64)

    def stored_count(self, counts: np.ndarray, shard: int) -> int:
        """Samples shard ``shard``'s tar file and index hold, its kept
        ``counts[shard]`` and those removed from it."""
        return int(counts[shard]) + len(self.in_shard(shard))


def stored_positions(removed: np.ndarray, kept: np.ndarray | int) -> np.ndarray | int:
    """Where kept positions ``kept`` of a shard are stored, given the
    shard's rising removed (stored) positions ``removed``."""
    if not len(removed):
        return kept
    # The k-th kept sample is stored at k plus the removed samples before
    # it: those whose position less their rank is at most k.
    shifted = removed - np.arange(len(removed), dtype=np.int64)
    found = np.searchsorted(shifted, kept, side="right")
    return kept + (int(found) if np.ndim(found) == 0 else found)


def kept_positions(removed: np.ndarray, stored: np.ndarray | int) -> np.ndarray | int:
    """The kept positions of samples stored at ``stored`` (each one kept)."""
    if not len(removed):
        return stored
    found = np.searchsorted(removed, stored, side="left")
    return stored - (int(found) if np.ndim(found) == 0 else found)
