"""The training-framework recipes of the README and docs/frameworks.md, run
for real: 2 ranks under torchrun (gloo, CPU), 500 samples, 2 epochs. Each run must deliver every
sample exactly once per epoch over the ranks, with the same number on each
rank, and a new order in the second epoch.

One torchrun per framework: plain DDP, torchdata's ``StatefulDataLoader``
(restored mid-epoch) and accelerate's four data-loader settings share one
(tests/read/accelerate_run.py), the Hugging Face
``Trainer`` and Lightning have one each. The recipes (blocks fenced
``python torchrun``) are these runs: every line of each, in order, is a line
of its script, but for the substitutions :data:`README_TO_RUN` states.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import build_dataset
from tests.read.frameworks_util import SIZES, all_indices
from tests.read.torchrun_util import launch
from tests.test_readme import PAGES, TORCHRUN_FENCE

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


def test_stateful_dataloader_restored_mid_epoch_reads_every_sample_once(accelerate_runs):
    _check_epochs([result["stateful"] for result in accelerate_runs])


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


#: The script that runs each README recipe, by the framework it imports first.
RECIPE_SCRIPTS = (("accelerate", "accelerate_run.py"), ("transformers", "trainer_run.py"), ("lightning", "lightning_run.py"))
#: (README text, script text, why): applied to every README recipe line.
README_TO_RUN: tuple[tuple[str, str, str], ...] = (
    ('"shards/train"', "data", "the test's dataset"),
    ("Accelerator()", "Accelerator(dataloader_config=DataLoaderConfiguration(**config))", "each of four configurations"),
    ('output_dir="out"', "output_dir=out", "a temporary folder"),
    ("dataloader_num_workers=2)", "dataloader_num_workers=2, **ON_CPU_QUIETLY)", "CPU, no reports or checkpoints"),
    (
        "batch_size=5, num_workers=2)",
        'batch_size=5, num_workers=2, multiprocessing_context="forkserver")',
        "Lightning's workers from a forkserver: Python 3.11.7 can hang forking beside gloo's thread (gh-112275)",
    ),
    (
        'L.Trainer(devices=8, strategy="ddp", max_epochs=2).fit(Model())',
        'L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, **QUIETLY).fit(model)',
        "two CPU processes, quietly; the test reads what the model saw",
    ),
)


def _code_lines(text: str) -> list[str]:
    """Stripped lines of code: no blanks, comments or ``...`` placeholders."""
    lines = (line.split("  # ")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#") and line != "..."]


def test_readme_recipes_are_what_these_runs_run():
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    blocks = re.findall(rf"^```python {TORCHRUN_FENCE}\n(.*?)^```", text, flags=re.M | re.S)
    assert len(blocks) == 5, (
        "the recipes of README.md and docs/frameworks.md: plain DDP, StatefulDataLoader, accelerate, Trainer, Lightning"
    )
    for block in blocks:
        for old, new, _ in README_TO_RUN:
            block = block.replace(old, new)
        imported = re.findall(r"^(?:from|import) (\w+)", block, flags=re.M)
        script = next((name for module, name in RECIPE_SCRIPTS if module in imported), "accelerate_run.py")
        with open(os.path.join(HERE, script), encoding="utf-8") as f:
            remaining = iter(_code_lines(f.read()))
        for line in _code_lines(block):
            # `in` on an iterator consumes it up to the match: the lines must come in order.
            assert line in remaining, f"README recipe line {line!r} is not in {script} (in this order)"


def test_accelerate_refuses_a_make_loader_loader(data):
    """accelerate's prepare() rebuilds a DataLoader from a make_loader()
    loader's dataset, whose items carry shardkit's checkpoint tags: refused at
    the first iteration (one process suffices: the rebuild happens anyway)."""
    accelerate = pytest.importorskip("accelerate")
    import shardkit

    dataset = shardkit.ShardDataset(data, seed=0)
    loader = shardkit.make_loader(dataset, batch_size=10, num_workers=0)
    loader.dataset.set_epoch(3)  # as with any DataLoader: reaches the dataset
    assert dataset.epoch == 3
    prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    with pytest.raises(shardkit.UsageError, match=r"^accelerator.prepare\(\) rebuilt a loader from shardkit.make_loader\(\)"):
        next(iter(prepared))
