"""The device lock: readers of one disk take turns, one lease at a time."""

from __future__ import annotations

import fcntl
import multiprocessing
import multiprocessing.synchronize
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import pytest
import torch

from shardkit import ShardDataset
from shardkit.errors import UsageError
from shardkit.io.base import SourceOptions
from shardkit.io.device import (
    DeviceLock,
    DeviceLockedSource,
    Room,
    is_rotational,
    lock_for,
    reserved_room_bytes,
    take_turns,
)
from shardkit.io.local import LocalFile
from shardkit.read.prefetch import ReadAhead
from tests.conftest import sample_payload
from tests.read.locks import held_elsewhere


class _Chunks:
    """A byte source whose every range read yields ``chunks``, each read
    (pulled from the iterable) only when the reader asks for it."""

    url = "chunks"

    def __init__(self, chunks: Iterable[bytes]):
        self.chunks = chunks
        self.ranges: list[tuple[int, int | None]] = []

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        self.ranges.append((start, end))
        yield from self.chunks

    def read_all(self, *, max_bytes: int | None = None) -> bytes:
        return b"".join(self.chunks)


class _Room:
    """A room that answers from callables and records what it was asked."""

    def __init__(self, wait: Callable[[], bool] = lambda: True, now: Callable[[], bool] = lambda: True):
        self._wait = wait
        self._now = now
        self.waits: list[int] = []
        self.asks: list[int] = []

    def wait_room(self, num_bytes: int) -> bool:
        self.waits.append(num_bytes)
        return self._wait()

    def has_room(self, num_bytes: int) -> bool:
        self.asks.append(num_bytes)
        return self._now()


def _read(lock: DeviceLock, chunks: Iterable[bytes], *, end: int | None = None, room: Room | None = None):
    """The wrapper's range read of ``chunks`` (4-byte chunks), ``end`` bytes long if given."""
    return DeviceLockedSource(_Chunks(chunks), lock, room=room).iter_range(0, end, chunk_bytes=4)


def test_leases_pull_chunks_under_the_lock_and_release_between_leases(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=10, directory=str(tmp_path))
    pulled_while_held = []

    def chunks():
        for i in range(7):
            pulled_while_held.append(held_elsewhere(lock))
            yield bytes([i]) * 4

    seen = []
    for chunk in _read(lock, chunks()):
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

    room = _Room(wait=before_lease)
    seen = []
    for chunk in _read(lock, (bytes([i]) * 4 for i in range(7)), room=room):
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
    # Each lease asks for room for itself and one chunk past it.
    assert room.waits == [10 + 4] * 3


def _hold_log(lock: DeviceLock, chunks, *, end: int | None = None, room: _Room) -> list[str]:
    """``"room"`` where a lease waits for room (lock free), ``"chunk"`` per
    chunk handed on (lock held)."""
    events = []

    def before_lease():
        assert not held_elsewhere(lock)
        events.append("room")
        return True

    room._wait = before_lease
    for _chunk in _read(lock, chunks, end=end, room=room):
        assert held_elsewhere(lock)
        events.append("chunk")
    assert not held_elsewhere(lock)
    return events


def test_a_lease_reads_a_short_tail_of_its_range_in_the_same_hold_when_there_is_room(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=10, directory=str(tmp_path))
    # 20 bytes in chunks of 4: a lease of 12 leaves 8, at most one more
    # lease, so it reads them too; 32 bytes: the first lease leaves 20, so it
    # hands over, and the second takes its tail of 8 with it.
    room = _Room()
    five = [b"abcd"] * 5
    assert _hold_log(lock, iter(five), end=20, room=room) == ["room"] + ["chunk"] * 5
    assert len(room.asks) == 1
    # Without room, or with the length unknown, the tail waits for a lease of its own.
    split = ["room"] + ["chunk"] * 3 + ["room"] + ["chunk"] * 2
    assert _hold_log(lock, iter(five), end=20, room=_Room(now=lambda: False)) == split
    assert _hold_log(lock, iter(five), room=room) == split
    assert len(room.asks) == 1
    eight = [b"abcd"] * 8
    assert _hold_log(lock, iter(eight), end=32, room=room) == ["room"] + ["chunk"] * 3 + ["room"] + ["chunk"] * 5
    assert len(room.asks) == 2
    assert room.asks == [10 + 4] * 2  # room for another lease and a chunk


