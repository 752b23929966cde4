"""make_loader's start watch: a DataLoader worker that never starts becomes
an error naming it, instead of a job that waits for it forever."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from shardkit import ShardDataset, WorkerStartError, make_loader
from shardkit.read.loader import ShardLoader
from shardkit.read.worker_start import cpu_ticks

pytestmark = pytest.mark.skipif(cpu_ticks(os.getpid()) is None, reason="the watch reads /proc (Linux)")


def _stop_worker_one(worker: int) -> None:
    # Stands in for a worker stuck before its first line (a fork that hangs):
    # a stopped process runs nothing and uses no CPU.
    if worker == 1:
        os.kill(os.getpid(), signal.SIGSTOP)


def _spin_then_start(worker: int) -> None:
    # A slow start that is not a stuck one: busy for longer than the timeout.
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        pass


def _keys(manifest) -> list[str]:
    return sorted(f"s{i:03d}_{j:05d}" for i, shard in enumerate(manifest.shards) for j in range(shard.num_samples))


@pytest.mark.parametrize("in_order", [True, False])
def test_a_worker_that_never_starts_is_stopped_and_named(make_shards, in_order):
    manifest = make_shards([4, 4, 4])
    ds = ShardDataset(manifest, mode="exact")
    loader = ShardLoader(
        ds, batch_size=None, num_workers=2, worker_init_fn=_stop_worker_one, worker_start_timeout_s=1.0,
        persistent_workers=True, in_order=in_order,
    )  # fmt: skip
    started = time.monotonic()
    try:
        for _ in loader:
            pass
    except WorkerStartError as exc:
        message, cause = str(exc), exc.__cause__
        exc.__traceback__ = None  # its frames hold the loader: let it shut its workers down now, not in a later gc
    else:
        pytest.fail("the stopped worker was not named")
    # Found after ~1 s without CPU; the DataLoader notices the stopped worker
    # within its own status interval (5 s).
    assert time.monotonic() - started < 30
    assert re.search(r"DataLoader worker 1 \(pid \d+\) never started", message)
    assert "worker_start_timeout_s" in message
    assert isinstance(cause, RuntimeError)


def test_a_slow_but_busy_start_is_not_stopped(make_shards):
    manifest = make_shards([3, 5, 2])
    ds = ShardDataset(manifest, mode="exact")
    loader = ShardLoader(
        ds, batch_size=None, num_workers=2, worker_init_fn=_spin_then_start, worker_start_timeout_s=0.5,
        persistent_workers=False,
    )  # fmt: skip
    for _ in range(2):  # new workers each epoch, watched each time
        assert sorted(s["__key__"] for s in loader) == _keys(manifest)
    # Once every worker has started the watch ends: nothing is left polling.
    deadline = time.monotonic() + 5
    while any(t.name == "shardkit-worker-start-watch" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the start watch outlived the workers' start"
        time.sleep(0.1)


@pytest.mark.parametrize("context", ["spawn"])  # the flags travel with the pickled dataset
def test_spawned_workers_raise_their_flags(make_shards, context):
    manifest = make_shards([4, 3])
    ds = ShardDataset(manifest, mode="exact")
    loader = make_loader(ds, num_workers=2, multiprocessing_context=context, worker_start_timeout_s=30)
    assert sorted(s["__key__"] for s in loader) == _keys(manifest)
    assert loader._start_watch is not None and list(loader._start_watch.flags) == [1, 1]
    assert loader._start_watch.failure is None


def test_the_watch_can_be_turned_off(make_shards):
    manifest = make_shards([2, 2])
    loader = make_loader(ShardDataset(manifest, mode="exact"), num_workers=2, worker_start_timeout_s=None)
    assert sorted(s["__key__"] for s in loader) == _keys(manifest)
    assert loader._start_watch is None
