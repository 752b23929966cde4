"""One reader at a time per spinning disk.

A hard disk reads one stream at full speed, but several streams at once make
its head seek between them: with DataLoader workers each reading its own
shard, the disk spends more and more of its time seeking as workers are added.
Readers take turns instead, in two parts:

* :class:`DeviceLock` is the turn itself: an exclusive ``flock`` on a small
  lock file named after the device, so every process on the machine that
  reads that disk through shardkit (all DataLoader workers of all ranks on
  the node) shares it.
* :class:`DeviceLockedSource` wraps any :class:`~shardkit.io.base.ByteSource`
  and reads its ranges in *leases*: it takes the lock, reads until
  ``lease_bytes`` (64 MiB by default) have arrived and lets go. Each lease
  costs at most one seek, so the disk stays busy with sequential transfers.
  Whoever reads the wrapped source sees plain chunks; nothing above the
  storage floor knows about leases.

A turn must not stall half-way, or the disk would idle while its holder waits
for its consumer. So the wrapper takes a :class:`Room`: whatever its chunks go
to (a bounded queue, such as the reader's read-ahead) answers "can you take
``n`` more bytes without blocking?", waiting (:meth:`Room.wait_room`) or not
(:meth:`Room.has_room`). Before each lease the wrapper waits, with the lock
free, until there is room for a whole lease (plus one chunk, as the last chunk
may run past the lease); the chunks then pass on as they arrive, so the
consumer parses a lease while it is being read rather than after it. The
queue only counts bytes: it does not know why room is asked for. A lease that
leaves at most one more lease of its range reads that too, in the same hold,
when the room says it can take another lease now: a shard is then not split
into a lease and a short tail with another reader's turn (two seeks) in
between, and a hold lasts at most two leases. Without a room each lease is
read into memory and passed on once the lock is free again. A consumer that
asks for room before each lease holds up to a lease and a chunk more than it
otherwise would; :func:`reserved_room_bytes` tells it how much, so it can
size its queue.

Whether a device spins is read from sysfs (``queue/rotational`` of the block
device holding the file). Paravirtual disks (virtio, Xen), which report a
default rather than what the host stores them on, and file systems without a
block device (FUSE, NFS, tmpfs) are not taken for disks: pass
``SourceOptions(device_lock=True)`` when you know they sit on one. Taking
turns costs throughput on devices that serve many streams at once (SSDs,
cloud volumes): about a quarter at 8 workers on this project's virtio disk.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Generator, Iterator
from typing import Protocol, runtime_checkable

from shardkit.io.base import DEFAULT_LEASE_BYTES, ByteSource, DeviceLockMode, SourceOptions, close_iterator

log = logging.getLogger(__name__)


#: How long a reader waits for a device lock before reading without it.
PATIENCE_S = 60.0
#: How often a blocked waiter looks at its patience and its cancel event.
WAIT_SLICE_S = 0.05


def lock_dir() -> str:
    """Where device lock files live: shared memory if there is any (nothing
    touches a disk to take a lock), else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


#: Paravirtual disks report ``rotational`` as a default, not a fact: a
#: virtio or Xen disk says 1 whatever the host stores it on.
_PARAVIRTUAL = ("/virtio", "/vbd-", "/xen")


@functools.lru_cache(maxsize=64)
def is_rotational(dev: int) -> bool | None:
    """Whether block device ``dev`` (an ``st_dev``) is a spinning disk, or
    None when nothing reliable says (no block device behind it, no sysfs, a
    paravirtual disk)."""
    node = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if any(mark in os.path.realpath(node) for mark in _PARAVIRTUAL):
        return None
    # A partition has no queue of its own: its parent disk's answers for it.
    for queue in (os.path.join(node, "queue"), os.path.join(node, "..", "queue")):
        try:
            with open(os.path.join(queue, "rotational")) as f:
                return f.read().strip() == "1"
        except OSError:
            continue
    return None


