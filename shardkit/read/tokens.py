"""Token blocks: an epoch's token stream split over ranks and workers at
token precision, as pure arithmetic (issue #40, the split).

A reader for language-model pretraining yields fixed-length blocks of
``block_size`` tokens cut from an epoch's *token stream*: the documents of
the epoch's global sequence (see :mod:`.split`: shards in the epoch's order,
each shard's samples in stored order), each document's tokens followed by
``eos`` when one is set.

**The split is by whole blocks.** Global block *b* is tokens
``[b * block_size, (b + 1) * block_size)`` of the stream, and the stream's
``num_tokens // block_size`` blocks are dealt over the (rank, worker) slots
as samples are (:func:`~.split.slot_span`): ``exact`` (and one epoch of
``infinite``) gives every full block to one slot, per-rank counts differing
by at most one; ``balanced`` gives every rank ``num_blocks // world_size``
blocks, so no rank waits on another whatever the documents' lengths. A
slot's blocks are one contiguous range of the stream's tokens, which may
start and end inside a document: such a document is split between two
slots and no token is read twice. An epoch leaves out only the stream's
last partial block (fewer than ``block_size`` tokens) and, under
``balanced``, fewer than ``world_size`` whole blocks.

**What the split reads.** Positions in the stream come from token counts,
not from the data: each shard's total (its documents' tokens, ``eos``
included) places a slot's range among the shards, and the per-document
counts of a shard the range starts or ends inside place it among that
shard's documents (:func:`token_pieces`). Memory is O(number of shards).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from shardkit.errors import UsageError
from shardkit.read.split import Mode, even_cut, rank_span
from shardkit.world import World


def num_blocks(num_tokens: int, block_size: int) -> int:
    """Whole blocks of ``block_size`` tokens in a stream of ``num_tokens``."""
    if block_size < 1:
        raise UsageError(f"block_size must be >= 1, not {block_size}")
    return num_tokens // block_size


def slot_blocks(num_tokens: int, block_size: int, world: World, *, mode: Mode) -> tuple[int, int]:
    """Global blocks ``[start, stop)`` that one (rank, worker) slot yields.

    Raises:
        UsageError: The stream has fewer whole blocks than there are slots
            to read them (some slot would yield nothing), naming the counts.
    """
    blocks = num_blocks(num_tokens, block_size)
    start, stop = rank_span(blocks, rank=world.rank, world_size=world.world_size, mode=mode)
    if blocks // world.world_size < world.num_workers:
        raise UsageError(
            f"the token stream holds {num_tokens:,} tokens, {blocks:,} whole blocks of {block_size:,}: fewer "
            f"than one block for each of the {world.num_slots} readers ({world.world_size} ranks x "
            f"{world.num_workers} DataLoader workers). Use a smaller block_size, fewer workers, or more data."
        )
    lo, hi = even_cut(stop - start, world.num_workers, world.worker)
    return start + lo, start + hi


def blocks_per_rank(num_tokens: int, block_size: int, *, rank: int, world_size: int, mode: Mode) -> int:
    """How many blocks ``rank`` yields in one epoch: what ``len()`` says."""
    start, stop = rank_span(num_blocks(num_tokens, block_size), rank=rank, world_size=world_size, mode=mode)
    return stop - start


def slot_tokens(num_tokens: int, block_size: int, world: World, *, mode: Mode) -> tuple[int, int]:
    """Stream positions ``[start, stop)`` of the tokens one slot reads: its
    blocks' tokens (see :func:`slot_blocks`)."""
    start, stop = slot_blocks(num_tokens, block_size, world, mode=mode)
    return start * block_size, stop * block_size


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


def token_pieces(
    shard_tokens: Sequence[int] | np.ndarray,
    shard_documents: Sequence[int] | np.ndarray,
    order: np.ndarray,
    start: int,
    stop: int,
    document_tokens: Callable[[int], np.ndarray],
) -> Iterator[TokenPiece]:
    """Map stream positions ``[start, stop)`` to pieces of shards.

    Args:
        shard_tokens: Tokens per shard (``eos`` included), in manifest order.
        shard_documents: Documents (samples) per shard, in manifest order.
        order: The epoch's shard order (a permutation of shard numbers).
        start: First stream position.
        stop: One past the last; at most the stream's length.
        document_tokens: A shard's per-document token counts (``eos``
            included), in stored order; asked only for a shard the range
            starts or ends inside.

    Yields:
        Pieces in stream order; shards without tokens never appear.

    Raises:
        UsageError: ``stop`` lies past the stream's end, or a shard's
            per-document counts do not sum to its total.
    """
    if stop <= start:
        return
    ordered = np.asarray(shard_tokens, dtype=np.int64)[order]
    ends = np.cumsum(ordered)
    total = int(ends[-1]) if len(ends) else 0
    if not 0 <= start < stop <= total:
        raise UsageError(f"tokens [{start}, {stop}) lie outside a token stream of {total}")
    i = int(np.searchsorted(ends, start, side="right"))
    pos = start
    while pos < stop:
        while int(ordered[i]) == 0:
            i += 1
        shard = int(order[i])
        shard_first = int(ends[i] - ordered[i])
        lo, hi = pos - shard_first, min(stop, int(ends[i])) - shard_first
        if lo == 0 and hi == int(ordered[i]):
            yield TokenPiece(shard, 0, int(shard_documents[shard]), 0, hi)  # the whole shard: no counts read
        else:
            yield _inside(shard, int(ordered[i]), lo, hi, document_tokens)
        pos = shard_first + hi
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
    begins = int(ends[first] - counts[first])
    return TokenPiece(shard, first, last + 1, lo - begins, hi - lo)


__all__ = ["TokenPiece", "blocks_per_rank", "num_blocks", "slot_blocks", "slot_tokens", "token_pieces"]
