"""Keep the storage busy while DataLoader workers start.

Starting a DataLoader's worker processes takes a while: forking each one
and setting it up costs tens of milliseconds per worker, and spawned workers
take seconds to import torch. Until the first worker asks for data the
storage sits idle, and the whole pass waits that much longer.

A :class:`WarmUp` reads, in the main process, the first bytes the first
worker will read, while the workers start. The bytes go nowhere but the
operating system's page cache (``sendfile`` to ``/dev/null``: no copy into
this process): the worker then finds them in memory, and the device has been
working all along. It stops when told to (the loader does so once its
workers are up), after one turn's worth of bytes, or at the end of what the
worker would read, whichever comes first, so it never reads anything the
worker will not.

On a disk whose readers take turns (:mod:`.device`) the warm-up takes its
turn like any reader, so it never makes the head seek between it and
another process's stream. Its turn must then pass to the first worker and
to no one else: had another worker the next turn, the first worker would
later hold the disk idle while it reads its cached bytes. With forked
workers the turn passes on directly (:meth:`WarmUp.offer_turn`); spawned
workers race for it like any reader.

The main thread forks the workers right after starting the warm-up, and a
fork holds the GIL for many milliseconds. So the calling thread finds the
range and takes a free turn, then waits until the first read is under way,
and each read is a large request that needs the GIL once.

Local files only: the page cache is what hands the bytes over.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from shardkit.read.device import DeviceLock
from shardkit.read.split import Piece

if TYPE_CHECKING:
    from shardkit.read.stream import FirstRead, PieceReader

log = logging.getLogger(__name__)

#: Bytes per read request. A stop request waits for at most one of these
#: (about 50 ms on a 170 MB/s disk), and the thread needs the GIL once per
#: request.
WARM_UP_CHUNK_BYTES = 8 << 20
#: Longest wait in :meth:`WarmUp.start` for the first read to be under way.
START_WAIT_S = 0.1


class WarmUp:
    """Reads the start of a piece into the page cache, in the background.

    Use it as a context manager, or call :meth:`start` and then always
    :meth:`stop`: a warm-up holding a device lock gives it up only then.

    Args:
        reader: The reader whose first read of ``piece`` is warmed up (it
            says which bytes that read covers, and under which device lock).
        piece: The piece the first worker reads first.
        chunk_bytes: Size of each read request.

    Failures (a missing shard, an unusable index) end the warm-up quietly:
    the worker meets the same fault and reports it properly.

    Attributes:
        num_bytes: Bytes read so far.
    """

    def __init__(self, reader: PieceReader, piece: Piece, *, chunk_bytes: int = WARM_UP_CHUNK_BYTES):
        self.reader = reader
        self.piece = piece
        self.chunk_bytes = chunk_bytes
        self.num_bytes = 0
        self._stop = threading.Event()
        self._reading = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()  # guards the hold's hand-over
        self._lock: DeviceLock | None = None  # the device lock, while this warm-up holds it
        self._offered = False
        self._leave = False

    def start(self) -> WarmUp:
        """Find the bytes, take the device's turn if it is free, and read on
        in the background; returns once the first read is under way (a turn
        held by another process is waited for in the background)."""
        try:
            first = self.reader.first_read(self.piece)
        except Exception as exc:  # the worker reads the same bytes and reports it
            log.debug("no warm-up of %s: %s", self.piece, exc)
            return self
        if first is None:
            return self
        if first.lock is not None and first.lock.try_acquire():
            self._lock = first.lock
        self._thread = threading.Thread(target=self._run, args=(first,), name="shardkit-warm-up", daemon=True)
        self._thread.start()
        if first.lock is None or self._lock is not None:
            self._reading.wait(START_WAIT_S)
        return self

    def offer_turn(self) -> bool:
        """If the warm-up holds its device's lock, leave it to the next
        process this one forks (the first worker) rather than give it back
        (see :meth:`DeviceLock.offer_to_next_child`); True if offered. Call
        before forking the workers, then :meth:`stop` with ``leave=True``
        once the first worker has been forked."""
        with self._mutex:
            if self._lock is None:
                return False
            self._lock.offer_to_next_child()
            self._offered = True
            return True

    def stop(self, *, leave: bool = False) -> None:
        """Stop after the current request (or without reading, while still
        waiting for a turn on the device). Does not wait: see :meth:`join`.

        Args:
            leave: The turn was offered (:meth:`offer_turn`) and the first
                worker has been forked: leave the lock to it. Otherwise a
                held lock is given back.
        """
        with self._mutex:
            self._leave = leave and self._offered
            if self._offered and self._lock is not None:
                self._lock.withdraw_offer()  # taken up by the first fork, or never
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the background thread to end; True if it has."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def _run(self, first: FirstRead) -> None:
        """Read ``first``'s bytes, under its lock if it has one: taken
        already by :meth:`start`, or waited for here."""
        try:
            if first.lock is not None and self._lock is None:
                if not first.lock.acquire(cancel=self._stop):
                    return  # stopped (or out of patience) before its turn came
                with self._mutex:
                    self._lock = first.lock
            fd = os.open(first.path, os.O_RDONLY)
            try:
                self._read(fd, first.start, first.stop)
            finally:
                os.close(fd)
        except Exception as exc:  # the worker reads the same bytes and reports it
            log.debug("warm-up of %s stopped: %s", self.piece, exc)
        finally:
            self._reading.set()
            self._let_go()

    def _let_go(self) -> None:
        """Give back a held lock, or leave it to the worker it was offered
        to; an offered lock is held until :meth:`stop` says which."""
        with self._mutex:
            offered = self._offered
        if offered:
            self._stop.wait()
        with self._mutex:
            lock, self._lock = self._lock, None
            if lock is None:
                return
            if self._leave:
                lock.leave()
            else:
                lock.release()

    def _read(self, fd: int, start: int, stop: int) -> None:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, start, stop - start, os.POSIX_FADV_SEQUENTIAL)
        pos = start
        with _Sink() as sink:
            self._reading.set()
            while pos < stop and not self._stop.is_set():
                got = sink.take(fd, pos, min(self.chunk_bytes, stop - pos))
                if not got:
                    return  # the file ends early; the worker says so
                pos += got
                self.num_bytes += got

    def __enter__(self) -> WarmUp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    def __repr__(self) -> str:
        return f"WarmUp({self.piece}, {self.num_bytes} bytes read)"


class _Sink:
    """Reads file bytes into the page cache and drops them: ``sendfile`` to
    ``/dev/null`` where the system has it (the bytes never enter this
    process), else ordinary reads into one reused buffer."""

    def __init__(self) -> None:
        self._null = os.open(os.devnull, os.O_WRONLY)
        self._buffer: memoryview | None = None

    def take(self, fd: int, offset: int, count: int) -> int:
        """Read ``count`` bytes of ``fd`` at ``offset``; returns how many there were."""
        if self._buffer is None:
            try:
                return os.sendfile(self._null, fd, offset, count)
            except (AttributeError, OSError):  # no sendfile, or not for this file pair
                self._buffer = memoryview(bytearray(count))
        return os.preadv(fd, [self._buffer[:count]], offset)

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._null)
