"""One reader at a time per spinning disk.

A hard disk reads one stream at full speed, but several streams at once make
its head seek between them: with DataLoader workers each reading its own
shard, the disk spends more and more of its time seeking as workers are added.
A :class:`DeviceLock` takes turns instead. It is an exclusive ``flock`` on a
small lock file named after the device, so every process on the machine that
reads that disk through shardkit (all DataLoader workers of all ranks on the
node) shares it. A worker holds it for one *lease*: a run of reads adding up to
``lease_bytes`` (64 MiB by default). Each lease costs at most one seek, so the
disk stays busy with sequential transfers. A worker takes the lock only once
its read-ahead queue has room for a whole lease, and passes each chunk on to
its parser as it arrives, so it never holds the disk while it waits for its
consumer, and the parser works while the lease is being read rather than
after it. A lease that leaves at most one more lease of its shard to read
reads that too when there is room for it, so a shard is not split into a
lease and a short tail with another reader's turn (two seeks) in between.

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
from collections.abc import Callable, Generator, Iterable, Iterator

from shardkit.io.base import DEFAULT_LEASE_BYTES, DeviceLockMode

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
        lease_bytes: Bytes read per hold (see :meth:`leased`).
        directory: Where the lock file lives (default :func:`lock_dir`).
        patience_s: Longest wait for the lock; past it the reader goes ahead
            without it (logged), so a stopped or misbehaving holder, another
            user's job included, slows reads down but never hangs them.

    The lock file is opened on first use in each process, so an instance
    made before DataLoader workers fork works in each of them. A reader that
    finds the lock taken blocks in ``flock`` (in a helper thread, since
    ``flock`` has no timeout): the kernel wakes blocked waiters in the order
    they came as soon as the holder lets go, so the disk passes from one
    reader to the next without a gap, and readers get their turns in about
    the order they asked.
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
        self._offered: int | None = None  # a held descriptor the next forked worker takes over
        self._inherited: int | None = None  # a held descriptor taken over from the parent
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
            if self._offered is not None:  # offered to a worker, and this process is not it
                os.close(self._offered)
                self._offered = None
            self._pid = os.getpid()

    def acquire(self, *, cancel: threading.Event | None = None) -> bool:
        """Take the lock; False if :attr:`patience_s` ran out first (the
        caller then reads without it), or once ``cancel`` is set (the
        caller then does not read)."""
        return self._acquire(wait=True, cancel=cancel)

    def try_acquire(self) -> bool:
        """Take the lock if it is free right now; False without waiting if not."""
        return self._acquire(wait=False)

    def _acquire(self, *, wait: bool, cancel: threading.Event | None = None) -> bool:
        self._adopt()
        if not self._thread_lock.acquire(blocking=wait):
            return False
        try:
            if self._take_inherited() or self._try(self._fileno()) or (wait and self._wait(cancel)):
                return True
        except BaseException:
            self._thread_lock.release()
            raise
        self._thread_lock.release()
        return False

    def release(self) -> None:
        """Give back a lock :meth:`acquire` or :meth:`try_acquire` took."""
        fd, self._held = self._held, None
        assert fd is not None, "release() without the lock"
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            if fd != self._fd:
                os.close(fd)  # a waiter's own descriptor
            self._thread_lock.release()

    def offer_to_next_child(self) -> None:
        """Leave the lock, which a thread of this process holds, to the next
        DataLoader worker this process forks, instead of giving it back.

        A forked child shares this process's open descriptors, and ``flock``
        belongs to the open file, so the child already holds the lock too.
        The worker that calls :func:`take_offered_locks` with ``heir=True``
        keeps it for its first lease; every other child lets go of its
        copy. Once the worker has been forked, :meth:`leave` ends this
        process's part; if no worker was forked, :meth:`withdraw_offer`
        and :meth:`release` as usual. Only with fork-started workers (a
        spawned process shares nothing)."""
        assert self._held is not None and self._pid == os.getpid(), "offer a lock this process holds"
        self._offered = self._held

    def withdraw_offer(self) -> None:
        """Forget an offer, so that later children do not take the lock
        over (call once the worker is forked, or if it never was)."""
        self._offered = None

    def leave(self) -> None:
        """End this process's hold on a lock its forked worker took over:
        close this descriptor without unlocking (the worker's copy keeps
        the lock held until it releases it)."""
        fd, self._held = self._held, None
        assert fd is not None, "leave() without the lock"
        self._offered = None
        try:
            os.close(fd)
            if fd == self._fd:
                self._fd = _open_lock_file(self.path)
        finally:
            self._thread_lock.release()

    def _take_inherited(self) -> bool:
        fd, self._inherited = self._inherited, None
        if fd is None:
            return False
        self._held = fd
        return True

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

    def leased(
        self,
        chunks: Iterable[bytes],
        *,
        before_lease: Callable[[], bool] | None = None,
        total_bytes: int | None = None,
        room_now: Callable[[], bool] | None = None,
    ) -> Iterator[bytes]:
        """Pull ``chunks`` (whose reads happen as they are pulled) in leases:
        each lease takes the lock, pulls chunks until ``lease_bytes`` have
        arrived, and releases it.

        A lease whose range has at most one more lease left to read keeps the
        lock and reads the rest too, when ``room_now`` says there is room for
        it: handing over for a short tail would cost one seek away and one
        back for a fraction of a lease. So a hold lasts at most two leases.

        Args:
            chunks: The reads, as an iterable pulled one chunk at a time.
            before_lease: Called with the lock free before each lease, to
                wait until whatever takes the chunks has room for a whole
                lease; chunks are then passed on as they arrive, with the
                lock held, so the caller must not block on them. Returning
                False ends the reads. Without it, each lease is read into
                memory and passed on once the lock is released.
            total_bytes: Bytes ``chunks`` yields in all, if known.
            room_now: Called without waiting, with the lock held, at the end
                of a lease whose remaining bytes fit in one more: True reads
                them in the same hold (the caller has room for a lease).
                Only with ``before_lease``.
        """
        it = iter(chunks)
        left = total_bytes
        try:
            while True:
                if before_lease is None:
                    lease, ended = self._read_lease(it)
                    yield from lease
                else:
                    if not before_lease():
                        return
                    ended, got = yield from self._stream_lease(it, left=left, room_now=room_now)
                    if left is not None:
                        left -= got
                if ended:
                    return
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def _read_lease(self, it: Iterator[bytes]) -> tuple[list[bytes], bool]:
        """One lease read into memory: its chunks, and whether ``it`` ended.
        The lock is released once the lease is complete, before returning."""
        lease: list[bytes] = []
        stream = self._stream_lease(it)
        while True:
            try:
                lease.append(next(stream))
            except StopIteration as done:  # the lease's finally has released the lock
                return lease, done.value[0]

    def _stream_lease(
        self, it: Iterator[bytes], *, left: int | None = None, room_now: Callable[[], bool] | None = None
    ) -> Generator[bytes, None, tuple[bool, int]]:
        """One lease passed on chunk by chunk; returns whether ``it`` ended,
        and the bytes passed on. With ``left`` (the bytes ``it`` has left)
        and ``room_now``, a full lease whose rest fits in one more lease
        reads that rest too when ``room_now()`` allows."""
        held = 0
        extended = False
        locked = self.acquire()
        try:
            for chunk in it:
                held += len(chunk)
                yield chunk
                if held >= self.lease_bytes and not extended:
                    extended = (
                        left is not None and room_now is not None and left - held <= self.lease_bytes and room_now()
                    )
                    if not extended:
                        return False, held
            return True, held
        finally:
            if locked:
                self.release()


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


_locks: dict[int, DeviceLock] = {}


def take_offered_locks(*, heir: bool) -> None:
    """In a freshly forked DataLoader worker: take over the locks the parent
    offered (see :meth:`DeviceLock.offer_to_next_child`) if this worker is
    their ``heir``, each for its first acquire; else let go of this
    process's copy, so only the heir holds them."""
    for lock in _locks.values():
        fd, lock._offered = lock._offered, None
        if fd is None:
            continue
        lock._adopt()
        if heir:
            lock._inherited = fd
        else:
            os.close(fd)


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
