"""Cutting documents' tokens into fixed-length blocks, with each token's
place in its document (:mod:`.blocks` reads the documents).

With ``TokenBlocks(..., boundaries=True)`` every token carries its position
in its document: 0 at a document's first token, the true position for the
rest of a document carried over from the block before (or from another
slot's range: the piece's ``skip``), ``eos`` the last position of the
document it ends. The positions come from the stored per-document counts,
not from the ids: exact whatever the documents hold, with ``eos=None`` too.
:mod:`.block_output` turns them into ``position_ids`` and ``cu_seqlens``.
"""

from __future__ import annotations

import numpy as np


def document_positions(lengths: np.ndarray) -> np.ndarray:
    """Each token's position in its document, for documents of ``lengths``
    laid end to end (int32, half the bytes to carry: a document of 2**31
    tokens is no training sample; int64 where one is longer)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    dtype = np.int32 if not len(lengths) or int(lengths.max()) < 2**31 else np.int64
    starts = (np.cumsum(lengths) - lengths).astype(dtype)
    positions = np.arange(int(lengths.sum()), dtype=dtype)
    positions -= np.repeat(starts, lengths)
    return positions


class Packer:
    """Cuts the tokens of a run of blocks into blocks as they come, with
    their positions when given them."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.parts: list[np.ndarray] = []
        self.places: list[np.ndarray] = []
        self.held = 0

    def add(self, tokens: np.ndarray, positions: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Take the next tokens (a document's, or a run of documents') and
        their positions (or None); return the blocks they completed, each a
        copy of its own in the stored dtype (a view would hold its
        document's bytes, or a whole run's, as long as the block waits in
        the swap buffer), with its positions."""
        size = self.block_size
        if self.held + len(tokens) < size:
            self.parts.append(tokens)
            if positions is not None:
                self.places.append(positions)
            self.held += len(tokens)
            return []
        done: list[tuple[np.ndarray, np.ndarray | None]] = []
        if self.held:
            need = size - self.held
            block = np.concatenate([*self.parts, tokens[:need]])
            placed = None if positions is None else np.concatenate([*self.places, positions[:need]])
            done.append((block, placed))
            tokens = tokens[need:]
            positions = None if positions is None else positions[need:]
        whole = len(tokens) // size * size
        rows = tokens[:whole].reshape(-1, size)
        places = None if positions is None else positions[:whole].reshape(-1, size)
        done.extend((row.copy(), None if places is None else places[i].copy()) for i, row in enumerate(rows))
        rest = tokens[whole:]
        self.parts, self.held = ([rest.copy()] if len(rest) else []), len(rest)
        self.places = [] if positions is None or not len(rest) else [positions[whole:].copy()]
        return done
