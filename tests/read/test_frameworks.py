"""The README's training-framework recipes, run for real: 2 ranks under
torchrun (gloo, CPU), 500 samples, 2 epochs. Each run must deliver every
sample exactly once per epoch over the ranks, with the same number on each
rank, and a new order in the second epoch.

One torchrun per framework: plain DDP and accelerate's four data-loader
settings share one (tests/read/accelerate_run.py), the Hugging Face
``Trainer`` and Lightning have one each.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import build_dataset
from tests.read.frameworks_util import SIZES, all_indices
from tests.read.torchrun_util import launch

HERE = os.path.dirname(__file__)
RANKS = 2
EPOCHS = 2
ALL = all_indices()
PER_RANK = len(ALL) // RANKS


def _check_epochs(per_rank: list[list[list[int]]]) -> None:
    """``per_rank[rank][epoch]``: each epoch every sample exactly once over the
    ranks, the same count on each, and a different order than the last."""
    for epoch in range(EPOCHS):
        received = [indices for rank in per_rank for indices in rank[epoch]]
        assert sorted(received) == ALL, f"epoch {epoch}"
        assert [len(rank[epoch]) for rank in per_rank] == [PER_RANK] * RANKS
    assert per_rank[0][0] != per_rank[0][1], "the second epoch repeats the first one's order"


def _by_epoch(seen: list[int]) -> list[list[int]]:
    """A rank's training-order indices cut into its epochs."""
    return [seen[epoch * PER_RANK : (epoch + 1) * PER_RANK] for epoch in range(EPOCHS)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("frameworks") / "data")
    build_dataset(path, SIZES, payload_bytes=10)
    return path


def _run(script: str, data: str, out: str) -> list[dict]:
    return launch(os.path.join(HERE, script), RANKS, ["--data", data, "--out", out], out=out, timeout_s=180)


@pytest.fixture(scope="module")
def accelerate_runs(data, tmp_path_factory) -> list[dict]:
    pytest.importorskip("accelerate")
    return _run("accelerate_run.py", data, str(tmp_path_factory.mktemp("accelerate")))


def test_plain_ddp_reads_every_sample_once_per_epoch(accelerate_runs):
    _check_epochs([result["ddp"] for result in accelerate_runs])


@pytest.mark.parametrize("config", ["default", "no_dispatch", "no_dispatch_split", "dispatch_split"])
def test_accelerate_reads_every_sample_once_per_epoch(accelerate_runs, config):
    _check_epochs([result[config] for result in accelerate_runs])


@pytest.mark.parametrize(("config", "wrapper"), [("default", "DataLoaderDispatcher"), ("no_dispatch", "IterableDatasetShard")])
def test_accelerate_refuses_a_dataset_that_splits_by_rank_itself(accelerate_runs, config, wrapper):
    for rank, result in enumerate(accelerate_runs):
        assert result["refused"][config] == (
            f"accelerate's {wrapper} splits this DataLoader across processes again, and this ShardDataset "
            f"already reads only rank {rank}'s share of 2: build it with rank=0, world_size=1 (one stream, "
            "which accelerate splits), or iterate shardkit.make_loader(dataset) without accelerator.prepare()"
        )


def test_hugging_face_trainer_reads_every_sample_once_per_epoch(data, tmp_path):
    pytest.importorskip("transformers")
    results = _run("trainer_run.py", data, str(tmp_path))
    _check_epochs([_by_epoch(result["seen"]) for result in results])


def test_lightning_ddp_reads_every_sample_once_per_epoch(data, tmp_path):
    pytest.importorskip("lightning")
    results = _run("lightning_run.py", data, str(tmp_path))
    _check_epochs([_by_epoch(result["seen"]) for result in results])
