"""Token blocks (issue #40) in one process: what an epoch's blocks hold, how
ranks share them, eos, resume through the loader, mixtures of token shares,
and the errors. Under a real torchrun: tests/read/test_torchrun_tokens.py."""

from __future__ import annotations

import collections
import functools
import itertools
import os
import pickle

import numpy as np
import pytest
import torch

import shardkit
from shardkit import ShardDataset, Stream, TokenBlocks, make_loader
from shardkit.errors import CorruptShardError, UsageError
from tests.read.token_data import STRIDE, runs, write_documents

BLOCK = 64


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, request) -> tuple[str, dict[str, np.ndarray]]:
    """150 documents of 1 to ~6,000 tokens, in shards of 23: the dataset and
    each document's token ids by key. Their dtypes change from document to
    document (read one by one), or with ``"one dtype"`` (indirect) do not
    (read in runs of a shard's documents)."""
    dest = str(tmp_path_factory.mktemp("tokens") / "ds")
    one = getattr(request, "param", "dtypes in turn") == "one dtype"
    documents = write_documents(dest, 150, **({"dtypes": (np.uint32,)} if one else {}))
    return dest, {f"doc{i:06d}": ids for i, ids in enumerate(documents)}


#: The tests that read a corpus both ways.
BOTH_WAYS = pytest.mark.parametrize("corpus", ["dtypes in turn", "one dtype"], indirect=True)


def stored_stream(dest: str, documents: dict[str, np.ndarray], eos: int | None = None) -> np.ndarray:
    """The token stream of an unshuffled epoch: documents in stored order."""
    keys = [s["__key__"] for s in ShardDataset(dest, shuffle=False, mode="exact")]
    tail = [] if eos is None else [np.array([eos])]
    return np.concatenate([part for key in keys for part in [documents[key], *tail]])


def blocks_of(ds: ShardDataset) -> list[np.ndarray]:
    out = []
    for block in ds:
        assert isinstance(block, torch.Tensor) and block.dtype == torch.int64 and block.shape == (BLOCK,)
        out.append(block.numpy())
    return out


@BOTH_WAYS
def test_an_exact_epoch_over_three_ranks_holds_every_full_block_once_and_no_token_twice(corpus):
    dest, documents = corpus
    total = sum(len(ids) for ids in documents.values())
    blocks = []
    for rank in range(3):
        ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), mode="exact", seed=5, rank=rank, world_size=3)
        got = blocks_of(ds)
        assert len(got) == len(ds)
        blocks += got
    assert len(blocks) == total // BLOCK  # only the stream's last partial block is left out
    tokens = np.concatenate(blocks)
    assert len(np.unique(tokens)) == len(tokens)  # no token twice
    every = np.concatenate(list(documents.values()))
    assert len(np.setdiff1d(every, tokens)) == total % BLOCK
    for block in blocks:  # a block never reorders a document's tokens
        for run in runs(block):
            assert len(np.unique(run // STRIDE)) <= 2  # a run is one document, or one's end and the next one's start
        positions = collections.defaultdict(list)
        for token in block:
            positions[int(token) // STRIDE].append(int(token) % STRIDE)
        assert all(ks == list(range(ks[0], ks[0] + len(ks))) for ks in positions.values())


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_balanced_gives_every_rank_the_same_number_of_blocks_whatever_the_documents(corpus, world_size):
    dest, documents = corpus
    total = sum(len(ids) for ids in documents.values())
    counts = []
    for rank in range(world_size):
        ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), seed=1, rank=rank, world_size=world_size)
        counts.append((len(ds), len(blocks_of(ds))))
    assert len(set(counts)) == 1, counts  # len() says it, and every rank yields it
    assert counts[0][0] == (total // BLOCK) // world_size  # fewer than world_size blocks lost


@BOTH_WAYS
def test_eos_follows_every_document_and_an_unshuffled_epoch_is_the_stored_stream(corpus):
    dest, documents = corpus
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK, eos=7), shuffle=False, mode="exact")
    stream = stored_stream(dest, documents, eos=7)
    got = np.concatenate(blocks_of(ds))
    assert len(got) == len(stream) // BLOCK * BLOCK
    assert np.array_equal(got, stream[: len(got)])  # a document of ~90 blocks comes whole, in order
    assert (got == 7).sum() == (stream[: len(got)] == 7).sum() >= 100


