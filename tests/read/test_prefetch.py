"""ReadAhead: ordered delivery, byte budget, error hand-over, prompt close."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from shardkit.errors import UsageError
from shardkit.read.prefetch import ReadAhead

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def test_a_start_budget_holds_until_the_consumer_takes_then_grows_with_what_it_takes():
    ra: ReadAhead = ReadAhead([1], lambda job: (bytes(100) for _ in range(60)), budget_bytes=2000, start_bytes=300)
    with ra:
        ra.start()
        deadline = time.monotonic() + 10
        while ra._held < 300 and time.monotonic() < deadline:
            time.sleep(0.001)
        # Nothing taken yet: the start budget is all the reader may hold.
        assert ra._held == 300 and not ra.has_room(100)
        taken = peak = 0
        for _, item in ra:
            if isinstance(item, bytes):
                taken += len(item)
            time.sleep(0.001)  # let the reader run ahead
            assert ra._held <= max(300, 2 * taken), "the budget grows only with what the consumer took"
            peak = max(peak, ra._held)
    assert taken == 6000
    assert 1000 < peak <= 2000, "the budget grows to, and stays within, budget_bytes"


def test_start_budget_must_be_positive():
    with pytest.raises(UsageError, match="start budget"):
        ReadAhead([], lambda job: [], start_bytes=0)


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
    ra.close()
    assert not any(t.name == "shardkit-read-ahead" and t.is_alive() for t in threading.enumerate())


def test_budget_must_be_positive():
    with pytest.raises(UsageError, match="budget"):
        ReadAhead([], lambda job: [], budget_bytes=0)


def test_wait_room_waits_until_the_consumer_has_made_room():
    room_at: list[int] = []
    asked_at: list[int] = []
    asking = threading.Event()

    def fetch(job):
        if job == "big":
            yield bytes(300)
            yield bytes(300)
        else:
            asked_at.append(ra._held)
            asking.set()
            assert ra.wait_room(500)  # may only go on once at most 500 bytes are queued
            room_at.append(ra._held)
            yield bytes(400)

    ra: ReadAhead = ReadAhead(["big", "lease"], fetch, budget_bytes=1000)
    with ra:
        ra.start()
        assert asking.wait(10)  # the consumer has taken nothing yet
        got = [item for _, item in ra]
    # Asked with 600 bytes queued, it went on only once the consumer had made room.
    assert asked_at == [600]
    assert room_at and room_at[0] <= 500
    assert [len(x) for x in got if isinstance(x, bytes)] == [300, 300, 400]


def test_has_room_answers_without_waiting_what_wait_room_would_wait_for():
    answers: list[bool] = []
    queued = threading.Event()

    def fetch(job):
        answers.append(ra.has_room(1000))  # empty queue: always room
        yield bytes(600)
        queued.wait(5)
        answers.append(ra.has_room(400))  # 600 + 400 fits the budget
        answers.append(ra.has_room(401))  # one byte over: no room, and no wait
        yield bytes(1)

    ra: ReadAhead = ReadAhead([0], fetch, budget_bytes=1000)
    with ra:
        ra.start()
        deadline = time.monotonic() + 10
        while ra._held < 600 and time.monotonic() < deadline:
            time.sleep(0.01)
        queued.set()
        while len(answers) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # the consumer takes nothing until the reader has asked
        got = [item for _, item in ra]
    assert answers == [True, True, False]
    assert [len(x) for x in got if isinstance(x, bytes)] == [600, 1]


def test_wait_room_returns_false_once_closed_and_a_fetch_left_half_way_is_closed():
    closed = threading.Event()
    asking = threading.Event()
    answers: list[bool] = []

    def fetch(job):
        try:
            yield bytes(900)
            asking.set()
            answers.append(ra.wait_room(900))  # nobody takes the first chunk: this waits
            if answers[-1]:
                yield bytes(900)
            yield b"never taken"  # the reader stops here (its put fails) and must close us
        finally:
            closed.set()

    ra: ReadAhead = ReadAhead([0], fetch, budget_bytes=1000)
    ra.start()
    assert asking.wait(10)
    assert answers == []  # no consumer takes anything, so only close() can end the wait
    ra.close()
    assert closed.wait(5), "the fetch left half-way was not closed"
    assert answers == [False]


def test_start_reads_before_the_first_item_is_asked_for():
    fetched = threading.Event()

    def fetch(job):
        fetched.set()
        yield b"x"

    with ReadAhead([0], fetch) as ra:
        ra.start()
        assert fetched.wait(5)
        assert list(ra) == [(0, b"x"), (0, None)]


def test_an_iterator_left_half_read_at_exit_closes_quietly(make_shards, tmp_path):
    """A script that stops after one sample and exits: the reader's threads and
    ``finally`` blocks run before the interpreter tears its modules down, so
    nothing is printed as "Exception ignored"."""
    make_shards((40, 40), name="ds")
    script = (
        "import shardkit\n"
        f"ds = shardkit.ShardDataset({str(tmp_path / 'ds')!r}, mode='exact', shuffle=False)\n"
        "it = iter(ds)\n"
        "print(next(it)['__key__'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
