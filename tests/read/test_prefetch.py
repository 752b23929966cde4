"""ReadAhead: ordered delivery, byte budget, error hand-over, prompt close."""

from __future__ import annotations

import threading
import time

import pytest

from shardkit.errors import UsageError
from shardkit.read.prefetch import ReadAhead


def test_delivers_every_chunk_of_every_job_in_order():
    jobs = [("a", 3), ("b", 0), ("c", 2)]
    with ReadAhead(jobs, lambda job: (f"{job[0]}{i}".encode() for i in range(job[1])), budget_bytes=4) as ra:
        got = [(job[0], item) for job, item in ra]
    assert got == [("a", b"a0"), ("a", b"a1"), ("a", b"a2"), ("a", None), ("b", None), ("c", b"c0"), ("c", b"c1"), ("c", None)]


def test_reader_never_holds_more_than_the_budget():
    held_max = 0
    ra: ReadAhead = ReadAhead([1], lambda job: (bytes(100) for _ in range(50)), budget_bytes=350)
    with ra:
        for _, item in ra:
            time.sleep(0.001)  # let the reader run ahead
            held_max = max(held_max, ra._held)
    assert 0 < held_max <= 350


def test_fetch_error_is_handed_over_and_the_stream_goes_on():
    def fetch(job):
        yield b"x"
        if job == "bad":
            raise OSError("disk on fire")

    with ReadAhead(["bad", "good"], fetch) as ra:
        got = list(ra)
    assert got[0] == ("bad", b"x")
    assert got[1][0] == "bad" and isinstance(got[1][1], OSError)
    assert got[2:] == [("good", b"x"), ("good", None)]


def test_close_stops_a_reader_waiting_on_the_budget():
    def endless(job):
        while True:
            yield bytes(1000)

    ra: ReadAhead = ReadAhead([0], endless, budget_bytes=2000)
    stream = iter(ra)
    next(stream)
    start = time.monotonic()
    ra.close()
    assert time.monotonic() - start < 5
    assert not any(t.name == "shardkit-read-ahead" and t.is_alive() for t in threading.enumerate())


def test_budget_must_be_positive():
    with pytest.raises(UsageError, match="budget"):
        ReadAhead([], lambda job: [], budget_bytes=0)
