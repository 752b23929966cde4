"""The shared shard cache: one complete file per shard, LRU under a limit, no partial files."""

from __future__ import annotations

import hashlib
import os
import signal
import time
import subprocess
import sys
import textwrap

import pytest
from tests.remote.remote_servers import Faults, fast_options

from shardkit.errors import CorruptShardError
from shardkit.io.cache import ShardCache, cache_key
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source


def options(cache_dir, **kw) -> SourceOptions:
    """The shared fast options with a cache in ``cache_dir``, larger parts and a 1 s read timeout."""
    settings = {"cache_dir": str(cache_dir), "part_bytes": 64 << 10, "chunk_bytes": 32 << 10, "read_timeout_s": 1.0}
    return fast_options(**{**settings, **kw})


def read(url, opts, **kw) -> bytes:
    return b"".join(open_source(url, options=opts, **kw).iter_range(0, None, chunk_bytes=opts.chunk_bytes))


def entries(cache_dir) -> list[str]:
    return sorted(n for n in os.listdir(cache_dir) if n != "locks")


def test_second_read_is_served_from_cache(http_server, tmp_path):
    data = os.urandom(300_000)
    url = http_server.add("/a.tar", data)
    opts = options(tmp_path / "cache")
    sha = hashlib.sha256(data).hexdigest()
    assert read(url, opts, expected_size=len(data), expected_sha256=sha) == data
    first = len(http_server.gets("/a.tar"))
    assert entries(tmp_path / "cache") == [cache_key(url, sha) + ".shard"]
    assert read(url, opts, expected_size=len(data), expected_sha256=sha) == data
    src = open_source(url, options=opts, expected_size=len(data), expected_sha256=sha)
    assert b"".join(src.iter_range(1000, 2000, chunk_bytes=100)) == data[1000:2000]
    assert len(http_server.gets("/a.tar")) == first


def test_key_is_full_url_not_basename(http_server, tmp_path):
    a, b = os.urandom(1000), os.urandom(1000)
    url_a = http_server.add("/one/shard-000000.tar", a)
    url_b = http_server.add("/two/shard-000000.tar", b)
    opts = options(tmp_path / "cache")
    assert read(url_a, opts) == a
    assert read(url_b, opts) == b
    assert read(url_a, opts) == a and read(url_b, opts) == b
    assert len(entries(tmp_path / "cache")) == 2


def test_prefix_read_caches_whole_object(http_server, tmp_path):
    data = os.urandom(100_000)
    url = http_server.add("/a.tar", data)
    opts = options(tmp_path / "cache")
    src = open_source(url, options=opts, expected_size=len(data))
    assert b"".join(src.iter_range(0, 90_000, chunk_bytes=4096)) == data[:90_000]
    (entry,) = entries(tmp_path / "cache")
    assert (tmp_path / "cache" / entry).read_bytes() == data


def test_checksum_mismatch_is_not_cached(http_server, tmp_path):
    data = os.urandom(10_000)
    url = http_server.add("/a.tar", data)
    opts = options(tmp_path / "cache")
    with pytest.raises(CorruptShardError, match=r"/a\.tar: the bytes have sha256 .* but the manifest says 00"):
        read(url, opts, expected_sha256="00" * 32)
    assert entries(tmp_path / "cache") == []


def test_early_close_and_failed_download_leave_nothing(http_server, tmp_path):
    data = os.urandom(500_000)
    url = http_server.add("/a.tar", data)
    opts = options(tmp_path / "cache")
    it = open_source(url, options=opts).iter_range(0, None, chunk_bytes=1000)
    next(it)
    it.close()
    assert entries(tmp_path / "cache") == []
    http_server.faults["/a.tar"] = Faults(statuses=[404] * 50)  # fetch threads of the closed read may still ask
    with pytest.raises(OSError, match="404"):
        read(url, opts, expected_size=len(data))
    assert entries(tmp_path / "cache") == []


def test_eviction_keeps_under_limit_lru_first(http_server, tmp_path):
    opts = options(tmp_path / "cache", cache_max_bytes=25_000)
    urls = [http_server.add(f"/s{i}.tar", os.urandom(10_000)) for i in range(4)]

    def age(url: str, seconds: int) -> None:
        # Recency is the entry's mtime: set it instead of sleeping between reads.
        os.utime(tmp_path / "cache" / (cache_key(url) + ".shard"), (seconds, seconds))

    read(urls[0], opts)
    age(urls[0], 1000)
    read(urls[1], opts)
    age(urls[1], 2000)
    read(urls[0], opts)  # a hit: s0 is now more recent than s1
    read(urls[2], opts)
    cache = ShardCache(str(tmp_path / "cache"))
    assert cache.total_bytes() <= 25_000
    kept = set(entries(tmp_path / "cache"))
    assert cache_key(urls[1]) + ".shard" not in kept
    assert {cache_key(urls[0]) + ".shard", cache_key(urls[2]) + ".shard"} == kept