class DeviceLock:
    """An exclusive lock shared by all processes reading one device.

    Args:
        dev: The device (``st_dev`` of a file on it).
        lease_bytes: Bytes read per hold by a :class:`DeviceLockedSource`.
        directory: Where the lock file lives (default :func:`lock_dir`).
        patience_s: Longest wait for the lock; past it the reader goes ahead
            without it (logged), so a stopped or misbehaving holder, another
            user's job included, slows reads down but never hangs them.

    The lock file is opened on first use in each process, so an instance
    made before DataLoader workers fork works in each of them: a forked
    process starts from its own descriptor and its own thread lock, whatever
    the parent held at fork time. A reader that finds the lock taken blocks
    in ``flock`` (in a helper thread, since ``flock`` has no timeout): the
    kernel wakes blocked waiters as soon as the holder lets go, so the disk
    passes from one reader to the next without a gap, and readers get their
    turns in about the order they asked.
    """

    def __init__(
        self,
        dev: int,
        *,
        lease_bytes: int = DEFAULT_LEASE_BYTES,
        directory: str | None = None,
        patience_s: float = PATIENCE_S,
    ):
        self.dev = dev
        self.lease_bytes = lease_bytes
        self.patience_s = patience_s
        self.path = os.path.join(directory or lock_dir(), f"shardkit-device-{os.major(dev)}-{os.minor(dev)}.lock")
        self._fd: int | None = None  # this process's descriptor of the lock file
        self._held: int | None = None  # the descriptor holding the lock, while held
        self._spare: _Waiter | None = None  # an abandoned wait still blocked in flock
        self._pid = -1
        self._thread_lock = threading.Lock()  # flock does not exclude threads sharing one fd

    def _fileno(self) -> int:
        assert self._fd is not None and self._pid == os.getpid()
        return self._fd

    def _adopt(self) -> None:
        """First use in this process (e.g. a freshly forked DataLoader
        worker): open the lock file here, and start from a new thread lock,
        since one copied while a parent thread held it would never open."""
        if self._pid != os.getpid():
            self._thread_lock = threading.Lock()
            self._fd = _open_lock_file(self.path)
            self._held = None  # what a parent thread held is the parent's to give back
            self._spare = None  # its thread lives in the parent
            self._pid = os.getpid()

    def acquire(self, *, cancel: threading.Event | None = None) -> bool:
        """Take the lock; False if :attr:`patience_s` ran out first (the
        caller then reads without it), or once ``cancel`` is set (the
        caller then does not read)."""
        self._adopt()
        self._thread_lock.acquire()
        try:
            if self._try(self._fileno()) or self._wait(cancel):
                return True
        except BaseException:
            self._thread_lock.release()
            raise
        self._thread_lock.release()
        return False

    def release(self) -> None:
        """Give back a lock :meth:`acquire` took."""
        fd, self._held = self._held, None
        assert fd is not None, "release() without the lock"
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            if fd != self._fd:
                os.close(fd)  # a waiter's own descriptor
            self._thread_lock.release()

    def _try(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._held = fd
        return True

    def _wait(self, cancel: threading.Event | None) -> bool:
        """Block until the lock is ours, :attr:`patience_s` runs out or
        ``cancel`` is set; True if it is ours."""
        # A wait given up earlier and still blocked (a holder that never lets
        # go) is waited on again, so such a holder costs one thread, not one
        # per patience.
        spare, self._spare = self._spare, None
        waiter = spare if spare is not None and spare.reclaim() else _Waiter(self.path)
        deadline = time.monotonic() + self.patience_s
        while not waiter.got.wait(WAIT_SLICE_S):
            cancelled = cancel is not None and cancel.is_set()
            if (cancelled or time.monotonic() >= deadline) and waiter.abandon():
                self._spare = waiter
                if not cancelled:
                    log.warning(
                        "waited %.0f s for the device lock %s; reading without it (another process holds it: "
                        "a stopped job? pass SourceOptions(device_lock=False) to stop taking turns)",
                        self.patience_s,
                        self.path,
                    )
                return False
        if waiter.error is not None:
            raise waiter.error
        self._held = waiter.fd
        return True


class _Waiter:
    """One blocked wait for a lock, on a descriptor of its own (a separate
    owner to ``flock``), in a daemon thread, since ``flock`` cannot time out.

    If the waiting side gives up (:meth:`abandon`), the thread lets the lock
    go the moment it gets it. The descriptor stays the thread's until
    ``flock`` returns: closing it under a blocked call could hand its number
    to another file.
    """

    def __init__(self, path: str):
        self.fd = _open_lock_file(path)
        self.got = threading.Event()
        self.error: OSError | None = None
        self._mutex = threading.Lock()
        self._abandoned = False
        self._ended = False  # the thread let the lock go after an abandon
        threading.Thread(target=self._run, name="shardkit-device-wait", daemon=True).start()

    def _run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:  # e.g. ENOLCK: the waiting side raises it
            self.error = exc
        with self._mutex:
            if self._abandoned:
                if self.error is None:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                self._ended = True
            else:
                if self.error is not None:
                    os.close(self.fd)
                self.got.set()

    def abandon(self) -> bool:
        """Stop waiting: True if the lock was not taken (the thread will let
        it go), False if it was taken just now (the caller holds it)."""
        with self._mutex:
            if self.got.is_set():
                return False
            self._abandoned = True
            return True

    def reclaim(self) -> bool:
        """Wait again after :meth:`abandon`; False if the thread has ended
        meanwhile (the lock came and was let go)."""
        with self._mutex:
            if self._ended or not self._abandoned:
                return False
            self._abandoned = False
            return True


def _open_lock_file(path: str) -> int:
    """Open (creating if needed) a lock file every user may lock. ``flock``
    needs only a read-only descriptor; a file another user made unreadable
    is replaced by a per-user one, which coordinates only that user's jobs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(f"{path}.{os.getuid()}", os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)  # past the umask, so other users' jobs can open it too
    except OSError:
        pass
    return fd


@runtime_checkable
class Room(Protocol):
    """Where the chunks of a :class:`DeviceLockedSource` go, asked for room
    before a turn starts. A queue bounded in bytes fits (the reader's
    read-ahead queue is one); it needs to know nothing about leases."""

    def wait_room(self, num_bytes: int) -> bool:
        """Block until ``num_bytes`` more can be taken without blocking;
        False if nothing more will be taken (the reads then stop)."""
        ...

    def has_room(self, num_bytes: int) -> bool:
        """Whether ``num_bytes`` more can be taken now, without waiting."""
        ...


class DeviceLockedSource:
    """A byte source whose range reads take turns on a disk, one lease at
    a time (see the module docstring).

    Args:
        source: What to read (a local file on the disk ``lock`` guards).
        lock: The disk's lock; ``lock.lease_bytes`` is the size of a turn.
        room: Where the chunks go. With it, each lease waits (with the lock
            free) until ``room`` can take a whole lease and one chunk, and
            chunks are then passed on as they arrive, with the lock held: so
            the caller must not block on them other than through ``room``.
            Without it, each lease is read into memory and passed on once
            the lock is free again.

    A range read dropped half-way (its generator closed) lets go of the lock
    at once. Each chunk is read when pulled, so a lease is exactly the reads
    done while it is held.
    """

    def __init__(self, source: ByteSource, lock: DeviceLock, *, room: Room | None = None):
        self.source = source
        self.lock = lock
        self.room = room
        self.url = source.url

    def room_bytes(self, chunk_bytes: int) -> int:
        """Room one lease asks for: the lease, plus one chunk of
        ``chunk_bytes``, as its last chunk may run past the lease."""
        return self.lock.lease_bytes + chunk_bytes

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        """Yield bytes ``[start, end)`` of the source, read in leases.

        Where ``end`` is known and a full lease leaves at most one more
        lease of the range, that rest is read in the same hold if ``room``
        has room for another lease now; so a hold lasts at most two leases.
        """
        chunks = self.source.iter_range(start, end, chunk_bytes=chunk_bytes)
        left = None if end is None else end - start
        room_bytes = self.room_bytes(chunk_bytes)
        try:
            while True:
                if self.room is None:
                    lease, ended = self._buffered_lease(chunks)
                    yield from lease
                else:
                    if not self.room.wait_room(room_bytes):
                        return
                    ended, got = yield from self._lease(chunks, left=left, room_bytes=room_bytes)
                    if left is not None:
                        left -= got
                if ended:
                    return
        finally:
            close_iterator(chunks)

    def read_all(self, *, max_bytes: int | None = None) -> bytes:
        """Return the whole object, read in one hold of the lock."""
        locked = self.lock.acquire()
        try:
            return self.source.read_all(max_bytes=max_bytes)
        finally:
            if locked:
                self.lock.release()

    def read_at(self, offset: int, size: int) -> bytes:
        """One random read, without taking a turn (it moves the head once, as a turn's first read does)."""
        return self.source.read_at(offset, size)

    def close(self) -> None:
        self.source.close()

    def _buffered_lease(self, chunks: Iterator[bytes]) -> tuple[list[bytes], bool]:
        """One lease read into memory: its chunks, and whether ``chunks``
        ended. The lock is released before this returns."""
        lease: list[bytes] = []
        stream = self._lease(chunks)
        while True:
            try:
                lease.append(next(stream))
            except StopIteration as done:  # the lease's finally has released the lock
                return lease, done.value[0]

    def _lease(
        self, chunks: Iterator[bytes], *, left: int | None = None, room_bytes: int = 0
    ) -> Generator[bytes, None, tuple[bool, int]]:
        """One hold of the lock, passing chunks on as they are read; returns
        whether ``chunks`` ended, and the bytes passed on. With ``left``
        (the bytes ``chunks`` has left) and a room, a full lease whose rest
        fits in one more lease reads that rest too when the room can take
        ``room_bytes`` now."""
        lease_bytes = self.lock.lease_bytes
        held = 0
        extended = False
        locked = self.lock.acquire()
        try:
            for chunk in chunks:
                held += len(chunk)
                yield chunk
                if held >= lease_bytes and not extended:
                    extended = (
                        left is not None
                        and self.room is not None
                        and left - held <= lease_bytes
                        and self.room.has_room(room_bytes)
                    )
                    if not extended:
                        return False, held
            return True, held
        finally:
            if locked:
                self.lock.release()


_locks: dict[int, DeviceLock] = {}


def lock_for(path: str, *, mode: DeviceLockMode, lease_bytes: int = DEFAULT_LEASE_BYTES) -> DeviceLock | None:
    """The device lock to read ``path`` under, or None to read freely.

    ``mode`` True always locks, False never, ``"auto"`` locks on devices
    sysfs reports as rotational. One lock per device and lease size per
    process.
    """
    if mode is False:
        return None
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None  # opening the file reports what is wrong with it
    if mode == "auto" and not is_rotational(dev):
        return None
    lock = _locks.get(dev)
    if lock is None or lock.lease_bytes != lease_bytes:
        lock = _locks[dev] = DeviceLock(dev, lease_bytes=lease_bytes)
        log.debug("reading device %d:%d one lease of %d bytes at a time", os.major(dev), os.minor(dev), lease_bytes)
    return lock


def take_turns(source: ByteSource, path: str, *, options: SourceOptions, room: Room | None = None) -> ByteSource:
    """``source`` (a local file at ``path``) as it is, or wrapped in a
    :class:`DeviceLockedSource` where ``options`` say reads of its device
    take turns (``device_lock``, ``device_lease_bytes``)."""
    lock = lock_for(path, mode=options.device_lock, lease_bytes=options.device_lease_bytes)
    return source if lock is None else DeviceLockedSource(source, lock, room=room)


def reserved_room_bytes(path: str, *, options: SourceOptions) -> int:
    """Room a :class:`DeviceLockedSource` reading ``path`` under ``options``
    asks its :class:`Room` for before each lease (a lease and a chunk), or 0
    where reads of that device do not take turns. A bounded queue sized to
    its usual budget plus this lets the next lease start while the consumer
    still works on the end of the last, instead of the disk idling."""
    lock = lock_for(path, mode=options.device_lock, lease_bytes=options.device_lease_bytes)
    return 0 if lock is None else lock.lease_bytes + options.chunk_bytes
