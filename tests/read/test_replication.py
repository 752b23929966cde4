"""``replication=`` (issue #41) in one process: ranks of a group read as one
rank, for samples, token blocks and ShardWindowSampler; a world size it
does not divide is refused. Under a real torchrun:
tests/read/test_torchrun_replication.py."""

from __future__ import annotations

import pytest
import torch

from shardkit import ShardDataset, ShardWindowSampler, TokenBlocks, World, make_loader
from shardkit.errors import UsageError
from tests.conftest import build_dataset
from tests.read.token_data import write_documents

SIZES = [9, 14, 0, 13, 7, 11]


def _keys(ds: ShardDataset) -> list[str]:
    return [s["__key__"] for s in ds]


@pytest.mark.parametrize("mode", ["exact", "balanced"])
def test_each_rank_of_a_group_reads_what_its_group_reads_as_one_rank(tmp_path, mode):
    build_dataset(str(tmp_path), SIZES)
    for rank in range(6):
        ds = ShardDataset(str(tmp_path), mode=mode, seed=3, rank=rank, world_size=6, replication=3)
        alone = ShardDataset(str(tmp_path), mode=mode, seed=3, rank=rank // 3, world_size=2)
        assert ds.world == World(rank=rank // 3, world_size=2)
        assert _keys(ds) == _keys(alone) and len(ds) == len(alone)


def test_a_replicated_loader_delivers_in_order_and_refuses_otherwise(tmp_path):
    """Out of order, a rank's batch at a step is whichever worker finished
    first, so the ranks of a group would train on different batches."""
    build_dataset(str(tmp_path), SIZES)
    ds = ShardDataset(str(tmp_path), seed=3, rank=1, world_size=4, replication=2)
    assert make_loader(ds, num_workers=2).in_order is True
    with pytest.raises(UsageError, match=r"replication=2 .*in-order delivery.*in_order"):
        make_loader(ds, num_workers=2, in_order=False)
    alone = ShardDataset(str(tmp_path), seed=3, rank=1, world_size=4)
    assert make_loader(alone, num_workers=2).in_order is False


def test_token_blocks_of_a_group_agree(tmp_path):
    write_documents(str(tmp_path), 40)
    blocks = TokenBlocks("tokens.npy", 16)
    got = [[b.tolist() for b in ShardDataset(str(tmp_path), tokens=blocks, seed=1, rank=r, world_size=4, replication=2)]
           for r in range(4)]  # fmt: skip
    assert got[0] == got[1] and got[2] == got[3] and got[0] != got[2]
    assert not {tuple(b) for b in got[0]} & {tuple(b) for b in got[2]}


def test_the_window_sampler_gives_a_group_the_same_indices():
    counts = [50, 30, 20, 40]
    draw = [list(ShardWindowSampler(counts, rank=r, world_size=4, replication=2, seed=2)) for r in range(4)]
    assert draw[0] == draw[1] and draw[2] == draw[3]
    assert draw[0] == list(ShardWindowSampler(counts, rank=0, world_size=2, seed=2))
    assert not set(draw[0]) & set(draw[2])


@pytest.mark.parametrize("replication,problem", [(4, "does not divide world_size 6"), (0, "an int >= 1"),
                                                 (True, "an int >= 1"), (1.5, "an int >= 1")])  # fmt: skip
def test_a_replication_the_world_cannot_hold_is_refused(tmp_path, replication, problem):
    build_dataset(str(tmp_path), SIZES)
    with pytest.raises(UsageError, match=f"replication.*{problem}"):
        ShardDataset(str(tmp_path), rank=0, world_size=6, replication=replication)


def test_replication_comes_from_torchrun_s_environment_too(tmp_path, monkeypatch):
    build_dataset(str(tmp_path), SIZES)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    ds = ShardDataset(str(tmp_path), replication=2)
    assert ds.world == World(rank=1, world_size=2)
    assert torch.equal(torch.tensor(len(ds)), torch.tensor(len(ShardDataset(str(tmp_path), rank=1, world_size=2))))