@BOTH_WAYS
def test_the_loader_batches_blocks_and_len_counts_them(corpus):
    dest, _ = corpus
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), seed=2, batch_size=4, partial_batches=False)
    loader = make_loader(ds, batch_size=None, num_workers=2)
    batches = list(loader)
    assert all(b.shape == (4, BLOCK) and b.dtype == torch.int64 for b in batches)
    assert len(batches) == len(loader)
    rows = torch.cat(batches).numpy()
    assert len(np.unique(rows)) == rows.size


@BOTH_WAYS
def test_a_checkpoint_through_the_loader_resumes_the_same_epoch_in_a_new_loader(corpus):
    dest, _ = corpus

    def loader() -> torch.utils.data.DataLoader:
        ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), mode="exact", seed=3, epoch=1, buffer_size=40)
        return make_loader(ds, batch_size=4, num_workers=2)

    whole = torch.cat(list(loader())).numpy()
    first = loader()
    taken = [b for b in itertools.islice(first, 6)]
    state = first.state_dict()
    del first
    second = loader()
    second.load_state_dict(state)
    rest = list(second)
    resumed = torch.cat(taken + rest).numpy()
    # The blocks the buffer held at the checkpoint are read again by position; none lost, none twice.
    assert sorted(map(tuple, resumed.tolist())) == sorted(map(tuple, whole.tolist()))


def test_a_checkpoint_resumes_on_another_worker_count_every_block_once(corpus):
    dest, _ = corpus

    def loader(workers: int) -> torch.utils.data.DataLoader:
        ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), mode="exact", seed=9, buffer_size=20)
        return make_loader(ds, batch_size=4, num_workers=workers)

    whole = torch.cat(list(loader(2))).numpy()
    first = loader(2)
    taken = list(itertools.islice(first, 5))
    state = first.state_dict()
    del first
    second = loader(3)  # three workers share what the two had left
    second.load_state_dict(state)
    resumed = torch.cat(taken + list(second)).numpy()
    assert sorted(map(tuple, resumed.tolist())) == sorted(map(tuple, whole.tolist()))


def test_a_mixture_shares_tokens_by_weight(tmp_path):
    short, long = str(tmp_path / "short"), str(tmp_path / "long")
    write_documents(short, 200, long_every=10**9)  # 1-400 tokens each
    write_documents(long, 40, base=10**9, long_every=2)  # every other one 2,000-6,000
    streams = [Stream(short, weight=3.0, name="short"), Stream(long, weight=1.0, name="long")]
    ds = ShardDataset(streams, tokens=TokenBlocks("tokens.npy", BLOCK), samples_per_epoch=80, mode="exact", seed=0)
    blocks = blocks_of(ds)
    assert len(blocks) == len(ds) == 80
    from_long = np.concatenate(blocks) >= 10**9
    assert from_long.sum() == 20 * BLOCK  # 3:1 of the tokens, whatever the documents' lengths


def test_a_field_that_is_not_a_1d_integer_array_is_an_error_naming_the_sample(tmp_path):
    dest = str(tmp_path / "ds")
    write_documents(dest, 30, per_shard=10)
    shard = os.path.join(dest, "shard-000001.tar")
    data = bytearray(open(shard, "rb").read())
    at = data.index(b"'descr': '<i")  # the first document of the shard stored as int32 or int64
    data[at + 11 : at + 12] = b"f"  # the same bytes, read as floats
    open(shard, "wb").write(bytes(data))
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", 8), shuffle=False, mode="exact")
    with pytest.raises(CorruptShardError, match=r"shard-000001\.tar: sample 'doc\d+': field 'tokens\.npy' holds a "
                       r"float\d+ array of shape \(\d+,\), not a 1-D integer array of token ids") as info:
        list(ds)
    assert info.value.member.endswith(".tokens.npy")