def test_a_streamed_lease_stops_when_there_is_no_room_and_a_dropped_one_releases_the_lock(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=4, directory=str(tmp_path))
    answers = iter([True, False])
    room = _Room(wait=lambda: next(answers))
    assert list(_read(lock, iter([b"ab", b"cd", b"ef"]), room=room)) == [b"ab", b"cd"]
    assert not held_elsewhere(lock)
    stream = _read(lock, iter([b"ab", b"cd"]), room=_Room())
    assert next(stream) == b"ab" and held_elsewhere(lock)
    stream.close()  # the consumer stops mid-lease
    assert not held_elsewhere(lock)


def test_a_failing_read_releases_the_lock(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=1 << 20, directory=str(tmp_path))

    def chunks():
        yield b"x"
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(_read(lock, chunks()))
    assert not held_elsewhere(lock)


def test_the_wrapper_reads_the_range_it_is_asked_for_and_read_all_takes_one_turn(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=4, directory=str(tmp_path))
    inner = _Chunks([b"ab", b"cd"])
    source = DeviceLockedSource(inner, lock)
    assert source.url == "chunks"
    assert list(source.iter_range(5, 9, chunk_bytes=2)) == [b"ab", b"cd"]
    assert inner.ranges == [(5, 9)]
    pulled_while_held = []

    def chunks():
        pulled_while_held.append(held_elsewhere(lock))
        yield b"whole"

    assert DeviceLockedSource(_Chunks(chunks()), lock).read_all() == b"whole"
    assert pulled_while_held == [True] and not held_elsewhere(lock)
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    random_reads = DeviceLockedSource(LocalFile(str(path)), lock)
    assert random_reads.read_at(3, 4) == b"3456" and not held_elsewhere(lock)  # random reads take no turn
    random_reads.close()


