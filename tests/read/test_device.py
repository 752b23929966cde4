"""The device lock: readers of one disk take turns, one lease at a time."""

from __future__ import annotations

import fcntl
import multiprocessing
import multiprocessing.synchronize
import os
import threading
import time

import pytest
import torch

from shardkit import ShardDataset
from shardkit.errors import UsageError
from shardkit.io import device
from shardkit.io.device import DeviceLock, is_rotational, lock_for, take_offered_locks
from shardkit.io.base import SourceOptions
from tests.conftest import sample_payload
from tests.read.locks import held_elsewhere


def test_leases_pull_chunks_under_the_lock_and_release_between_leases(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=10, directory=str(tmp_path))
    pulled_while_held = []

    def chunks():
        for i in range(7):
            pulled_while_held.append(held_elsewhere(lock))
            yield bytes([i]) * 4

    seen = []
    for chunk in lock.leased(chunks()):
        assert not held_elsewhere(lock), "the lock is kept while the lease's bytes are handed on"
        seen.append(chunk)
    assert seen == [bytes([i]) * 4 for i in range(7)]
    assert all(pulled_while_held)
    assert not held_elsewhere(lock)


def test_streamed_leases_pass_chunks_on_under_the_lock_after_making_room(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=10, directory=str(tmp_path))
    events = []

    def before_lease():
        events.append(("room", held_elsewhere(lock)))
        return True

    seen = []
    for chunk in lock.leased((bytes([i]) * 4 for i in range(7)), before_lease=before_lease):
        events.append(("chunk", held_elsewhere(lock)))
        seen.append(chunk)
    assert seen == [bytes([i]) * 4 for i in range(7)]
    # 28 bytes in leases of >= 10: three chunks, three chunks, one chunk; the
    # lock is free while waiting for room and held while chunks are handed on.
    assert events == [("room", False)] + [("chunk", True)] * 3 + [("room", False)] + [("chunk", True)] * 3 + [
        ("room", False),
        ("chunk", True),
    ]
    assert not held_elsewhere(lock)


def _hold_log(lock: DeviceLock, chunks, **kwargs) -> list[str]:
    """``"room"`` where a lease waits for room (lock free), ``"chunk"`` per
    chunk handed on (lock held)."""
    events = []

    def before_lease():
        assert not held_elsewhere(lock)
        events.append("room")
        return True

    for _chunk in lock.leased(chunks, before_lease=before_lease, **kwargs):
        assert held_elsewhere(lock)
        events.append("chunk")
    assert not held_elsewhere(lock)
    return events


def test_a_lease_reads_a_short_tail_of_its_range_in_the_same_hold_when_there_is_room(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=10, directory=str(tmp_path))
    # 20 bytes in chunks of 4: a lease of 12 leaves 8, at most one more
    # lease, so it reads them too; 32 bytes: the first lease leaves 20, so it
    # hands over, and the second takes its tail of 8 with it.
    asked = []

    def room_now():
        asked.append(True)
        return True

    five = [b"abcd"] * 5
    assert _hold_log(lock, iter(five), total_bytes=20, room_now=room_now) == ["room"] + ["chunk"] * 5
    assert len(asked) == 1
    # Without room, or with the length unknown, the tail waits for a lease of its own.
    split = ["room"] + ["chunk"] * 3 + ["room"] + ["chunk"] * 2
    assert _hold_log(lock, iter(five), total_bytes=20, room_now=lambda: False) == split
    assert _hold_log(lock, iter(five), room_now=room_now) == split
    assert len(asked) == 1
    eight = [b"abcd"] * 8
    assert _hold_log(lock, iter(eight), total_bytes=32, room_now=room_now) == ["room"] + ["chunk"] * 3 + [
        "room"
    ] + ["chunk"] * 5
    assert len(asked) == 2


def test_a_streamed_lease_stops_when_there_is_no_room_and_a_dropped_one_releases_the_lock(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=4, directory=str(tmp_path))
    answers = iter([True, False])
    assert list(lock.leased(iter([b"ab", b"cd", b"ef"]), before_lease=lambda: next(answers))) == [b"ab", b"cd"]
    assert not held_elsewhere(lock)
    stream = lock.leased(iter([b"ab", b"cd"]), before_lease=lambda: True)
    assert next(stream) == b"ab" and held_elsewhere(lock)
    stream.close()  # the consumer stops mid-lease
    assert not held_elsewhere(lock)


def test_a_failing_read_releases_the_lock(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=1 << 20, directory=str(tmp_path))

    def chunks():
        yield b"x"
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(lock.leased(chunks()))
    assert not held_elsewhere(lock)


