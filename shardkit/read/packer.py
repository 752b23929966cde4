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

from collections import deque

import numpy as np


class Packer:
    """Cuts the tokens of a run of blocks into blocks as they come, with
    their layouts when told the documents' lengths."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.parts: list[np.ndarray] = []
        self.held = 0
        self.lengths: deque[int] = deque()  # the held tokens' document parts
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
            if not self.lengths:
                self.offset = offset
            self.lengths.extend(lengths[lengths > 0].tolist())
        if self.held + len(tokens) < size:
            self.parts.append(tokens)
            self.held += len(tokens)
            return []
        done: list[tuple[np.ndarray, np.ndarray | None]] = []
        if self.held:
            need = size - self.held
            done.append((np.concatenate([*self.parts, tokens[:need]]), self._layout()))
            tokens = tokens[need:]
        whole = len(tokens) // size * size
        done.extend((row.copy(), self._layout()) for row in tokens[:whole].reshape(-1, size))
        rest = tokens[whole:]
        self.parts, self.held = ([rest.copy()] if len(rest) else []), len(rest)
        return done

    def _layout(self) -> np.ndarray | None:
        """The next block's layout, taken off the held parts."""
        if not self.lengths:
            return None
        out, room = [self.offset], self.block_size
        while room:
            n = self.lengths[0]
            if n > room:  # the part runs on into the next block
                out.append(room)
                self.lengths[0] -= room
                self.offset = (self.offset if len(out) == 2 else 0) + room
                break
            out.append(n)
            room -= n
            self.lengths.popleft()
        else:
            self.offset = 0
        return np.asarray(out, dtype=np.int32)


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