def test_too_few_blocks_for_the_readers_is_a_clear_error(tmp_path):
    dest = str(tmp_path / "ds")
    documents = write_documents(dest, 3, long_every=10**9)
    total = sum(len(d) for d in documents)
    with pytest.raises(UsageError, match="fewer than one block of"):
        ShardDataset(dest, tokens=TokenBlocks("tokens.npy", total + 1))
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", total // 2), rank=0, world_size=3)
    with pytest.raises(UsageError, match=r"2 whole blocks of \d+: fewer than one block for each of the 3 readers"):
        list(ds)


def test_a_field_without_token_counts_is_refused_naming_the_fields_that_have_them(corpus):
    dest, _ = corpus
    with pytest.raises(UsageError, match="tokens.npy"):
        ShardDataset(dest, tokens=TokenBlocks("ids.npy", BLOCK))


def test_map_gets_each_block_and_decode_is_refused(corpus):
    dest, _ = corpus
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), map=lambda b: (b[:-1], b[1:]), mode="exact")
    inputs, targets = next(iter(ds))
    assert inputs.shape == targets.shape == (BLOCK - 1,) and torch.equal(inputs[1:], targets[:-1])
    with pytest.raises(UsageError, match="leave decode= and select= unset"):
        ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), decode="tensor")


def test_the_dataset_pickles_small_without_its_per_shard_arrays(corpus):
    dest, _ = corpus
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK))
    again = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 4_000
    assert len(again) == len(ds) and np.array_equal(next(iter(again)).numpy(), next(iter(ds)).numpy())


@BOTH_WAYS
@pytest.mark.parametrize("batch_size", [None, 4])
def test_int32_blocks_hold_the_ids_the_int64_blocks_hold(corpus, batch_size):
    dest, _ = corpus

    def read(dtype: torch.dtype) -> list[torch.Tensor]:
        ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK, eos=9, dtype=dtype), seed=3, batch_size=batch_size)
        return list(make_loader(ds, batch_size=None, num_workers=2, in_order=True))

    wide, narrow = read(torch.int64), read(torch.int32)
    assert len(wide) == len(narrow) > 10
    assert all(b.dtype == torch.int32 for b in narrow)
    assert all(torch.equal(a, b.long()) for a, b in zip(wide, narrow))


@pytest.mark.parametrize("batch_size", [None, 2])
def test_an_id_int32_cannot_hold_is_refused_naming_the_id_and_the_way_out(tmp_path, batch_size):
    dest = str(tmp_path / "ds")
    big = {"__key__": "doc000001", "tokens.npy": np.arange(2**31 - 4, 2**31 + 60, dtype=np.uint32)}
    shardkit.write_dataset([{"__key__": "doc000000", "tokens.npy": np.arange(64, dtype=np.uint32)}, big], dest)
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", 16, dtype=torch.int32), shuffle=False, batch_size=batch_size)
    with pytest.raises(UsageError, match=r"token id 2,147,483,659, which int32.*dtype=torch.int64"):
        list(ds)
    wide = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", 16), shuffle=False)
    assert int(torch.cat(list(wide)).max()) == 2**31 + 59


@pytest.mark.parametrize("bad", [dict(block_size=0), dict(block_size=2.5), dict(eos=-1), dict(field=""), dict(eos=True),
                                 dict(dtype=torch.int16), dict(dtype="int64"), dict(dtype=torch.int32, eos=2**31)])  # fmt: skip
