"""The piece reader's local reads: requests cut on sample boundaries."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shardkit.read.ranges import AlignedSource


class _Recorded:
    """A byte source over ``data`` that records each range asked for."""

    url = "recorded"

    def __init__(self, data: bytes):
        self.data = data
        self.requests: list[tuple[int, int | None]] = []

    def iter_range(self, start: int, end: int | None, *, chunk_bytes: int) -> Iterator[bytes]:
        self.requests.append((start, end))
        stop = len(self.data) if end is None else end
        for pos in range(start, stop, chunk_bytes):
            yield self.data[pos : min(pos + chunk_bytes, stop)]

    def read_all(self) -> bytes:
        return self.data


def test_requests_end_on_sample_boundaries_and_the_last_takes_the_end_marker():
    data = bytes(range(256)) * 8
    # Samples [100, 150), [150, 400), [400, 420), [420, 500); then a trailer to 600.
    inner = _Recorded(data)
    source = AlignedSource(inner, np.array([150, 400, 420, 500]))
    chunks = list(source.iter_range(100, 600, chunk_bytes=100))
    assert b"".join(chunks) == data[100:600]
    # A sample larger than a chunk is one request of its own; small ones
    # share one; the request reaching the last sample runs on to the end.
    assert inner.requests == [(100, 150), (150, 400), (400, 600)]
    assert len(chunks) == 3, "each request is one chunk, so the parser never copies a partial member"


def test_a_range_that_ends_inside_the_shard_stops_on_its_last_sample():
    data = bytes(1000)
    inner = _Recorded(data)
    source = AlignedSource(inner, np.array([200, 300, 400]))
    assert b"".join(source.iter_range(100, 400, chunk_bytes=150)) == data[100:400]
    assert inner.requests == [(100, 200), (200, 300), (300, 400)]
    assert source.url == "recorded" and source.read_all() == data
