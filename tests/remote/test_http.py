"""HTTP sources against a real server on 127.0.0.1 with injected faults."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time

import pytest

from shardkit.errors import RemoteError, UsageError
from shardkit.format.tar import SampleParser
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source
from tests.remote.remote_servers import most_attempts

FAST = SourceOptions(
    connect_timeout_s=2.0,
    read_timeout_s=0.5,
    retry_deadline_s=5.0,
    backoff_initial_s=0.01,
    backoff_max_s=0.1,
    part_bytes=64 << 10,
    remote_read_ahead_bytes=256 << 10,
    chunk_bytes=32 << 10,
)

# FAST with a read timeout no busy machine reaches: for tests that count
# requests, where a timed-out read would add one.
PATIENT = dataclasses.replace(FAST, read_timeout_s=30.0)


def blob(size: int) -> bytes:
    return os.urandom(size)


def fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardkit-fetch"]


def range_length(header: str | None) -> int:
    first, last = header.removeprefix("bytes=").split("-")
    return int(last) - int(first) + 1


def read(url: str, options: SourceOptions = FAST, start: int = 0, end: int | None = None, **kw) -> bytes:
    source = open_source(url, options=options, **kw)
    return b"".join(source.iter_range(start, end, chunk_bytes=options.chunk_bytes))


def test_whole_object_in_parallel_parts(http_server):
    data = blob(1_000_003)
    url = http_server.add("/a.tar", data)
    assert read(url) == data
    gets = http_server.gets("/a.tar")
    assert gets[0] == "bytes=0-0"  # the size probe (a GET: presigned URLs allow no HEAD)
    assert len(gets) == 1 + 16  # ceil(1_000_003 / 64 KiB), one ranged GET per part
    assert all(r and r.startswith("bytes=") for r in gets)


def test_the_start_of_a_range_comes_over_every_connection(http_server):
    # The first parts, one per request, are small (MIN_PART_BYTES), so what a
    # reader needs first arrives over all its connections; then full parts.
    from shardkit.io.ranged import MIN_PART_BYTES

    data = blob(9 * MIN_PART_BYTES + 5)
    url = http_server.add("/big.tar", data)
    options = dataclasses.replace(PATIENT, part_bytes=4 * MIN_PART_BYTES, max_concurrent_requests=3)
    assert read(url, options) == data
    lengths = [range_length(r) for r in http_server.gets("/big.tar")[1:]]
    assert lengths[:3] == [MIN_PART_BYTES] * 3 and sum(lengths) == len(data)
    assert max(lengths[3:]) > MIN_PART_BYTES  # then the usual, larger parts


def test_sub_range_and_chunk_sizes(http_server):
    data = blob(300_000)
    url = http_server.add("/a.tar", data)
    source = open_source(url, options=FAST)
    chunks = list(source.iter_range(1000, 250_000, chunk_bytes=10_000))
    assert b"".join(chunks) == data[1000:250_000]
    assert max(len(c) for c in chunks) <= 10_000


def test_read_all_small_object_is_one_request(http_server):
    url = http_server.add("/manifest.json", b'{"x": 1}')
    assert open_source(url, options=FAST).read_all() == b'{"x": 1}'
    assert http_server.gets("/manifest.json") == [None]


def test_dropped_connections_resume_from_last_byte(http_server):
    data = blob(400_000)
    url = http_server.add("/a.tar", data)
    from tests.remote.remote_servers import Faults

    http_server.faults["/a.tar"] = Faults(drop_after=[10_000, 5_000, 20_000, 1])
    assert read(url, expected_size=len(data)) == data  # known size: no probe request
    gets = http_server.gets("/a.tar")
    # Every drop costs exactly one extra request, and no byte is sent twice:
    # each resume asks only for what had not arrived, wherever the drops landed.
    assert len(gets) == 7 + 4
    assert http_server.sent["/a.tar"] == len(data)


def test_single_stream_read_all_resumes_with_range(http_server):
    from tests.remote.remote_servers import Faults

    data = blob(200_000)
    url = http_server.add("/big.json", data)
    http_server.faults["/big.json"] = Faults(drop_after=[70_000])
    assert open_source(url, options=FAST).read_all() == data
    assert http_server.gets("/big.json") == [None, "bytes=70000-"]


def test_5xx_answers_are_retried(http_server):
    from tests.remote.remote_servers import Faults

    data = blob(100_000)
    url = http_server.add("/a.tar", data)
    http_server.faults["/a.tar"] = Faults(statuses=[503, 500, 503])
    assert read(url) == data


def test_stall_past_read_timeout_resumes(http_server):
    from tests.remote.remote_servers import Faults

    data = blob(100_000)
    url = http_server.add("/a.tar", data)
    # The stall outlasts the test: only the client's read timeout can end it.
    http_server.faults["/a.tar"] = Faults(stall_after=[30_000], stall_s=600.0)
    assert read(url, expected_size=len(data)) == data
    # All bytes arrived while the stalled response was still held open: the
    # client gave up on it and asked again from where it had stopped (30,000
    # bytes into whichever of the two 64 KiB parts was served first).
    assert http_server.stalls_held == 1
    resumes = {"bytes=30000-65535", "bytes=95536-99999"}
    assert resumes & set(http_server.gets("/a.tar"))


def test_server_ignoring_range_still_gives_exact_bytes(http_server):
    from tests.remote.remote_servers import Faults

    data = blob(150_000)
    url = http_server.add("/a.tar", data)
    http_server.faults["/a.tar"] = Faults(ignore_range=True, drop_after=[100_000])
    assert read(url, start=70_000, end=140_000) == data[70_000:140_000]


def test_a_server_that_ignores_ranges_is_read_in_one_request_per_object_not_in_ever_longer_parts(http_server, caplog):
    """`python -m http.server` answers every ranged GET with the whole object.
    Read in parts, part k cost the object up to its end: quadratic in the
    object's size (a 1 GB shard in 4 MiB parts moved 125 GB). Once such an
    answer comes, the rest of the object, and every later object of that
    server, is read in one request; a warning says so once."""
    import logging

    from tests.remote.remote_servers import Faults

    data, other = blob(4 << 20), blob(1 << 20)
    url, other_url = http_server.add("/a.tar", data), http_server.add("/b.tar", other)
    for path in ("/a.tar", "/b.tar"):
        http_server.faults[path] = Faults(ignore_range=True)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        assert read(url, options=PATIENT, expected_size=len(data)) == data
        assert http_server.sent["/a.tar"] <= 6 * len(data)  # in 64 KiB parts: > 32 times it
        assert read(other_url, options=PATIENT, expected_size=len(other)) == other
    assert len(http_server.gets("/b.tar")) == 1 and http_server.sent["/b.tar"] == len(other)
    warned = [r.getMessage() for r in caplog.records if "ignores Range requests" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"{http_server.base_url} ignores Range requests")


def test_a_whole_object_answer_to_a_range_covering_the_whole_object_is_no_sign_of_ignored_ranges(http_server):
    """A server may answer a range that covers the whole object with a plain
    200: that is no reason to read every later object of it in one request."""
    from tests.remote.remote_servers import Faults

    small, large = blob(1000), blob(1 << 20)
    small_url, large_url = http_server.add("/small.tar", small), http_server.add("/large.tar", large)
    http_server.faults["/small.tar"] = Faults(ignore_range=True)
    assert read(small_url, options=PATIENT, expected_size=len(small)) == small  # asks bytes=0-999: all of it
    assert read(large_url, options=PATIENT, expected_size=len(large)) == large
    assert len(http_server.gets("/large.tar")) == 16  # still in 64 KiB parts


def test_404_fails_fast_naming_url(http_server):
    with pytest.raises(RemoteError, match=r"http://127\.0\.0\.1:\d+/missing\.tar: HTTP 404") as info:
        read(http_server.base_url + "/missing.tar?token=SECRET", options=PATIENT)
    assert len(http_server.gets("/missing.tar")) == 1  # not retried
    assert info.value.status == 404
    assert "SECRET" not in str(info.value)
    assert isinstance(info.value, OSError)


def test_403_fails_fast(http_server):
    from tests.remote.remote_servers import Faults

    url = http_server.add("/a.tar", blob(1000))
    http_server.faults["/a.tar"] = Faults(statuses=[403])
    with pytest.raises(RemoteError, match="HTTP 403.*access denied"):
        read(url, expected_size=1000)
    assert len(http_server.gets("/a.tar")) == 1


def test_persistent_5xx_gives_up_after_deadline_with_offset(http_server):
    from tests.remote.remote_servers import Faults

    url = http_server.add("/a.tar", blob(1000))
    http_server.faults["/a.tar"] = Faults(statuses=[503] * 1000)
    options = SourceOptions(retry_deadline_s=0.5, backoff_initial_s=0.01, backoff_max_s=0.05)
    with pytest.raises(RemoteError, match=r"/a\.tar: giving up at byte 0 after \d+ attempts.*HTTP 503") as info:
        read(url, options=options, expected_size=1000)
    assert info.value.offset == 0 and info.value.retryable
    attempts = int(re.search(r"after (\d+) attempts", str(info.value)).group(1))
    assert attempts == len(http_server.gets("/a.tar"))  # each attempt one request
    # The waits between attempts add up to at most the deadline, however slow
    # the machine, which caps the number of attempts.
    assert 2 <= attempts <= most_attempts(options)


def test_refused_connection_gives_up_naming_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = SourceOptions(retry_deadline_s=0.3, backoff_initial_s=0.01, backoff_max_s=0.05)
    with pytest.raises(RemoteError, match=rf"http://127\.0\.0\.1:{port}/x\.tar: giving up"):
        read(f"http://127.0.0.1:{port}/x.tar", options=options)


def test_concurrency_is_bounded(http_server):
    data = blob(2_000_000)
    url = http_server.add("/a.tar", data)
    options = SourceOptions(part_bytes=50_000, max_concurrent_requests=3, remote_read_ahead_bytes=10 << 20, chunk_bytes=50_000)
    peak = 0
    source = open_source(url, options=options)
    for _ in source.iter_range(0, None, chunk_bytes=50_000):
        peak = max(peak, sum(t.name == "shardkit-fetch" for t in threading.enumerate()))
    assert 1 <= peak <= 3


def test_closing_early_stops_fetch_threads(http_server):
    data = blob(2_000_000)
    url = http_server.add("/a.tar", data)
    it = open_source(url, options=FAST).iter_range(0, None, chunk_bytes=1000)
    next(it)
    it.close()
    # Each fetch thread ends once it sees the stop (at its next read); none is
    # left reading the rest of the 2 MB object.
    for thread in fetch_threads():
        thread.join(timeout=60)
    assert not fetch_threads()
    assert http_server.sent["/a.tar"] < len(data)


def test_samples_exact_through_faults(make_shards, serve_dataset, http_server):
    from tests.remote.remote_servers import Faults

    manifest = make_shards([40, 0, 25], payload_bytes=3000)
    base = serve_dataset(manifest)
    for entry in manifest.shards:
        http_server.faults[f"/data/{entry.path}"] = Faults(statuses=[503], drop_after=[7000, 12345, 40000])
    for entry in manifest.shards:
        with open(os.path.join(manifest.location, entry.path), "rb") as f:
            local = f.read()
        remote = open_source(f"{base}/{entry.path}", options=FAST, expected_size=entry.num_bytes)
        parser = SampleParser(path=remote.url)
        keys = []
        got = bytearray()
        for chunk in remote.iter_range(0, None, chunk_bytes=FAST.chunk_bytes):
            got += chunk
            keys += [s.key for s in parser.feed(chunk)]
        keys += [s.key for s in parser.finish()]
        assert bytes(got) == local
        assert keys == [f"s{manifest.shards.index(entry):03d}_{i:05d}" for i in range(entry.num_samples)]


def test_pipe_needs_opt_in():
    with pytest.raises(UsageError, match="allow_pipe"):
        open_source("pipe:cat /etc/hostname")


def test_options_are_validated():
    with pytest.raises(UsageError, match="max_concurrent_requests"):
        SourceOptions(max_concurrent_requests=0)


def test_pipe_reads_command_output_without_shell(tmp_path):
    path = tmp_path / "x y.bin"
    data = blob(100_000)
    path.write_bytes(data)
    source = open_source(f"pipe:cat '{path}'", options=SourceOptions(allow_pipe=True))
    assert source.read_all() == data
    assert b"".join(source.iter_range(10, 5000, chunk_bytes=777)) == data[10:5000]
    bad = open_source("pipe:false; echo hi", options=SourceOptions(allow_pipe=True))
    with pytest.raises(RemoteError, match="pipe:false"):
        bad.read_all()


def test_query_string_never_logged(http_server, caplog):
    import logging

    from tests.remote.remote_servers import Faults

    url = http_server.add("/a.tar", blob(200_000)) + "?X-Amz-Signature=SECRET"
    http_server.faults["/a.tar"] = Faults(statuses=[503], drop_after=[1000])
    with caplog.at_level(logging.DEBUG):
        assert len(read(url)) == 200_000
        with pytest.raises(RemoteError) as info:
            read(http_server.base_url + "/none.tar?token=SECRET")
    assert "SECRET" not in caplog.text and "SECRET" not in str(info.value)
    assert "/a.tar" in caplog.text


def test_small_object_is_still_fetched_in_parallel(http_server):
    data = blob(3_000_000)
    url = http_server.add("/small.tar", data)
    options = SourceOptions(max_concurrent_requests=4, part_bytes=8 << 20, chunk_bytes=1 << 20)
    assert read(url, options=options, expected_size=len(data)) == data
    assert len(http_server.gets("/small.tar")) == 3  # 1 MiB parts rather than one 3 MB request


def test_retry_after_is_honoured(http_server):
    from tests.remote.remote_servers import Faults

    data = blob(10_000)
    url = http_server.add("/a.tar", data)
    http_server.faults["/a.tar"] = Faults(statuses=[429], retry_after=0.4)
    t0 = time.monotonic()
    assert read(url, PATIENT, expected_size=len(data)) == data  # backoff 0.01 s; the server asked for 0.4 s
    # A lower bound only (a slow machine makes it longer, never shorter).
    assert time.monotonic() - t0 >= 0.1  # capped at backoff_max_s (0.1 s)
    assert len(http_server.gets("/a.tar")) == 2  # the 429, then the bytes


def test_read_ahead_is_bounded_by_the_byte_budget(http_server):
    data = blob(64 << 20)
    url = http_server.add("/big.tar", data)
    options = SourceOptions(
        part_bytes=256 << 10, remote_read_ahead_bytes=2 << 20, max_concurrent_requests=4, chunk_bytes=64 << 10
    )
    it = open_source(url, options=options, expected_size=len(data)).iter_range(0, None, chunk_bytes=64 << 10)
    got = b"".join(next(it) for _ in range(16))  # 1 MiB, then the consumer pauses
    # Let the read-ahead go as far as it will: its threads end once the parts
    # they were given are fetched (a fetcher that kept going would read the
    # whole 64 MiB here, and fail below).
    for thread in fetch_threads():
        thread.join(timeout=60)
    assert not fetch_threads()
    requested = sum(range_length(r) for r in http_server.gets("/big.tar"))
    assert len(got) <= requested <= len(got) + options.remote_read_ahead_bytes
    assert http_server.sent["/big.tar"] == requested
    got += b"".join(it)
    assert got == data
    assert http_server.sent["/big.tar"] == len(data)  # nothing fetched twice
