"""``batching="per_stream"`` (issue #41): every batch of a mixture from one
stream, the same stream on every rank at every step, shares in whole
batches, and resume to the same step; under a real torchrun (2 ranks x 2
workers) and in one process."""

from __future__ import annotations

import collections
import os

import pytest

from shardkit import ShardDataset, Stream, make_loader
from shardkit.errors import StateError, UsageError
from tests.conftest import build_dataset
from tests.read.torchrun_util import launch

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_per_stream.py")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> str:
    """Two datasets of different sample shapes: ``small`` (8-byte payloads,
    100 samples), ``large`` (32-byte, 200)."""
    root = tmp_path_factory.mktemp("shapes")
    build_dataset(str(root / "small"), [40, 35, 25], payload_bytes=8)
    build_dataset(str(root / "large"), [70, 60, 70], payload_bytes=32)
    return str(root)


def _stream(batch: list[list[str]]) -> str:
    (stream,) = {s for s, _ in batch}  # one stream a batch
    return stream


@pytest.mark.timeout(600)
def test_two_ranks_take_batches_of_the_same_stream_at_every_step_and_resume_to_the_same_step(shapes, tmp_path):
    args = ["--data", shapes, "--out", str(tmp_path)]
    full = launch(SCRIPT, 2, [*args, "--phase", "full"], out=str(tmp_path), tag="full-")
    steps = [len(r["epoch0"]) for r in full]
    assert steps[0] == steps[1] == full[0]["len"][0]
    for r in full:
        # At each step every rank's batch is of the stream this rank's is (all_gather'd).
        assert all(len(set(agreed)) == 1 and agreed[0] == _stream(b) for agreed, b in zip(r["agreed"], r["epoch0"]))
    # Shares in whole batches: small 80 of 240 -> 20 a slot -> 5 batches of 4; large 160 -> 10 batches.
    per_stream = collections.Counter(_stream(b) for r in full for b in r["epoch0"])
    assert per_stream == {"small": 5 * 4, "large": 10 * 4}
    keys = [tuple(s) for r in full for b in r["epoch0"] for s in b]
    assert len(keys) == len(set(keys)) == 15 * 4 * 4  # 15 batches on each of 4 slots, no sample twice
    resumed = launch(SCRIPT, 2, [*args, "--phase", "resume"], out=str(tmp_path), tag="resume-")
    for before, after in zip(full, resumed):
        # The same steps as an uninterrupted epoch: the saved ones, then the rest.
        assert before["saved"] + after["resumed"] == before["whole"]


def _loader(shapes: str, **options):  # noqa: ANN202
    streams = [Stream(os.path.join(shapes, "small"), weight=1.0, name="small"),
               Stream(os.path.join(shapes, "large"), weight=2.0, name="large")]  # fmt: skip
    keys = lambda samples: [[s["__stream__"], s["__key__"]] for s in samples]  # noqa: E731
    ds = ShardDataset(streams, samples_per_epoch=240, seed=3, batch_size=4, collate=keys, batching="per_stream",
                      **options)  # fmt: skip
    return make_loader(ds, num_workers=2, persistent_workers=False)


@pytest.mark.parametrize("mode", ["exact", "balanced"])
def test_in_one_process_every_batch_is_of_one_stream_and_len_counts_them(shapes, mode):
    loader = _loader(shapes, mode=mode)
    batches = list(loader)
    assert len(batches) == len(loader) == 60  # 2 workers, each 30 batches: 40 small samples and 80 large
    assert collections.Counter(_stream(b) for b in batches) == {"small": 20, "large": 40}


