"""Document boundaries in token blocks (issue #55): ``TokenBlocks(...,
boundaries=True)`` gives every token its position in its document and each
block's documents' parts, from the stored counts. The probe corpus's ids say
(document, position) themselves: ``id // STRIDE`` and ``id % STRIDE``."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

from shardkit import ShardDataset, TokenBlocks, make_loader
from shardkit.errors import UsageError
from shardkit.read import block_output
from shardkit.read.packer import Packer
from tests.read.token_data import STRIDE, write_documents
from tests.read.torchrun_util import launch

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_boundaries.py")
EOS = 9_999_999


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, dict[int, int]]:
    dest = str(tmp_path_factory.mktemp("boundaries") / "docs")
    documents = write_documents(dest, 70, per_shard=9)
    return dest, {int(d[0]) // STRIDE: len(d) for d in documents if len(d)}


def check_block(tokens: np.ndarray, positions: np.ndarray, cu: np.ndarray, lengths: dict[int, int], eos: int | None) -> None:
    """Every position and part of one block (or a batch flattened) against the ids."""
    is_eos = tokens == eos if eos is not None else np.zeros(len(tokens), dtype=bool)
    ids = tokens[~is_eos]
    assert (positions[~is_eos] == ids % STRIDE).all()
    # An eos sits at its document's end: one past its last token.
    for at in np.flatnonzero(is_eos):
        if at % 64 and not is_eos[at - 1]:  # (a batch's blocks are not neighbours in the stream)
            assert positions[at] == positions[at - 1] + 1 == lengths[int(tokens[at - 1]) // STRIDE]
    assert cu[0] == 0 and cu[-1] == len(tokens) and (np.diff(cu) > 0).all()
    for lo, hi in zip(cu[:-1], cu[1:]):
        part = tokens[lo:hi][~is_eos[lo:hi]]
        assert len(set((part // STRIDE).tolist())) <= 1  # one document a part
        assert positions[lo] == 0 or lo % 64 == 0  # a part starts a document, or a block
        assert (np.diff(positions[lo:hi]) == 1).all()


@pytest.mark.parametrize("eos", [None, EOS])
def test_positions_and_parts_come_from_the_counts_in_blocks_and_batches(corpus, eos):
    data, lengths = corpus
    tokens = TokenBlocks("tokens.npy", 64, eos=eos, boundaries=True)
    blocks = list(ShardDataset(data, tokens=tokens, mode="exact", seed=3))
    assert blocks and all(b["tokens"].shape == b["position_ids"].shape == (64,) for b in blocks)
    for b in blocks:
        check_block(b["tokens"].numpy(), b["position_ids"].numpy(), b["cu_seqlens"].numpy(), lengths, eos)
        assert b["max_seqlen"] == int(b["seq_lens"].max()) and b["cu_seqlens"].dtype == torch.int32
    carried = sum(int(b["position_ids"][0]) > 0 for b in blocks)
    assert carried > len(blocks) // 2  # most blocks begin inside a document: their true positions were kept
    plain = list(ShardDataset(data, tokens=TokenBlocks("tokens.npy", 64, eos=eos), mode="exact", seed=3))
    assert all(torch.equal(a, b["tokens"]) for a, b in zip(plain, blocks))  # the same blocks, in the same order
    loader = make_loader(ShardDataset(data, tokens=tokens, mode="exact", seed=3), batch_size=4, num_workers=2)
    seen = 0
    for batch in loader:
        flat = batch["tokens"].reshape(-1).numpy()
        check_block(flat, batch["position_ids"].reshape(-1).numpy(), batch["cu_seqlens"].numpy(), lengths, eos)
        assert batch["seq_lens"].shape[0] == len(batch["tokens"]) and int(batch["seq_lens"].sum()) == flat.size
        seen += len(batch["tokens"])
    assert seen == len(blocks)


def _flag_dicts(batch: dict) -> dict:  # a user's collate_fn: it sees each batch as the dataset made it
    return {**batch, "was_a_dict": isinstance(batch, dict)}


@pytest.mark.parametrize(
    "loader", ["make_loader, one buffer", "make_loader, layouts", "make_loader, collate_fn", "DataLoader"]
)
def test_batches_made_in_workers_arrive_as_the_batches_made_in_process(corpus, loader, monkeypatch):
    data, lengths = corpus
    if loader.endswith("layouts"):  # batches this small cross as layouts too (the workers are forked)
        monkeypatch.setattr(block_output, "LAID_FROM_TOKENS", 0)
    ds = ShardDataset(data, tokens=TokenBlocks("tokens.npy", 64, boundaries=True), mode="exact", seed=3, batch_size=4)
    if loader == "DataLoader":
        batches = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    else:
        collate = _flag_dicts if loader.endswith("collate_fn") else None
        batches = list(make_loader(ds, num_workers=2, collate_fn=collate))
        assert all(b.pop("was_a_dict", True) for b in batches)
    rows = {}  # each block, by its tokens: its positions and parts as made in this process
    for b in ShardDataset(data, tokens=TokenBlocks("tokens.npy", 64, boundaries=True), mode="exact", seed=3):
        rows[b["tokens"].numpy().tobytes()] = (b["position_ids"].numpy(), b["seq_lens"].numpy())
    seen = 0
    for batch in batches:
        assert isinstance(batch, dict)
        assert sorted(batch) == ["cu_seqlens", "max_seqlen", "position_ids", "seq_lens", "tokens"]
        check_block(batch["tokens"].numpy().reshape(-1), batch["position_ids"].numpy().reshape(-1),
                    batch["cu_seqlens"].numpy(), lengths, None)  # fmt: skip
        for tokens, positions, parts in zip(batch["tokens"], batch["position_ids"], batch["seq_lens"]):
            want_positions, want_parts = rows.pop(tokens.numpy().tobytes())
            assert np.array_equal(positions.numpy(), want_positions)
            assert np.array_equal(parts.numpy()[: len(want_parts)], want_parts) and not parts[len(want_parts) :].any()
        assert batch["max_seqlen"] == int(batch["seq_lens"].max())
        # as layouts, only the tokens come in shared memory: the boundaries are made on arrival
        assert batch["tokens"].is_shared() and batch["position_ids"].is_shared() != loader.endswith("layouts")
        seen += len(batch["tokens"])
    assert not rows and seen  # every block once


def test_the_packer_lays_out_documents_however_they_come():
    rng = np.random.default_rng(7)
    for _ in range(300):
        size = int(rng.integers(1, 40))
        lengths = rng.integers(0, 3 * size, int(rng.integers(1, 30)))
        lengths[rng.random(len(lengths)) < 0.2] = size  # some documents exactly a block
        skip = int(rng.integers(0, lengths[0])) if lengths[0] else 0  # the first document's first tokens: read before
        truth = np.concatenate([np.arange(n) for n in lengths])[skip:]  # each token's position
        ids = np.arange(len(truth))
        packer, blocks, at = Packer(size), [], 0
        cuts = np.sort(rng.integers(0, len(lengths) + 1, int(rng.integers(0, 4))))
        for lo, hi in zip([0, *cuts], [*cuts, len(lengths)]):  # the documents handed over in runs
            chunk = lengths[lo:hi].copy()
            if lo == 0 and len(chunk):
                chunk[0] -= skip
            blocks += packer.add(ids[at : at + chunk.sum()], chunk, skip if lo == 0 else 0)
            at += chunk.sum()
        assert len(blocks) == len(truth) // size
        for k, (block, layout) in enumerate(blocks):
            assert np.array_equal(block, ids[k * size : (k + 1) * size]) and layout.dtype == np.int32
            assert np.array_equal(_positions_of(layout, size), truth[k * size : (k + 1) * size])


def _positions_of(layout: np.ndarray, size: int) -> np.ndarray:
    """The positions a layout says, one part after another."""
    assert layout[1:].sum() == size and (layout[1:] > 0).all()
    runs = [np.arange(layout[0], layout[0] + layout[1])] + [np.arange(n) for n in layout[2:]]
    return np.concatenate(runs)


def test_a_resumed_epoch_keeps_the_boundaries_exact(corpus):
    data, lengths = corpus
    tokens = TokenBlocks("tokens.npy", 64, boundaries=True)
    ds = ShardDataset(data, tokens=tokens, mode="exact", seed=8, buffer_size=16)
    first = list(itertools.islice(iter(ds), 23))
    again = ShardDataset(data, tokens=tokens, mode="exact", seed=8, buffer_size=16)
    again.load_state_dict(ds.state_dict())
    rest = list(again)
    for b in first + rest:
        check_block(b["tokens"].numpy(), b["position_ids"].numpy(), b["cu_seqlens"].numpy(), lengths, None)
    every = np.concatenate([b["tokens"].numpy() for b in first + rest])
    assert len(np.unique(every)) == len(every) == len(list(ShardDataset(data, tokens=tokens, mode="exact"))) * 64


def test_blocks_whose_parts_no_longer_fill_them_are_refused_when_batched(corpus):
    data, _ = corpus

    def drop_last_part(block):  # a map that breaks the layout: its parts no longer add up to the block
        return {**block, "seq_lens": block["seq_lens"][:-1]}

    ds = ShardDataset(data, tokens=TokenBlocks("tokens.npy", 64, boundaries=True), map=drop_last_part, batch_size=4)
    with pytest.raises(UsageError, match="do not fill 64 tokens each"):
        next(iter(ds))


def test_boundaries_must_be_a_bool():
    with pytest.raises(UsageError, match="boundaries must be True or False"):
        TokenBlocks("tokens.npy", 64, boundaries="yes")  # type: ignore[arg-type]


@pytest.mark.timeout(600)
def test_torchrun_three_ranks_resumed_on_two_give_every_position_right_once(corpus, tmp_path):
    data, lengths = corpus
    out = str(tmp_path / "out")
    full = launch(SCRIPT, 3, ["--data", data, "--out", out, "--phase", "full"], out=out, tag="full-")
    rest = launch(SCRIPT, 2, ["--data", data, "--out", out, "--phase", "resume"], out=out, tag="resume-")
    ids = []
    for result in full + rest:
        for tokens, positions, cu, _ in result["batches"]:
            flat = np.asarray(tokens).reshape(-1)
            check_block(flat, np.asarray(positions).reshape(-1), np.asarray(cu), lengths, EOS)
            ids.append(flat[flat != EOS])
    every = np.concatenate(ids)
    assert len(np.unique(every)) == len(every)  # no token twice, across the resume on another world size
    blocks = len(list(ShardDataset(data, tokens=TokenBlocks("tokens.npy", 64, eos=EOS), mode="exact")))
    assert sum(len(np.asarray(t)) for r in full + rest for t, _, _, _ in r["batches"]) == blocks
