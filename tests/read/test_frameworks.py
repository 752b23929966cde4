"""The training-framework recipes of the README and docs/frameworks.md, run
for real: 2 ranks under torchrun (gloo, CPU), 500 samples, 2 epochs. Each run
must deliver every sample exactly once per epoch over the ranks, with the
same number on each rank, and a new order in the second epoch.

One torchrun per framework: plain DDP, torchdata's ``StatefulDataLoader``
(restored mid-epoch) and accelerate's four data-loader settings (over a
dataset as users write it, its rank detected) share one
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
#: The accelerate run's second dataset: each of 2 DataLoader workers reads
#: 105 samples, not a whole number of accelerate's batches (see
#: :func:`test_accelerate_repeats_and_leaves_out_only_what_its_log_line_counts`).
SHORT = (100, 100, 10)


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


def _run(script: str, data: str, out: str, *args: str) -> list[dict]:
    return launch(os.path.join(HERE, script), RANKS, ["--data", data, "--out", out, *args], out=out, timeout_s=180)


@pytest.fixture(scope="module")
def accelerate_runs(data, tmp_path_factory) -> list[dict]:
    pytest.importorskip("accelerate")
    short = str(tmp_path_factory.mktemp("frameworks") / "short")
    build_dataset(short, SHORT, payload_bytes=10)
    return _run("accelerate_run.py", data, str(tmp_path_factory.mktemp("accelerate")), "--short", short)


def test_plain_ddp_reads_every_sample_once_per_epoch(accelerate_runs):
    _check_epochs([result["ddp"] for result in accelerate_runs])


def test_stateful_dataloader_restored_mid_epoch_reads_every_sample_once(accelerate_runs):
    _check_epochs([result["stateful"] for result in accelerate_runs])


@pytest.mark.parametrize("config", ["default", "no_dispatch", "no_dispatch_split", "dispatch_split"])
def test_accelerate_reads_every_sample_once_per_epoch(accelerate_runs, config):
    """A dataset that detects its rank becomes the stream accelerate splits;
    ``len(loader)``, asked before the first epoch, counts its batches."""
    _check_epochs([result[config]["epochs"] for result in accelerate_runs])
    for result in accelerate_runs:
        assert result[config]["batches"] == [result[config]["len"]] * EPOCHS


def _split_line(wrapper: str, reads: str, cost: str = "") -> str:
    return (
        f"accelerate's {wrapper} splits this ShardDataset across 2 processes: {reads}, so the dataset reads the "
        f"whole stream (rank 0 of 1; its DataLoader workers still divide it).{cost} shardkit.make_loader(dataset) "
        "without accelerator.prepare() reads each sample once, on the process that trains on it."
    )


DISPATCH_LINE = _split_line("DataLoaderDispatcher", "process 0 reads every sample and sends each process its part of each batch")
SHARD_READS = "every process reads every sample and keeps its part of each batch (2x the reading; the same order on every process)"


#: The log lines of the runs over :data:`SHORT` (each also logs, once, the line of its mode over the test's data).
SHORT_LINES = {
    "no_dispatch": _split_line("IterableDatasetShard", SHARD_READS, " This epoch accelerate repeats 30 samples to complete its last batches."),
    "dispatch_split": _split_line(
        "DataLoaderDispatcher",
        "process 0 reads every sample and sends each process its part of each batch",
        " This epoch accelerate repeats 1 sample to complete its last batches and leaves out 1 sample (batches it "
        "cannot fill or divide among the processes).",
    ),
}


def test_accelerate_split_is_logged_once_per_process_with_its_cost(accelerate_runs):
    expected = [DISPATCH_LINE, _split_line("IterableDatasetShard", SHARD_READS), *SHORT_LINES.values()]
    for result in accelerate_runs:
        # Once per process and line: the split_batches runs log their mode's line again, so nothing.
        assert result["logged"] == expected


@pytest.mark.parametrize(("config", "repeated", "left_out"), [("no_dispatch", 30, 0), ("dispatch_split", 1, 1)])
def test_accelerate_repeats_and_leaves_out_only_what_its_log_line_counts(accelerate_runs, config, repeated, left_out):
    """Each worker's 105 samples end in batches accelerate cannot fill or
    divide evenly. Without dispatching, each worker's last batch of 20 is
    completed by repeating its first 15 samples. Dispatching with
    ``split_batches``, worker 0's last batch of 5 comes before worker 1's
    and is cut 2 + 2 (one sample lost), and worker 1's, the epoch's last,
    is completed with one sample of the first batch. The samples that do
    come are each distinct but for those repeats, in both epochs."""
    everything = all_indices(SHORT)
    for epoch in range(EPOCHS):
        received = [indices for result in accelerate_runs for indices in result["short"][config]["epochs"][epoch]]
        assert set(received) <= set(everything)
        assert (len(received) - len(set(received)), len(everything) - len(set(received))) == (repeated, left_out)


@pytest.mark.parametrize(("config", "wrapper"), [("default", "DataLoaderDispatcher"), ("no_dispatch", "IterableDatasetShard")])
def test_accelerate_refuses_a_dataset_given_one_ranks_share(accelerate_runs, config, wrapper):
    for rank, result in enumerate(accelerate_runs):
        assert result["refused"][config] == (
            f"accelerate's {wrapper} splits this DataLoader across processes, and this ShardDataset was built with "
            f"rank={rank}, world_size=2 to read only that rank's share: leave rank= and world_size= out (under "
            "accelerate the dataset then reads the whole stream, which accelerate splits), or iterate "
            "shardkit.make_loader(dataset) without accelerator.prepare()"
        )


def test_accelerate_refuses_a_dataset_read_in_tensor_parallel_groups(accelerate_runs):
    for result in accelerate_runs:
        assert result["refused"]["replicated"] == (
            "accelerate's DataLoaderDispatcher splits this DataLoader across processes, and this ShardDataset was "
            "built with replication=2: the ranks of a group would get different batches. Iterate "
            "shardkit.make_loader(dataset) without accelerator.prepare()"
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


def test_a_state_taken_under_accelerate_resumes_under_accelerate(data, monkeypatch):
    """``dispatch_batches=False`` in one process, each of 2 processes in
    turn (torchrun's RANK and WORLD_SIZE set): a dataset that detects rank
    p of 2 and is read through accelerate's IterableDatasetShard is the
    whole stream; its state after 7 of the process's batches, loaded into a
    new such dataset (which still detects p of 2 when it loads it), gives
    the rest of the epoch. Over both processes, every sample once."""
    data_loader = pytest.importorskip("accelerate.data_loader")
    import shardkit
    from tests.read.frameworks_util import to_features

    monkeypatch.setenv("WORLD_SIZE", str(RANKS))
    received: list[int] = []
    for process in range(RANKS):
        monkeypatch.setenv("RANK", str(process))
        datasets = [shardkit.ShardDataset(data, seed=0, map=to_features) for _ in range(2)]
        assert [dataset.world.world_size for dataset in datasets] == [RANKS, RANKS]
        shards = [data_loader.IterableDatasetShard(dataset, 10, False, RANKS, process) for dataset in datasets]
        shards[0].set_epoch(1)  # as accelerate's DataLoaderShard does when its iteration begins
        head = iter(shards[0])
        received += [next(head)["idx"] for _ in range(70)]
        datasets[1].load_state_dict(datasets[0].state_dict())
        shards[1].set_epoch(1)
        received += [sample["idx"] for sample in shards[1]]
        assert [dataset.world.world_size for dataset in datasets] == [1, 1]
    assert sorted(received) == ALL


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("split_batches", [False, True])
@pytest.mark.parametrize("worker_counts", [[200, 200], [195, 195], [7], [101, 100, 100], [0, 3]])
def test_split_cost_counts_what_iterable_dataset_shard_does(worker_counts, split_batches, drop_last):
    """The log line's count for ``dispatch_batches=False``, against
    accelerate's own IterableDatasetShard run over each worker's samples
    for each of 2 processes."""
    data_loader = pytest.importorskip("accelerate.data_loader")
    from shardkit.read.frameworks import SHARD, AccelerateSplit, split_cost

    split = AccelerateSplit(SHARD, num_processes=2, batch_size=10, drop_last=drop_last, split_batches=split_batches, num_workers=2)
    received: list[tuple[int, int]] = []
    for process in range(2):
        for worker, count in enumerate(worker_counts):
            samples = [(worker, i) for i in range(count)]
            shard = data_loader.IterableDatasetShard(samples, 10, drop_last, 2, process, split_batches)
            received += list(shard)
    total = sum(worker_counts)
    repeated, left_out = split_cost(split, worker_counts)
    assert (len(received) - len(set(received)), total - len(set(received))) == (repeated, left_out)
