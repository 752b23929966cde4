"""A timing model of one hard-disk head, used by the ``hdd-seek`` profile.

The blkio throttle of the ``hdd`` profile charges every request the same, so
it cannot show what makes several readers slow on a real disk: the head moving
between their streams. This model can. It is pure (time is passed in, nothing
sleeps), so the FUSE layer in :mod:`bench.profiles.seekfs` and the tests drive
the same code.

The disk:

* Files lie on a virtual platter in creation order; a read is a byte range
  ``[addr, addr + n)`` of that platter.
* One head, one request at a time, first come first served: the device is
  busy until ``free_at`` and a new request starts no earlier.
* A device read that does not start where the previous one ended pays
  ``seek_s`` (average seek plus half a rotation) before transferring at
  ``transfer_bytes_per_s``.
* Read-ahead: every stream (a run of reads that continue each other) owns a
  cache segment. Its first read fetches only what was asked; each later read
  that runs off the end of the segment doubles the stream's window, up to a
  share of ``readahead_budget_bytes`` split evenly over the streams active in
  the last ``stream_idle_s``. When a reader has started on the last window fetched,
  the next one is fetched in the background (like the kernel's
  asynchronous read-ahead), so one stream keeps the head busy on its own.
  Reads that fall inside a segment cost only the bus transfer, once the data
  is there.
* Opening a file for the first time since the cache was dropped costs
  ``open_s`` of device time for metadata and leaves the head elsewhere.

With k interleaved streams each fetch of ``B / k`` bytes pays one seek, so the
throughput is ``(B/k) / ((B/k) / rate + seek_s)``; with the defaults this
follows the published HDD decline of webdataset from 1 to 8 workers (see
``calibrate_budget``), while one stream reads at the full rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Number of cache segments the virtual disk keeps (least recently used out).
MAX_SEGMENTS = 64


@dataclass(frozen=True)
class DiskParams:
    """Parameters of the virtual disk.

    Attributes:
        seek_s: Cost of a read that does not continue the previous device
            read: average seek plus rotational latency, in seconds.
        transfer_bytes_per_s: Media transfer rate.
        bus_bytes_per_s: Rate at which cached data reaches the host.
        readahead_budget_bytes: Read-ahead bytes shared by the active streams.
        stream_idle_s: A stream not touched for this long no longer counts
            as active.
        open_s: Device time charged per file open (metadata).
    """

    seek_s: float = 0.008
    transfer_bytes_per_s: float = 170e6
    bus_bytes_per_s: float = 550e6
    readahead_budget_bytes: int = 24 << 20
    stream_idle_s: float = 0.5
    open_s: float = 0.0012

    def __post_init__(self) -> None:
        if self.seek_s < 0 or self.open_s < 0:
            raise ValueError("seek_s and open_s must be >= 0")
        if self.transfer_bytes_per_s <= 0 or self.bus_bytes_per_s <= 0:
            raise ValueError("transfer rates must be > 0")
        if self.readahead_budget_bytes < 0 or self.stream_idle_s <= 0:
            raise ValueError("readahead_budget_bytes must be >= 0 and stream_idle_s > 0")


@dataclass
class _Segment:
    """One stream's cached range of the platter."""

    start: int
    end: int
    window: int
    last_used: float
    pos: int
    #: Device reads into this segment, ascending: (first address, end
    #: address, time the first byte arrives, transfer seconds per byte).
    extents: list[tuple[int, int, float, float]] = field(default_factory=list)

    def ready_time(self, end: int) -> float:
        """When the bytes below ``end`` are in the cache: data streams in
        at the transfer rate, so a reader can use the front of a read while
        its tail is still on the platter."""
        for first, last, t0, per_byte in self.extents:
            if end <= last:
                return t0 + (max(end, first) - first) * per_byte
        return 0.0

    def prune(self) -> None:
        while len(self.extents) > 1 and self.extents[0][1] <= self.pos:
            self.extents.pop(0)


