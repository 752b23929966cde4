"""One contract, every source: local, file://, http:// (also through a shard cache), s3://,
memory:// (fsspec), pipe:."""

from __future__ import annotations

import os

import pytest

from shardkit.errors import CorruptShardError, RemoteError, TruncatedShardError, UsageError, redact_url
from shardkit.io.base import SourceOptions
from shardkit.io.registry import open_source

DATA = os.urandom(300_007)
SMALL = SourceOptions(part_bytes=64 << 10, chunk_bytes=16 << 10, remote_read_ahead_bytes=256 << 10, retry_deadline_s=2.0)


@pytest.fixture(params=["path", "file", "http", "cached", "s3", "memory", "pipe"])
def stored(request, tmp_path):
    """``(url, options)`` of an object holding DATA, plus a URL that does not exist."""
    kind = request.param
    if kind in ("path", "file", "pipe"):
        path = tmp_path / "obj.tar"
        path.write_bytes(DATA)
        if kind == "path":
            return str(path), str(tmp_path / "none.tar"), SMALL
        if kind == "file":
            return f"file://{path}", f"file://{tmp_path}/none.tar", SMALL
        opts = SourceOptions(**{**SMALL.__dict__, "allow_pipe": True})
        return f"pipe:cat {path}", None, opts
    if kind in ("http", "cached"):
        server = request.getfixturevalue("http_server")
        options = SMALL if kind == "http" else SourceOptions(**{**SMALL.__dict__, "cache_dir": str(tmp_path / "cache")})
        return server.add("/obj.tar", DATA), server.base_url + "/none.tar", options
    if kind == "s3":
        client, bucket = request.getfixturevalue("s3_bucket")
        client.put_object(Bucket=bucket, Key="obj.tar", Body=DATA)
        return f"s3://{bucket}/obj.tar", f"s3://{bucket}/none.tar", SMALL
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/contract/obj.tar", DATA)
    request.addfinalizer(lambda: fs.rm("/contract", recursive=True))
    return "memory://contract/obj.tar", "memory://contract/none.tar", SMALL


def collect(source, start, end, chunk_bytes):
    chunks = list(source.iter_range(start, end, chunk_bytes=chunk_bytes))
    assert all(0 < len(c) <= chunk_bytes for c in chunks)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("start", "end"), [(0, None), (0, len(DATA)), (1, 2), (12_345, 200_000), (299_000, None), (0, 0)]
)
def test_iter_range_yields_exact_bytes(stored, start, end):
    url, _, options = stored
    assert collect(open_source(url, options=options), start, end, 10_000) == DATA[start:end]


def test_read_all(stored):
    url, _, options = stored
    assert open_source(url, options=options).read_all() == DATA


def test_missing_object_names_it(stored):
    url, missing, options = stored
    if missing is None:
        pytest.skip("pipe: has no notion of a missing object")
    with pytest.raises(OSError) as info:
        open_source(missing, options=options).read_all()
    assert "none.tar" in str(info.value) or "none.tar" in str(getattr(info.value, "filename", ""))
    if "://" in missing and not missing.startswith("file://"):
        assert isinstance(info.value, RemoteError) and info.value.status == 404


#: (offset, size) ranges for read_at: one byte, the whole object, a middle, the
#: last bytes, nothing, and ranges longer than part_bytes (read in concurrent parts).
RANGES = [(0, 1), (0, len(DATA)), (12_345, 187_655), (len(DATA) - 7, 7), (5, 0), (100, 70_000)]


def test_read_at_returns_the_bytes_of_a_plain_read_of_the_range(stored):
    url, _, options = stored
    source = open_source(url, options=options)
    try:
        for offset, size in RANGES:
            got = source.read_at(offset, size)
            assert got == collect(source, offset, offset + size, 10_000) == DATA[offset : offset + size]
    finally:
        source.close()
    assert source.read_at(99, 2) == DATA[99:101], "a closed source opens again"
    source.close()


def test_read_at_past_the_end_is_an_error_naming_the_url_and_range(stored):
    url, _, options = stored
    source = open_source(url, options=options)
    for offset, size in [(len(DATA) - 10, 20), (len(DATA), 1), (len(DATA) + 100, 5)]:
        with pytest.raises(TruncatedShardError) as info:
            source.read_at(offset, size)
        message = str(info.value)
        assert message.startswith(f"{redact_url(url)}: bytes [{offset}, {offset + size}) asked for, but the object ends")
        assert "shardkit verify" in message
    with pytest.raises(UsageError, match=r"cannot read 5 bytes at offset -1: both must be >= 0"):
        source.read_at(-1, 5)
    source.close()