def test_take_turns_wraps_a_source_only_where_its_device_takes_turns(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    source = LocalFile(str(path))
    assert take_turns(source, str(path), options=SourceOptions(device_lock=False)) is source
    assert reserved_room_bytes(str(path), options=SourceOptions(device_lock=False)) == 0
    options = SourceOptions(device_lock=True, device_lease_bytes=1000, chunk_bytes=10)
    room = _Room()
    wrapped = take_turns(source, str(path), options=options, room=room)
    assert isinstance(wrapped, DeviceLockedSource) and wrapped.room is room and wrapped.lock.lease_bytes == 1000
    assert reserved_room_bytes(str(path), options=options) == wrapped.room_bytes(10) == 1010
    assert isinstance(ReadAhead([], lambda job: []), Room), "the read-ahead queue is what a reader passes as room"


class _LoggedFile(LocalFile):
    """A local file that appends ``NAME OFFSET`` to a log as each chunk is
    read (while its reader holds the lock, so the log orders the reads)."""

    def __init__(self, path: str, name: str, log: str, first_read: multiprocessing.synchronize.Event):
        super().__init__(path)
        self.name = name
        self.log = log
        self.first_read = first_read

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        pos = start
        for chunk in super().iter_range(start, end, chunk_bytes=chunk_bytes):
            with open(self.log, "a") as f:
                f.write(f"{self.name} {pos}\n")
            self.first_read.set()
            pos += len(chunk)
            yield chunk


def _read_logged(
    lock: DeviceLock,
    path: str,
    name: str,
    log: str,
    first_read: multiprocessing.synchronize.Event,
    other_read: multiprocessing.synchronize.Event,
    chunk_bytes: int,
) -> None:
    """Read ``path`` through the wrapper. Process ``"a"`` starts at once
    and, between its first and second lease, lets ``"b"`` get its turn
    before it asks again (a room that is full until the other has read);
    ``"b"`` starts once ``"a"`` holds the lock."""
    leases = 0

    def room() -> bool:
        nonlocal leases
        leases += 1
        if name == "a" and leases == 2:
            assert other_read.wait(20)
        return True

    if name == "b":
        assert other_read.wait(20)
    source = DeviceLockedSource(_LoggedFile(path, name, log, first_read), lock, room=_Room(wait=room))
    data = b"".join(source.iter_range(0, os.path.getsize(path), chunk_bytes=chunk_bytes))
    with open(path, "rb") as f:
        assert data == f.read()


def test_processes_reading_one_file_take_turns_a_whole_lease_at_a_time(tmp_path):
    chunk = 4096
    path = tmp_path / "shard.tar"
    path.write_bytes(os.urandom(12 * chunk))
    log = str(tmp_path / "reads.txt")
    # Leases of three chunks: 12 chunks are read as 3, 3 and 6 (the last
    # lease leaves one more lease of its range, read in the same hold).
    lock = DeviceLock(os.stat(tmp_path).st_dev, lease_bytes=3 * chunk, directory=str(tmp_path), patience_s=30)
    ctx = multiprocessing.get_context("fork")
    a_read, b_read = ctx.Event(), ctx.Event()
    # b starts once a holds the lock (a has logged a chunk), so b waits in
    # flock; a's second lease waits until b has read.
    first = ctx.Process(target=_read_logged, args=(lock, str(path), "a", log, a_read, b_read, chunk))
    second = ctx.Process(target=_read_logged, args=(lock, str(path), "b", log, b_read, a_read, chunk))
    for proc in (first, second):
        proc.start()
    for proc in (first, second):
        proc.join(timeout=30)
        assert proc.exitcode == 0
    reads = [line.split() for line in open(log)]
    for name in ("a", "b"):
        assert [int(pos) for who, pos in reads if who == name] == [i * chunk for i in range(12)]
    names = [who for who, _ in reads]
    assert names[:3] == ["a"] * 3, "b read during a's first lease"
    assert names[3] == "b", "the waiting process did not get the disk when the first lease ended"
    done = {"a": 0, "b": 0}
    for who, after in zip(names, names[1:] + [None]):
        done[who] += 1
        if after != who:
            assert done[who] in (3, 6, 12), f"{who} let go of the disk after {done[who]} chunks, inside a lease"
    assert done == {"a": 12, "b": 12}


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
        with caplog.at_level("WARNING", logger="shardkit.io.device"):
            source = DeviceLockedSource(_Chunks(iter([b"ab", b"cd", b"ef"])), lock)
            assert list(source.iter_range(0, 6, chunk_bytes=2)) == [b"ab", b"cd", b"ef"]
        assert "reading without it" in caplog.text and lock.path in caplog.text
        # Each of the two leases waited out its patience once, then read.
        assert caplog.text.count("reading without it") == 2
    finally:
        os.close(squatter)
    assert lock.acquire(), "once the holder is gone the lock is taken again"
    lock.release()


def _read_in_child(lock: DeviceLock, out: str) -> None:
    with open(out, "wb") as f:
        f.write(b"".join(_read(lock, iter([b"x", b"y"]))))


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


def test_a_cancelled_wait_returns_at_once_and_lets_the_lock_go_when_it_comes(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, directory=str(tmp_path))
    squatter = os.open(lock.path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(squatter, fcntl.LOCK_EX)
    cancel = threading.Event()
    result = []
    waits_before = _waiting_threads()
    waiter = threading.Thread(target=lambda: result.append(lock.acquire(cancel=cancel)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not _waiting_threads() - waits_before:  # until acquire() is blocked in flock
        assert time.monotonic() < deadline, "acquire() never started to wait"
        time.sleep(0.01)
    assert result == [], "acquire() returned while the lock was held elsewhere"
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


def _waiting_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "shardkit-device-wait"}


def test_a_holder_that_never_lets_go_costs_one_waiting_thread_not_one_per_wait(tmp_path):
    lock = DeviceLock(os.stat(tmp_path).st_dev, directory=str(tmp_path), patience_s=0.1)
    squatter = os.open(lock.path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(squatter, fcntl.LOCK_EX)

    try:
        before = _waiting_threads()  # earlier tests' waiters may still be ending: count only new ones
        for _ in range(5):
            assert not lock.acquire()  # patience runs out each time
        assert len(_waiting_threads() - before) == 1
    finally:
        os.close(squatter)
    assert lock.acquire(), "the reclaimed wait takes the lock once the holder is gone"
    lock.release()
    assert not held_elsewhere(lock)


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
