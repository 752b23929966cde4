"""Cost accounting of the virtual disk head behind the hdd-seek profile."""

from __future__ import annotations

import heapq

import pytest

from bench.profiles.seekmodel import DiskParams, SeekModel, interleaved_throughput

MB = 1_000_000
REQUEST = 128 << 10


def stream_rate(model: SeekModel, num_streams: int, *, total: int = 200 << 20, host_s: float = 0.0002) -> float:
    """Bytes/s when ``num_streams`` readers each read their own file in
    128 KiB requests, issuing the next one when the last has arrived."""
    per_stream = total // num_streams
    bases = [i * (1 << 32) for i in range(num_streams)]
    done = [0] * num_streams
    queue = [(0.0, i) for i in range(num_streams)]
    finish = 0.0
    while queue:
        now, i = heapq.heappop(queue)
        arrived = model.read(bases[i] + done[i], REQUEST, now, limit=bases[i] + per_stream)
        done[i] += REQUEST
        finish = max(finish, arrived)
        if done[i] < per_stream:
            heapq.heappush(queue, (arrived + host_s, i))
    return total / finish


def test_one_stream_reads_near_transfer_rate_with_one_seek():
    model = SeekModel(DiskParams(open_s=0))
    rate = stream_rate(model, 1)
    assert rate == pytest.approx(170 * MB, rel=0.06)
    assert model.stats.seeks == 1


@pytest.mark.parametrize("streams", [2, 4, 8])
def test_interleaved_streams_pay_a_seek_per_window(streams):
    model = SeekModel(DiskParams(open_s=0))
    rate = stream_rate(model, streams)
    assert rate < 170 * MB * 0.95
    assert rate == pytest.approx(interleaved_throughput(model.params, streams), rel=0.12)


def test_throughput_falls_as_streams_are_added():
    rates = [stream_rate(SeekModel(DiskParams(open_s=0)), k) for k in (1, 2, 4, 8)]
    assert rates == sorted(rates, reverse=True)


def test_random_small_read_costs_seek_plus_transfer():
    params = DiskParams(open_s=0)
    model = SeekModel(params)
    done = model.read(10 << 30, 110_000, now=1.0)
    expected = params.seek_s + 110_000 / params.transfer_bytes_per_s + 110_000 / params.bus_bytes_per_s
    assert done - 1.0 == pytest.approx(expected)
    assert model.stats.seeks == 1


def test_continuing_read_does_not_seek_but_jump_does():
    model = SeekModel(DiskParams(open_s=0, readahead_budget_bytes=0))
    t = model.read(0, 4096, 0.0)
    model.read(4096, 4096, t)
    assert model.stats.seeks == 1
    model.read(1 << 30, 4096, t)
    assert model.stats.seeks == 2


def test_requests_are_served_one_at_a_time():
    params = DiskParams(open_s=0)
    model = SeekModel(params)
    first = model.read(0, 1 << 20, 0.0)
    second = model.read(5 << 30, 1 << 20, 0.0)  # issued at the same moment
    one = params.seek_s + (1 << 20) / params.transfer_bytes_per_s
    assert second - first == pytest.approx(one, rel=1e-6)


def test_cache_hit_costs_only_the_bus():
    params = DiskParams(open_s=0)
    model = SeekModel(params)
    t = model.read(0, REQUEST, 0.0)
    t = model.read(REQUEST, REQUEST, t)  # continuing: fetches ahead
    hits_before = model.stats.cache_hits
    later = t + 10.0
    done = model.read(2 * REQUEST, REQUEST, later)
    assert model.stats.cache_hits == hits_before + 1
    assert done - later == pytest.approx(REQUEST / params.bus_bytes_per_s)


def test_read_ahead_stops_at_the_end_of_the_file():
    model = SeekModel(DiskParams(open_s=0))
    size = 3 << 20
    t = 0.0
    for offset in range(0, size, REQUEST):
        t = model.read(offset, REQUEST, t, limit=size)
    assert model.stats.device_bytes == size


def test_drop_cache_makes_the_next_read_seek_again():
    model = SeekModel(DiskParams(open_s=0))
    t = model.read(0, REQUEST, 0.0)
    model.drop_cache()
    model.read(0, REQUEST, t)
    assert model.stats.seeks == 2
    assert model.stats.cache_hits == 0


def test_open_charges_device_time_and_moves_the_head():
    model = SeekModel(DiskParams(open_s=0.002))
    t = model.read(0, 4096, 0.0)
    opened = model.open(t)
    assert opened - t == pytest.approx(0.002)
    model.read(4096, 4096, opened)
    assert model.stats.seeks == 2


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError, match="transfer rates"):
        DiskParams(transfer_bytes_per_s=0)


def test_reopening_a_file_finds_its_inode_cached():
    model = SeekModel(DiskParams(open_s=0.002))
    first = model.open(0.0, "/a")
    assert first == pytest.approx(0.002)
    assert model.open(first, "/a") == first
    model.drop_cache()
    assert model.open(first, "/a") == pytest.approx(first + 0.002)