def test_read_at_outside_the_manifest_size_is_refused_before_any_request(stored, request):
    url, _, options = stored
    if url.startswith("pipe:"):
        pytest.skip("pipe: sources have no manifest size")
    source = open_source(url, options=options, expected_size=len(DATA))
    server = request.getfixturevalue("http_server") if "127.0.0.1" in url and not url.startswith("s3") else None
    asked = None if server is None else len(server.requests)
    end = len(DATA) + 1
    with pytest.raises(UsageError, match=rf"bytes \[{len(DATA) - 1}, {end}\) lie outside the object, which has {len(DATA)} bytes"):
        source.read_at(len(DATA) - 1, 2)
    assert server is None or len(server.requests) == asked
    assert source.read_at(len(DATA) - 1, 1) == DATA[-1:]
    source.close()


def test_read_all_refuses_an_object_longer_than_max_bytes(stored):
    url, _, options = stored
    source = open_source(url, options=options)
    with pytest.raises(CorruptShardError, match=rf"{redact_url(url)}: the object holds more than 1000 bytes"):
        source.read_all(max_bytes=1000)
    assert source.read_all(max_bytes=len(DATA)) == DATA


def test_empty_object(http_server, s3_bucket, tmp_path):
    import fsspec

    client, bucket = s3_bucket
    client.put_object(Bucket=bucket, Key="empty.tar", Body=b"")
    fsspec.filesystem("memory").pipe("/contract-empty/empty.tar", b"")
    (tmp_path / "empty.tar").write_bytes(b"")
    urls = [
        str(tmp_path / "empty.tar"),
        http_server.add("/empty.tar", b""),
        f"s3://{bucket}/empty.tar",
        "memory://contract-empty/empty.tar",
    ]
    for url in urls:
        source = open_source(url, options=SMALL)
        assert collect(source, 0, None, 1000) == b"", url
        assert source.read_all() == b"" == source.read_all(max_bytes=0) == source.read_at(0, 0), url
        with pytest.raises(TruncatedShardError, match=r"bytes \[0, 1\) asked for, but the object ends"):
            source.read_at(0, 1)
    fsspec.filesystem("memory").rm("/contract-empty", recursive=True)


# ------------------------------------------------------------- destinations
#
# One contract, every destination backend: a local folder (path and file://),
# s3:// (moto), memory:// (an fsspec object store: atomic puts) and local://
# through fsspec (a filesystem: temporary name, then a move).


@pytest.fixture(params=["path", "file", "s3", "memory", "fsspec-local"])
def destination(request, tmp_path):
    """``(destination, folder_url)`` of an empty dataset folder."""
    from shardkit.io.registry import open_destination

    kind = request.param
    folder = tmp_path / "dest"
    folder.mkdir()
    if kind == "path":
        url = str(folder)
    elif kind == "file":
        url = f"file://{folder}"
    elif kind == "s3":
        _, bucket = request.getfixturevalue("s3_bucket")
        url = f"s3://{bucket}/dest"
    elif kind == "memory":
        import fsspec

        memory = fsspec.filesystem("memory")
        request.addfinalizer(lambda: memory.exists("/dcontract") and memory.rm("/dcontract", recursive=True))
        url = "memory://dcontract/dest"
    else:
        url = f"local://{folder}"
    options = request.getfixturevalue("s3_options") if kind == "s3" else SMALL
    return open_destination(url, options=options), url, options


def test_destination_put_file_then_read_back(destination, tmp_path):
    dest, url, options = destination
    local = tmp_path / "shard.tar"
    local.write_bytes(DATA)
    assert not dest.exists("shard.tar")
    dest.put_file(str(local), "shard.tar")
    assert dest.exists("shard.tar")
    assert open_source(f"{url}/shard.tar", options=options).read_all() == DATA
    assert dest.object_url("shard.tar").endswith("/shard.tar")


def test_destination_put_bytes_replaces_whole(destination):
    dest, url, options = destination
    dest.put_bytes("manifest.json", b"first")
    dest.put_bytes("manifest.json", b"second, longer")
    assert open_source(f"{url}/manifest.json", options=options).read_all() == b"second, longer"


def test_destination_leaves_no_temporary_names(destination, tmp_path):
    dest, url, options = destination
    local = tmp_path / "a.idx"
    local.write_bytes(b"x" * 1000)
    dest.put_file(str(local), "a.idx")
    dest.put_bytes("b.json", b"{}")
    assert not dest.exists("a.idx.tmp") and not dest.exists("b.json.tmp")


def test_destination_refuses_a_missing_local_file(destination, tmp_path):
    dest, _, _ = destination
    with pytest.raises(FileNotFoundError):
        dest.put_file(str(tmp_path / "never-written.tar"), "x.tar")
    assert not dest.exists("x.tar")
