"""An epoch's token stream, placed among shards and documents from token
counts alone (issue #40; :mod:`.blocks` reads it).

The *token stream* of an epoch is the documents of the epoch's global
sequence (see :mod:`.split`: shards in the epoch's order, each shard's
samples in stored order), each document's tokens followed by ``eos`` when
one is set. A reader of blocks asks for a range of stream positions (its
blocks' tokens: ranks and workers are dealt whole blocks, as samples, see
:mod:`.blocks`), which may start and end inside documents: such a document
is split between two runs and no token is read twice.

**What placing reads.** Each shard's total (its documents' tokens, ``eos``
included) places a range among the shards, and the per-document counts of
a shard the range starts or ends inside place it among that shard's
documents (:meth:`TokenStream.pieces`). Memory is O(number of shards).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from shardkit.errors import UsageError


@dataclass(frozen=True, slots=True)
class TokenPiece:
    """Tokens ``[token_start, token_stop)`` of one shard's token stream (its
    documents in stored order, each followed by ``eos`` when set), found in
    its documents ``[start, stop)``.

    A reader concatenates those documents' tokens and takes
    ``[token_start - first, token_stop - first)`` of them, ``first`` being
    where document ``start`` begins in the shard's stream
    (:attr:`skip` and :attr:`num_tokens` give that slice).

    Attributes:
        shard: Shard number in the dataset (manifest order).
        start: First document (sample number in the shard).
        stop: One past the last document.
        skip: Tokens of document ``start`` before the piece begins.
        num_tokens: Tokens in the piece.
    """

    shard: int
    start: int
    stop: int
    skip: int
    num_tokens: int


class TokenStream:
    """One epoch's token stream over the shards, for placing ranges of it.

    Args:
        shard_tokens: Tokens per shard (``eos`` included), in manifest order.
        shard_documents: Documents (samples) per shard, in manifest order.
        order: The epoch's shard order (a permutation of shard numbers).
    """

    def __init__(self, shard_tokens: Sequence[int] | np.ndarray, shard_documents: Sequence[int] | np.ndarray,
                 order: np.ndarray):
        self._tokens = np.asarray(shard_tokens, dtype=np.int64)
        self._documents = np.asarray(shard_documents, dtype=np.int64)
        self._order = np.asarray(order, dtype=np.int64)
        self._ends = np.cumsum(self._tokens[self._order])  # where each shard of the order ends in the stream

    @property
    def num_tokens(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def pieces(self, start: int, stop: int, document_tokens: Callable[[int], np.ndarray]) -> Iterator[TokenPiece]:
        """Stream positions ``[start, stop)`` as pieces of shards, in stream
        order.

        A document or shard counted empty is still in the piece of the range
        its place falls in (a shard as a piece of no tokens; the stream's
        last range takes those at its end), so that in an epoch of ranges
        that cover the stream every document is read once and its count is
        checked against it; a shard without documents never appears.

        Args:
            start: First stream position.
            stop: One past the last; at most the stream's length.
            document_tokens: A shard's per-document token counts (``eos``
                included), in stored order; asked only for a shard the
                range starts or ends inside.

        Raises:
            UsageError: The range lies outside the stream, or a shard's
                per-document counts do not sum to its total.
        """
        if stop <= start:
            return
        ends, order, tokens, documents = self._ends, self._order, self._tokens, self._documents
        if not 0 <= start < stop <= self.num_tokens:
            raise UsageError(f"tokens [{start}, {stop}) lie outside a token stream of {self.num_tokens}")
        to_end = stop == self.num_tokens
        i = int(np.searchsorted(ends, start, side="left"))  # with the shards that end at start: empty ones are ours
        while i < len(order):
            shard = int(order[i])
            total, end = int(tokens[shard]), int(ends[i])
            shard_first = end - total
            if shard_first >= stop and not (to_end and total == 0):
                break
            if total == 0:
                if documents[shard]:
                    yield TokenPiece(shard, 0, int(documents[shard]), 0, 0)  # read for its counts' sake
            elif end > start:  # (a shard that ends at start is the range before's)
                lo, hi = max(start, shard_first) - shard_first, min(stop, end) - shard_first
                if lo == 0 and hi == total:
                    yield TokenPiece(shard, 0, int(documents[shard]), 0, hi)  # the whole shard: no counts read
                else:
                    yield _inside(shard, total, lo, hi, document_tokens)
            i += 1


def _inside(shard: int, total: int, lo: int, hi: int, document_tokens: Callable[[int], np.ndarray]) -> TokenPiece:
    """The piece of tokens ``[lo, hi)`` of a shard's stream, placed among its documents."""
    counts = np.asarray(document_tokens(shard), dtype=np.int64)
    ends = np.cumsum(counts)
    if not len(ends) or int(ends[-1]) != total:
        raise UsageError(f"shard {shard}: its documents' token counts sum to {int(ends[-1]) if len(ends) else 0}, "
                         f"not to the {total} its total says")
    first = int(np.searchsorted(ends, lo, side="right"))  # the document holding token lo
    last = int(np.searchsorted(ends, hi - 1, side="right"))  # the one holding token hi - 1
    # Documents counted empty are read by the piece they stand at the start
    # of, and at a shard's end by its last piece: each by one piece, so that
    # a count of 0 that lies is found when the document is read.
    first = min(first, int(np.searchsorted(ends - counts, lo, side="left")))
    if hi == total:
        last = len(counts) - 1
    begins = int(ends[first] - counts[first])
    return TokenPiece(shard, first, last + 1, lo - begins, hi - lo)


__all__ = ["TokenPiece", "TokenStream"]