def _hold(path: str, dev: int, log: str, rounds: int) -> None:
    lock = DeviceLock(dev, directory=path)
    for _ in range(rounds):
        assert lock.acquire()
        start = time.monotonic()
        time.sleep(0.01)
        end = time.monotonic()
        lock.release()
        with open(log, "a") as f:
            f.write(f"{start} {end}\n")


def test_processes_never_hold_the_lock_at_once(tmp_path):
    log = str(tmp_path / "held.txt")
    dev = os.stat(tmp_path).st_dev
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), dev, log, 5)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    spans = sorted(tuple(map(float, line.split())) for line in open(log))
    assert len(spans) == 15
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, "two processes held the device lock at the same time"


def test_a_holder_that_never_lets_go_slows_reads_but_never_hangs_them(tmp_path, caplog):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=4, directory=str(tmp_path), patience_s=0.2)
    squatter = os.open(lock.path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(squatter, fcntl.LOCK_EX)  # e.g. a stopped job on the same disk
    try:
        start = time.monotonic()
        with caplog.at_level("WARNING", logger="shardkit.io.device"):
            assert list(lock.leased(iter([b"ab", b"cd", b"ef"]))) == [b"ab", b"cd", b"ef"]
        assert time.monotonic() - start < 5
        assert "reading without it" in caplog.text and lock.path in caplog.text
    finally:
        os.close(squatter)
    assert lock.acquire(), "once the holder is gone the lock is taken again"
    lock.release()


def _read_in_child(lock: DeviceLock, out: str) -> None:
    with open(out, "wb") as f:
        f.write(b"".join(lock.leased(iter([b"x", b"y"]))))


def test_a_worker_forked_while_a_parent_thread_holds_the_lock_still_reads(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=1, directory=str(tmp_path), patience_s=0.5)
    assert lock.acquire()  # the parent's reader thread is mid-lease at fork time
    try:
        child = multiprocessing.get_context("fork").Process(target=_read_in_child, args=(lock, str(tmp_path / "out")))
        child.start()
        child.join(timeout=20)
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0, "the forked reader hung or failed"
    finally:
        lock.release()
    assert (tmp_path / "out").read_bytes() == b"xy"


def test_try_acquire_takes_a_free_lock_and_never_waits_for_a_held_one(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, directory=str(tmp_path))
    assert lock.try_acquire() and held_elsewhere(lock)
    lock.release()
    squatter = os.open(lock.path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(squatter, fcntl.LOCK_EX)
    try:
        assert not lock.try_acquire()
    finally:
        os.close(squatter)
    assert lock.try_acquire()
    lock.release()
    assert not held_elsewhere(lock)


def test_a_cancelled_wait_returns_at_once_and_lets_the_lock_go_when_it_comes(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, directory=str(tmp_path))
    squatter = os.open(lock.path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(squatter, fcntl.LOCK_EX)
    cancel = threading.Event()
    result = []
    waiter = threading.Thread(target=lambda: result.append(lock.acquire(cancel=cancel)))
    waiter.start()
    time.sleep(0.1)
    assert waiter.is_alive(), "acquire() returned while the lock was held elsewhere"
    cancel.set()
    waiter.join(timeout=5)
    assert result == [False]
    os.close(squatter)  # the holder goes; the abandoned wait gets the lock and must let it go
    deadline = time.monotonic() + 5
    while held_elsewhere(lock):
        assert time.monotonic() < deadline, "an abandoned wait kept the lock"
        time.sleep(0.01)
    assert lock.acquire()
    lock.release()


def test_a_holder_that_never_lets_go_costs_one_waiting_thread_not_one_per_wait(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, directory=str(tmp_path), patience_s=0.1)
    squatter = os.open(lock.path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(squatter, fcntl.LOCK_EX)

    def waiting() -> int:
        return sum(t.name == "shardkit-device-wait" for t in threading.enumerate())

    try:
        before = waiting()
        for _ in range(5):
            assert not lock.acquire()  # patience runs out each time
        assert waiting() == before + 1
    finally:
        os.close(squatter)
    assert lock.acquire(), "the reclaimed wait takes the lock once the holder is gone"
    lock.release()
    assert not held_elsewhere(lock)


def _take_over(lock: DeviceLock, heir: bool, out: str, go: multiprocessing.synchronize.Event) -> None:
    take_offered_locks(heir=heir)
    if heir:
        assert lock.try_acquire(), "the heir does not hold the lock it was left"
        with open(out, "w") as f:
            f.write("holding\n")
        go.wait(timeout=20)
        lock.release()
    else:
        assert lock.acquire()  # waits for the heir
        with open(out, "w") as f:
            f.write(f"got it after the heir: {go.is_set()}\n")
        lock.release()


def test_a_lock_offered_to_a_forked_worker_passes_to_it_and_to_no_other(tmp_path):
    ctx = multiprocessing.get_context("fork")
    lock = DeviceLock(os.stat(tmp_path).st_dev, directory=str(tmp_path), patience_s=30)
    device._locks[-1] = lock  # where take_offered_locks finds it (as lock_for would put it)
    go = ctx.Event()
    try:
        assert lock.try_acquire()
        lock.offer_to_next_child()
        heir = ctx.Process(target=_take_over, args=(lock, True, str(tmp_path / "heir"), go))
        other = ctx.Process(target=_take_over, args=(lock, False, str(tmp_path / "other"), go))
        heir.start()
        other.start()
        lock.withdraw_offer()
        lock.leave()  # this process is done with it; the heir's copy keeps it held
        deadline = time.monotonic() + 20
        while not (tmp_path / "heir").exists():
            assert time.monotonic() < deadline and heir.is_alive(), "the heir never held the lock"
            time.sleep(0.01)
        time.sleep(0.2)
        assert held_elsewhere(lock) and not (tmp_path / "other").exists(), "another worker took the heir's turn"
        go.set()
        for proc in (heir, other):
            proc.join(timeout=20)
            assert proc.exitcode == 0
        assert (tmp_path / "other").read_text() == "got it after the heir: True\n"
        assert not held_elsewhere(lock)
    finally:
        del device._locks[-1]


def test_lock_for_follows_the_mode(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert lock_for(str(path), mode=False) is None
    forced = lock_for(str(path), mode=True, lease_bytes=1 << 20)
    assert forced is not None and forced.lease_bytes == 1 << 20
    assert lock_for(str(path), mode=True, lease_bytes=1 << 20) is forced
    auto = lock_for(str(path), mode="auto")
    assert (auto is not None) == bool(is_rotational(os.stat(path).st_dev))
    assert lock_for(str(tmp_path / "missing"), mode=True) is None  # opening it reports the error


def test_no_block_device_is_not_taken_for_a_disk():
    assert is_rotational(os.stat("/proc").st_dev) is None


def test_bad_device_lock_options_are_refused():
    with pytest.raises(UsageError, match="device_lock"):
        SourceOptions(device_lock="yes")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="device_lease_bytes"):
        SourceOptions(device_lease_bytes=0)


def test_workers_taking_turns_read_every_sample_once_with_the_written_bytes(make_shards):
    manifest = make_shards([40, 25, 33, 0, 17], payload_bytes=3000)
    options = SourceOptions(device_lock=True, device_lease_bytes=20_000, chunk_bytes=8192)
    ds = ShardDataset(manifest, mode="exact", seed=3, source_options=options)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    keys = []
    for sample in loader:
        assert sample["bin"] == sample_payload(sample["__key__"], 3000)
        keys.append(sample["__key__"])
    assert sorted(keys) == sorted(f"s{i:03d}_{j:05d}" for i, n in enumerate([40, 25, 33, 0, 17]) for j in range(n))
    plain = ShardDataset(manifest, mode="exact", seed=3, source_options=SourceOptions(device_lock=False))
    assert keys == [s["__key__"] for s in torch.utils.data.DataLoader(plain, batch_size=None, num_workers=2)]


def test_a_reader_takes_the_lock_once_per_shard_when_a_shard_is_under_two_leases(make_shards, monkeypatch):
    sizes = [17, 17, 9]
    manifest = make_shards(sizes, payload_bytes=3000)
    largest = max(shard.num_bytes for shard in manifest.shards)
    # Each 17-sample shard is one lease and a tail shorter than a lease.
    options = SourceOptions(device_lock=True, device_lease_bytes=largest * 6 // 10, chunk_bytes=4096)
    holds = []
    acquire = DeviceLock.acquire

    def counting_acquire(self):
        holds.append(self.lease_bytes)
        return acquire(self)

    monkeypatch.setattr(DeviceLock, "acquire", counting_acquire)
    ds = ShardDataset(manifest, mode="exact", seed=1, source_options=options)
    samples = list(ds)
    assert sorted(s["__key__"] for s in samples) == sorted(
        f"s{i:03d}_{j:05d}" for i, n in enumerate(sizes) for j in range(n)
    )
    assert all(s["bin"] == sample_payload(s["__key__"], 3000) for s in samples)
    assert len(holds) == len(sizes), "a shard's short tail was read in a hold of its own"
