"""Cutting documents' tokens into fixed-length blocks, with each block's
layout (:mod:`.blocks` reads the documents).

With ``TokenBlocks(..., boundaries=True)`` every block carries its
*layout*: an int32 array ``[offset, n0, n1, ...]``, the lengths of the
documents' parts in the block in order and the position in its document
of the block's first token (0 where a document starts the block, the true
position where one carries over from the block before, or from another
slot's range: the piece's ``skip``). A handful of numbers per block where
per-token positions would be a copy of the block; :mod:`.block_output`
turns them into ``position_ids`` and ``cu_seqlens`` once per batch. The
layout comes from the stored per-document counts, not from the ids: exact
whatever the documents hold, with ``eos=None`` too.
"""

from __future__ import annotations

import numpy as np


class Packer:
    """Cuts the tokens of a run of blocks into blocks as they come, with
    their layouts when told the documents' lengths."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.parts: list[np.ndarray] = []
        self.held = 0
        self.lengths: np.ndarray | None = None  # the held tokens' document parts, once told any
        self.offset = 0  # the first held token's position in its document

    def add(
        self, tokens: np.ndarray, lengths: np.ndarray | None = None, offset: int = 0
    ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Take the next tokens (a document's, or a run of documents') and,
        for layouts, their documents' lengths (summing to ``len(tokens)``)
        and the position of ``tokens[0]`` in its document; return the
        blocks they completed, each a copy of its own in the stored dtype
        (a view would hold its document's bytes, or a whole run's, as long
        as the block waits in the swap buffer), with its layout or None."""
        size = self.block_size
        if lengths is not None:
            if self.lengths is None or not len(self.lengths):
                self.lengths, self.offset = lengths[lengths > 0].astype(np.int64), offset
            else:
                self.lengths = np.concatenate((self.lengths, lengths[lengths > 0]))
        if self.held + len(tokens) < size:
            self.parts.append(tokens)
            self.held += len(tokens)
            return []
        count = (self.held + len(tokens)) // size
        layouts = self._layouts(count) if self.lengths is not None else [None] * count
        rows: list[np.ndarray] = []
        if self.held:
            need = size - self.held
            rows.append(np.concatenate([*self.parts, tokens[:need]]))
            tokens = tokens[need:]
        whole = len(tokens) // size * size
        rows.extend(row.copy() for row in tokens[:whole].reshape(-1, size))
        rest = tokens[whole:]
        self.parts, self.held = ([rest.copy()] if len(rest) else []), len(rest)
        return list(zip(rows, layouts))

    def _layouts(self, count: int) -> list[np.ndarray]:
        """The next ``count`` blocks' layouts, taken off the held parts at
        once: the parts are the documents' lengths cut also at each block's
        end."""
        lengths, size = self.lengths, self.block_size
        ends = np.cumsum(lengths)
        starts = ends - lengths
        done = count * size
        firsts = np.arange(count) * size  # each block's first token
        # The parts' ends: the documents' ends inside the blocks merged (both sorted) with the blocks' ends.
        inside = ends[: np.searchsorted(ends, done)]
        inside = inside[inside % size != 0]
        closing = np.searchsorted(inside, firsts + size) + np.arange(count)  # each block's last part
        cuts = np.empty(len(inside) + count, dtype=ends.dtype)
        cuts[closing] = firsts + size
        between = np.ones(len(cuts), dtype=bool)
        between[closing] = False
        cuts[between] = inside
        parts = np.diff(cuts, prepend=0)
        opening = np.concatenate(([0], closing[:-1] + 1))  # each block's first part
        carried = np.searchsorted(ends, firsts, side="right")  # the document holding it
        offsets = firsts - starts[carried] + np.where(carried == 0, self.offset, 0)
        rest = int(np.searchsorted(ends, done, side="right"))  # the first document not done
        if rest < len(lengths):
            self.offset = done - int(starts[rest]) + (self.offset if rest == 0 else 0)
            self.lengths = np.concatenate(([ends[rest] - done], lengths[rest + 1 :]))
        else:
            self.offset, self.lengths = 0, lengths[:0]
        laid = np.insert(parts, opening, offsets).astype(np.int32)
        bounds = (opening + np.arange(count)).tolist() + [len(laid)]
        return [laid[lo:hi].copy() for lo, hi in zip(bounds[:-1], bounds[1:])]  # each its own (blocks wait apart)


def cut_lengths(lengths: np.ndarray, skip: int, count: int) -> tuple[np.ndarray, int]:
    """The parts of documents of ``lengths``, laid end to end, that tokens
    ``skip`` to ``skip + count`` hold, and the position in its document of
    the first of them."""
    ends = np.cumsum(lengths, dtype=np.int64)
    starts = ends - lengths
    stop = skip + count
    parts = np.clip(ends, skip, stop) - np.clip(starts, skip, stop)
    first = int(np.searchsorted(ends, skip, side="right"))
    return parts, (skip - int(starts[first])) if first < len(starts) else 0