def test_a_checkpoint_resumes_the_same_batches_in_a_new_loader(shapes):
    whole = list(_loader(shapes, epoch=1))
    first = _loader(shapes, epoch=1)
    it = iter(first)
    before = [next(it) for _ in range(7)]
    state = first.state_dict()
    del it
    again = _loader(shapes, epoch=1)
    again.load_state_dict(state)
    assert before + list(again) == whole
    stratified = ShardDataset([Stream(os.path.join(shapes, "small"), weight=1.0, name="small"),
                               Stream(os.path.join(shapes, "large"), weight=2.0, name="large")],
                              samples_per_epoch=240, seed=3, batch_size=4)  # fmt: skip
    with pytest.raises(StateError, match="batching"):
        stratified.load_state_dict(state)


def test_per_stream_batches_need_batch_size_and_in_order_delivery(shapes):
    streams = [Stream(os.path.join(shapes, "small")), Stream(os.path.join(shapes, "large"))]
    with pytest.raises(UsageError, match="batching='per_stream'.*batch_size="):
        ShardDataset(streams, batching="per_stream")
    with pytest.raises(UsageError, match="batching must be one of"):
        ShardDataset(streams, batching="per_device", batch_size=4)
    ds = ShardDataset(streams, batching="per_stream", batch_size=4)
    with pytest.raises(UsageError, match="needs in-order delivery"):
        make_loader(ds, num_workers=2, in_order=False)


def test_a_stratified_state_is_what_shardkit_saved_before_batching_existed_and_resumes(shapes):
    streams = [Stream(os.path.join(shapes, "small"), name="small"), Stream(os.path.join(shapes, "large"), name="large")]
    ds = ShardDataset(streams, mode="exact", seed=2, buffer_size=8)
    it = iter(ds)
    before = [next(it)["__key__"] for _ in range(30)]
    state = ds.state_dict()
    assert "batching" not in state["options"]  # as a shardkit before per-stream batches saved it
    again = ShardDataset(streams, mode="exact", seed=2, buffer_size=8)
    again.load_state_dict(state)
    assert len(before) + len(list(again)) == 300


def test_device_per_stream_gives_each_rank_its_own_order_of_the_same_batches(shapes):
    def ranks(batching: str) -> list[list[list[list[str]]]]:
        out = []
        for rank in range(2):
            streams = [Stream(os.path.join(shapes, "small"), weight=1.0, name="small"),
                       Stream(os.path.join(shapes, "large"), weight=2.0, name="large")]  # fmt: skip
            keys = lambda samples: [[s["__stream__"], s["__key__"]] for s in samples]  # noqa: E731
            ds = ShardDataset(streams, samples_per_epoch=240, seed=4, batch_size=4, collate=keys, batching=batching,
                              rank=rank, world_size=2)  # fmt: skip
            loader = make_loader(ds, num_workers=2, in_order=True, persistent_workers=False)
            out.append(list(loader))
        return out

    device, same = ranks("device_per_stream"), ranks("per_stream")
    for rank in range(2):
        assert collections.Counter(map(_stream, device[rank])) == collections.Counter(map(_stream, same[rank]))
        assert sorted(k for b in device[rank] for k in map(tuple, b)) == sorted(k for b in same[rank] for k in map(tuple, b))
    assert len(device[0]) == len(device[1])  # equal steps on every rank
    assert all(_stream(a) == _stream(b) for a, b in zip(*same))
    assert any(_stream(a) != _stream(b) for a, b in zip(*device))  # each rank its own stream at some steps


def test_device_per_stream_resumes_the_same_batches(shapes):
    def loader():  # noqa: ANN202
        streams = [Stream(os.path.join(shapes, "small"), weight=1.0, name="small"),
                   Stream(os.path.join(shapes, "large"), weight=2.0, name="large")]  # fmt: skip
        keys = lambda samples: [[s["__stream__"], s["__key__"]] for s in samples]  # noqa: E731
        ds = ShardDataset(streams, samples_per_epoch=240, seed=6, batch_size=4, collate=keys,
                          batching="device_per_stream", rank=1, world_size=3)  # fmt: skip
        return make_loader(ds, num_workers=2, in_order=True, persistent_workers=False)

    whole = list(loader())
    first = loader()
    it = iter(first)
    before = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    assert before + list(again) == whole