def test_open_entry_is_never_evicted(http_server, tmp_path):
    opts = options(tmp_path / "cache", cache_max_bytes=15_000)
    a, b = os.urandom(10_000), os.urandom(10_000)
    url_a, url_b = http_server.add("/a.tar", a), http_server.add("/b.tar", b)
    read(url_a, opts)
    reading = open_source(url_a, options=opts).iter_range(0, None, chunk_bytes=1000)
    got = next(reading)  # a is open now
    read(url_b, opts)  # over the limit, but a is in use: b is the one evicted (least recent not open)
    got += b"".join(reading)
    assert got == a
    assert cache_key(url_a) + ".shard" in entries(tmp_path / "cache")


def test_manifests_and_indexes_bypass_the_cache(http_server, tmp_path):
    opts = options(tmp_path / "cache")
    for path in ("/manifest.json", "/shard-000000.idx"):
        url = http_server.add(path, b"{}")
        open_source(url, options=opts).read_all()
        open_source(url, options=opts).read_all()
        assert len(http_server.gets(path)) == 2
    assert not (tmp_path / "cache").exists() or entries(tmp_path / "cache") == []


_READER = textwrap.dedent(
    """
    import hashlib, sys
    from shardkit.io.base import SourceOptions
    from shardkit.io.registry import open_source
    cache_dir, *urls = sys.argv[1:]
    opts = SourceOptions(cache_dir=cache_dir, part_bytes=64 << 10, chunk_bytes=16 << 10, read_timeout_s=5.0)
    for url in urls:
        data = b"".join(open_source(url, options=opts).iter_range(0, None, chunk_bytes=16 << 10))
        print(url, hashlib.sha256(data).hexdigest(), flush=True)
    """
)


def _python(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.Popen([sys.executable, "-c", _READER, *args], stdout=subprocess.PIPE, text=True, env=env)


def test_two_processes_share_one_complete_file_per_shard(http_server, tmp_path):
    blobs = {f"/s{i}.tar": os.urandom(200_000 + i) for i in range(4)}
    urls = [http_server.add(path, data) for path, data in blobs.items()]
    cache_dir = str(tmp_path / "cache")
    procs = [_python(cache_dir, *urls), _python(cache_dir, *reversed(urls))]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    want = {url: hashlib.sha256(data).hexdigest() for url, data in zip(urls, blobs.values(), strict=True)}
    for out in outs:
        assert dict(line.split() for line in out.splitlines()) == want
    assert entries(cache_dir) == sorted(cache_key(u) + ".shard" for u in urls)
    for url in urls:
        path = os.path.join(cache_dir, cache_key(url) + ".shard")
        assert hashlib.sha256(open(path, "rb").read()).hexdigest() == want[url]


def test_killed_download_leaves_no_final_file(http_server, tmp_path):
    data = os.urandom(300_000)
    url = http_server.add("/a.tar", data)
    http_server.faults["/a.tar"] = Faults(stall_after=[10_000] * 50, stall_s=30.0)
    cache_dir = str(tmp_path / "cache")
    proc = _python(cache_dir, url)
    # The download is under way (a .part file) and stalled mid-shard: kill it there.
    assert http_server.wait_for(lambda: http_server.stalls_held >= 1)
    deadline = time.monotonic() + 60  # a failure bound, not a pace: the .part precedes the stall
    while not any(n.endswith(".part") for n in os.listdir(cache_dir)):
        assert time.monotonic() < deadline, "the download made no .part file"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert not any(n.endswith(".shard") for n in os.listdir(cache_dir))
    http_server.faults["/a.tar"] = Faults()
    opts = options(cache_dir)
    assert read(url, opts) == data  # the lock died with the process; a new download completes
    assert entries(cache_dir) == [cache_key(url) + ".shard"]


def test_rewritten_object_with_new_checksum_is_not_served_stale(http_server, tmp_path):
    opts = options(tmp_path / "cache")
    old, new = os.urandom(5000), os.urandom(5000)
    url = http_server.add("/a.tar", old)
    assert read(url, opts, expected_sha256=hashlib.sha256(old).hexdigest()) == old
    http_server.add("/a.tar", new)
    assert read(url, opts, expected_sha256=hashlib.sha256(new).hexdigest()) == new


def test_failing_cache_disk_does_not_fail_the_read(http_server, tmp_path, monkeypatch, caplog):
    from shardkit.io import cache as cache_module

    data = os.urandom(200_000)
    url = http_server.add("/a.tar", data)

    def full_disk(self, chunk):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_module.CacheWriter, "write", full_disk)
    assert read(url, options(tmp_path / "cache")) == data
    assert entries(tmp_path / "cache") == []
    assert "No space left" in caplog.text


def test_room_is_made_before_a_download_of_known_size(http_server, tmp_path):
    opts = options(tmp_path / "cache", cache_max_bytes=25_000)
    cache = ShardCache(str(tmp_path / "cache"))
    for i in range(5):
        url = http_server.add(f"/s{i}.tar", os.urandom(10_000))
        it = open_source(url, options=opts, expected_size=10_000).iter_range(0, None, chunk_bytes=1000)
        next(it)  # mid-download: finished entries plus this one fit the limit
        assert cache.total_bytes() + 10_000 <= 25_000
        b"".join(it)
        assert cache.total_bytes() <= 25_000