def test_bad_token_options_are_refused(bad):
    with pytest.raises(UsageError, match="TokenBlocks"):
        TokenBlocks(**{"field": "tokens.npy", "block_size": 8, **bad})


def test_token_blocks_is_public():
    assert shardkit.TokenBlocks is TokenBlocks


def test_torchdata_stateful_dataloader_resumes_blocks_in_order(corpus):
    from torchdata.stateful_dataloader import StatefulDataLoader

    dest, _ = corpus

    def new() -> StatefulDataLoader:
        ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), mode="exact", seed=4, buffer_size=25)
        return StatefulDataLoader(ds, batch_size=4, num_workers=2)

    full = [b.tolist() for b in new()]
    loader = new()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(7)]
    state = loader.state_dict()
    del it, loader
    again = new()
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == full  # the very batches, in order


def test_infinite_mode_runs_on_into_the_next_epochs_blocks(corpus):
    dest, documents = corpus
    total = sum(len(ids) for ids in documents.values())
    epoch = total // BLOCK
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", BLOCK), mode="infinite", seed=8, rank=1, world_size=2)
    blocks = np.array([b.numpy() for b in itertools.islice(ds, epoch + 10)])  # more than this rank's half of two epochs
    assert blocks.shape == (epoch + 10, BLOCK)
    counts = collections.Counter(blocks.ravel().tolist())
    assert max(counts.values()) <= 3  # a token at most once an epoch (two epochs and the start of a third)


def test_a_mixture_stream_with_fewer_blocks_than_ranks_is_read(tmp_path):
    big, tiny = str(tmp_path / "big"), str(tmp_path / "tiny")
    write_documents(big, 60, long_every=10**9)
    write_documents(tiny, 2, base=10**9, long_every=10**9)
    streams = [Stream(big, weight=9.0), Stream(tiny, weight=1.0)]
    got = []
    for rank in range(8):
        ds = ShardDataset(streams, tokens=TokenBlocks("tokens.npy", 8), samples_per_epoch=40, mode="exact", seed=0,
                          rank=rank, world_size=8)
        blocks = [b.numpy() for b in ds]
        assert len(blocks) == len(ds)
        got += blocks
    assert len(got) == 40 and sum(bool((b >= 10**9).all()) for b in got) == 4  # the tiny stream's 4 blocks, on 4 ranks


EMPTY_EVERY_OTHER = (0, 5, 0, 0, 7, 0, 3, 0)


@pytest.fixture(scope="module")
def with_empty(tmp_path_factory) -> str:
    """40 documents, half of them empty, in shards of 6."""
    from tests.read.token_data import sized_document

    dest = str(tmp_path_factory.mktemp("empty") / "ds")
    shardkit.write_dataset(range(40), dest, map=functools.partial(sized_document, lengths=EMPTY_EVERY_OTHER),
                           options=shardkit.WriteOptions(max_samples=6, workers=1))
    return dest


@pytest.mark.parametrize("eos", [None, 3])  # no real token is 3: document 0 is empty
def test_empty_documents_take_no_place_but_their_eos(with_empty, eos):
    tokens = 40 // len(EMPTY_EVERY_OTHER) * sum(EMPTY_EVERY_OTHER) + (40 if eos is not None else 0)
    blocks = []
    for rank in range(2):
        ds = ShardDataset(with_empty, tokens=TokenBlocks("tokens.npy", 4, eos=eos), mode="exact", seed=2, rank=rank,
                          world_size=2, buffer_size=5)
        got = [b.numpy() for b in ds]
        assert all(b.shape == (4,) for b in got)
        blocks += got
    assert len(blocks) == tokens // 4
    got = np.concatenate(blocks)
    ids = got if eos is None else got[got != eos]
    assert len(np.unique(ids)) == len(ids)  # no token twice
    assert len(got) - len(ids) >= tokens // 4 * 4 - 40 // len(EMPTY_EVERY_OTHER) * sum(EMPTY_EVERY_OTHER)
