"""The token split (issue #40): whole blocks dealt over ranks and workers as
samples are, each slot's tokens found among shards and documents from token
counts alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import UsageError
from shardkit.read.split import epoch_order, samples_per_rank, slot_span
from shardkit.read.tokens import TokenStream
from shardkit.world import World

#: Shards of documents, each document a run of token counts (0 for an empty one).
corpora = st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=6), min_size=1, max_size=8)


def _stream(corpus: list[list[int]], order: np.ndarray) -> tuple[np.ndarray, dict]:
    """The epoch's token stream, each token a unique id, and where each id lives."""
    where, stream, next_id = {}, [], 0
    ids = []
    for shard, documents in enumerate(corpus):
        shard_ids = []
        for doc, count in enumerate(documents):
            tokens = list(range(next_id, next_id + count))
            next_id += count
            for k, token in enumerate(tokens):
                where[token] = (shard, doc, k)
            shard_ids.append(tokens)
        ids.append(shard_ids)
    for shard in order:
        for tokens in ids[shard]:
            stream.extend(tokens)
    return np.array(stream, dtype=np.int64), ids


def _read(piece, ids) -> list[int]:
    """What a reader takes for a piece: its documents' tokens, joined, sliced."""
    joined = [t for tokens in ids[piece.shard][piece.start : piece.stop] for t in tokens]
    return joined[piece.skip : piece.skip + piece.num_tokens]


@settings(max_examples=300)
@given(corpus=corpora, block_size=st.integers(1, 50), world_size=st.integers(1, 4), workers=st.integers(1, 3),
       mode=st.sampled_from(["exact", "balanced"]), seed=st.integers(0, 3))
def test_every_slot_reads_its_blocks_tokens_and_no_token_twice(corpus, block_size, world_size, workers, mode, seed):
    order = epoch_order(len(corpus), seed=seed, epoch=1, shuffle=True)
    stream, ids = _stream(corpus, order)
    blocks = len(stream) // block_size
    shard_tokens = [sum(documents) for documents in corpus]
    shard_documents = [len(documents) for documents in corpus]
    if blocks // world_size < workers:
        return  # refused by the reader (tests/read/test_tokens.py)
    seen: list[int] = []
    per_rank = []
    for rank in range(world_size):
        rank_blocks = 0
        for worker in range(workers):
            world = World(rank, world_size, worker, workers)
            first, last = slot_span(blocks, world, mode=mode)
            start, stop = first * block_size, last * block_size
            pieces = TokenStream(shard_tokens, shard_documents, order).pieces(start, stop, lambda s: np.array(corpus[s]))
            got = [t for piece in pieces for t in _read(piece, ids)]
            assert got == stream[start:stop].tolist()  # the slot's tokens, in stream order
            seen += got
            rank_blocks += (stop - start) // block_size
        assert rank_blocks == samples_per_rank(blocks, rank=rank, world_size=world_size, mode=mode)
        per_rank.append(rank_blocks)
    assert len(seen) == len(set(seen))  # no token twice
    if mode == "exact":
        assert sorted(seen) == sorted(stream[: blocks * block_size].tolist())  # every full block once
        assert max(per_rank) - min(per_rank) <= 1
    else:
        assert len(set(per_rank)) == 1 and sum(per_rank) > blocks - world_size  # equal, < world_size lost


def test_only_the_shards_a_slot_starts_or_ends_inside_have_their_documents_counted():
    corpus = [[5, 5], [4, 6], [3, 3, 4], [10]]
    order = np.arange(4)
    asked: list[int] = []

    def counts(shard: int) -> np.ndarray:
        asked.append(shard)
        return np.array(corpus[shard])

    pieces = list(TokenStream([10, 10, 10, 10], [2, 2, 3, 1], order).pieces(7, 33, counts))
    assert [(p.shard, p.start, p.stop, p.skip, p.num_tokens) for p in pieces] == [
        (0, 1, 2, 2, 3),  # tokens 7-9: the second document, from its third token
        (1, 0, 2, 0, 10),  # whole
        (2, 0, 3, 0, 10),  # whole
        (3, 0, 1, 0, 3),  # tokens 30-32: the first three of the last document
    ]
    assert asked == [0, 3]


def test_counts_that_disagree_with_the_total_are_refused():
    with pytest.raises(UsageError, match="shard 0: its documents' token counts sum to 9, not to the 10"):
        list(TokenStream([10], [2], np.arange(1)).pieces(3, 7, lambda s: np.array([4, 5])))