@dataclass
class DiskStats:
    """Counters since the last reset (all reads as seen by the disk)."""

    requests: int = 0
    request_bytes: int = 0
    cache_hits: int = 0
    device_reads: int = 0
    device_bytes: int = 0
    seeks: int = 0
    prefetches: int = 0
    opens: int = 0
    busy_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class SeekModel:
    """Service times of reads on one virtual disk head (see module docstring).

    Not thread-safe: callers serialize calls, which is also what the disk does.
    """

    def __init__(self, params: DiskParams | None = None):
        self.params = params or DiskParams()
        self.stats = DiskStats()
        self.drop_cache()

    def drop_cache(self) -> None:
        """Forget the cache and the head position (a cold disk)."""
        self._opened: set[object] = set()
        self.head: int | None = None
        self.free_at = 0.0
        self._segments: list[_Segment] = []

    def reset_stats(self) -> None:
        self.stats = DiskStats()

    # -- requests ---------------------------------------------------------

    def open(self, now: float, key: object = None) -> float:
        """Open file ``key`` at time ``now``; returns when it completes. Only
        the first open of a file since :meth:`drop_cache` reads metadata
        from the platter; later ones find its inode cached."""
        self.stats.opens += 1
        if key is not None:
            if key in self._opened:
                return now
            self._opened.add(key)
        if self.params.open_s == 0:
            return now
        start = max(now, self.free_at)
        self.free_at = start + self.params.open_s
        self.stats.busy_s += self.params.open_s
        self.head = None
        return self.free_at

    def read(self, addr: int, num_bytes: int, now: float, *, limit: int | None = None) -> float:
        """A read of ``num_bytes`` at platter address ``addr`` issued at
        ``now``; returns the time its data has reached the host. Read-ahead
        stops at ``limit`` (the end of the file), as the kernel's does."""
        if num_bytes <= 0:
            return now
        end = addr + num_bytes
        self.stats.requests += 1
        self.stats.request_bytes += num_bytes
        bus_s = num_bytes / self.params.bus_bytes_per_s

        segment = self._find(addr, end)
        if segment is not None:
            self.stats.cache_hits += 1
            done = max(now, segment.ready_time(end)) + bus_s
        else:
            segment = self._continuing(addr)
            if segment is None:
                segment = self._new_segment(addr, now)
                self._device_read(segment, addr, num_bytes, now)
            else:
                window = min(max(2 * segment.window, num_bytes), self._share(now, segment))
                segment.window = max(window, 1)
                fetch = max(end - segment.end, min(window, _room(segment.end, limit)))
                self._device_read(segment, segment.end, fetch, now)
            done = segment.ready_time(end) + bus_s
        segment.last_used = now
        segment.pos = max(segment.pos, end)
        segment.prune()
        self._maybe_prefetch(segment, now, limit)
        return done

    # -- internals --------------------------------------------------------

    def _find(self, addr: int, end: int) -> _Segment | None:
        for segment in self._segments:
            if segment.start <= addr and end <= segment.end:
                return segment
        return None

    def _continuing(self, addr: int) -> _Segment | None:
        """The stream whose cached range this read runs off the end of."""
        for segment in self._segments:
            if segment.start <= addr <= segment.end and segment.end > segment.start:
                return segment
        return None

    def _new_segment(self, addr: int, now: float) -> _Segment:
        if len(self._segments) >= MAX_SEGMENTS:
            self._segments.remove(min(self._segments, key=lambda s: s.last_used))
        segment = _Segment(start=addr, end=addr, window=0, last_used=now, pos=addr)
        self._segments.append(segment)
        return segment

    def _share(self, now: float, current: _Segment) -> int:
        """This stream's share of the read-ahead budget."""
        horizon = now - self.params.stream_idle_s
        active = sum(1 for s in self._segments if s is current or s.last_used >= horizon)
        return self.params.readahead_budget_bytes // max(active, 1)

    def _device_read(self, segment: _Segment, addr: int, num_bytes: int, now: float) -> None:
        params = self.params
        start = max(now, self.free_at)
        cost = num_bytes / params.transfer_bytes_per_s
        if self.head != addr:
            cost += params.seek_s
            self.stats.seeks += 1
        self.free_at = start + cost
        first_byte_at = self.free_at - num_bytes / params.transfer_bytes_per_s
        self.head = addr + num_bytes
        self.stats.device_reads += 1
        self.stats.device_bytes += num_bytes
        self.stats.busy_s += cost
        if addr != segment.end:
            segment.start = addr
            segment.extents.clear()
        segment.end = addr + num_bytes
        segment.extents.append((addr, segment.end, first_byte_at, 1.0 / params.transfer_bytes_per_s))

    def _maybe_prefetch(self, segment: _Segment, now: float, limit: int | None) -> None:
        """Fetch the stream's next window in the background once the reader
        has started on the last window fetched, so one window is always in
        flight ahead of a sequential reader."""
        if segment.window <= 0:
            return
        if segment.end - segment.pos > segment.window:
            return
        window = min(2 * segment.window, self._share(now, segment))
        segment.window = max(window, 1)
        fetch = min(window, _room(segment.end, limit))
        if fetch <= 0:
            return
        self.stats.prefetches += 1
        self._device_read(segment, segment.end, fetch, now)


def _room(addr: int, limit: int | None) -> int:
    """Bytes from ``addr`` up to ``limit`` (unbounded when None)."""
    return (1 << 62) if limit is None else max(0, limit - addr)


def interleaved_throughput(params: DiskParams, num_streams: int) -> float:
    """Steady-state bytes/s when ``num_streams`` sequential readers alternate
    and each fetch pays a seek: the closed form the model converges to."""
    if num_streams <= 1:
        return params.transfer_bytes_per_s
    window = params.readahead_budget_bytes / num_streams
    return window / (window / params.transfer_bytes_per_s + params.seek_s)
