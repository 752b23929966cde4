"""The one index loader: every reader sees the same error for the same damaged
index, locally and over HTTP, and a remote index longer than its sample count
allows is refused before it is read whole."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardkit
from shardkit.errors import CorruptShardError, VerifyError
from shardkit.format.index import encode_index, load_offset_index, max_index_bytes
from shardkit.io.base import SourceOptions
from shardkit.io.index import fetch_offset_index
from shardkit.io.manifest import fetch_manifest
from shardkit.verify import verify_dataset
from tests.remote.conftest import serve_dataset  # noqa: F401 - a fixture (http_server is in tests/conftest.py)
from tests.remote.remote_servers import fast_options

SAMPLES = 6


def _fewer_samples(data: bytes, bounds: np.ndarray, checksums: np.ndarray) -> bytes:
    return encode_index(bounds[:-1], checksums[:-1])


def _truncated(data: bytes, bounds: np.ndarray, checksums: np.ndarray) -> bytes:
    return encode_index(bounds)[:-20]


def _not_rising(data: bytes, bounds: np.ndarray, checksums: np.ndarray) -> bytes:
    swapped = bounds.copy()
    swapped[2], swapped[3] = bounds[3], bounds[2]
    return encode_index(swapped, checksums)


#: A damaged index -> what the error must say.
FAULTS = {
    "wrong sample count": (_fewer_samples, f"it lists {SAMPLES - 1} samples but the manifest says {SAMPLES}"),
    "truncated": (_truncated, "data shorter than its header says|file shorter than its header says"),
    "not rising": (_not_rising, r"boundaries do not rise \(entry 3\)"),
}


def _stream(location: str, options: SourceOptions) -> None:
    list(shardkit.ShardDataset(location, mode="exact", source_options=options))


def _indexed(location: str, options: SourceOptions) -> None:
    shardkit.IndexedDataset(location, source_options=options)[0]


def _verify(location: str, options: SourceOptions) -> None:
    try:
        verify_dataset(location, options=options)
    except VerifyError as exc:  # verify reports every fault as its own error, the index's as its cause
        assert "offset index unusable" in str(exc)
        raise exc.__cause__ from None


def _ray(location: str, options: SourceOptions) -> None:
    datasource = pytest.importorskip("shardkit.ray.datasource")
    manifest = fetch_manifest(location, options=options)
    for r in datasource.plan_ranges(manifest, 1, options=options):
        list(datasource.read_range(r, tuple(manifest.extensions), options, 1 << 20))


READERS = {"stream": _stream, "IndexedDataset": _indexed, "verify": _verify, "ray datasource": _ray}


@pytest.mark.parametrize("storage", ["local", "http"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_reader_raises_the_same_error_for_the_same_index_fault(make_shards, serve_dataset, storage, fault):
    manifest = make_shards([SAMPLES])
    index_path = manifest.resolve(manifest.shards[0].index)
    original = load_offset_index(index_path)
    bounds, checksums = np.array(original.bounds), np.array(original.checksums)
    del original  # the file is rewritten below: no mapping of it may be read after
    damage, why = FAULTS[fault]
    with open(index_path, "rb") as f:
        data = f.read()
    with open(index_path, "wb") as f:
        f.write(damage(data, bounds, checksums))
    if storage == "local":
        location, options, index = manifest.location, SourceOptions(), index_path
    else:
        location, options = serve_dataset(manifest) + "/", fast_options()
        index = location + manifest.shards[0].index
    errors = {}
    for name, read in READERS.items():
        with pytest.raises(CorruptShardError, match=f"offset index is corrupt: ({why})") as info:
            read(location, options)
        errors[name] = (type(info.value), str(info.value), info.value.path)
    assert len(set(errors.values())) == 1, errors
    kind, message, path = errors["stream"]
    assert kind is CorruptShardError and path == index
    assert message.startswith(f"{index}: offset index is corrupt: ")
    assert message.endswith("Run `shardkit verify` on the dataset and rewrite the shards it names with `shardkit write`.")


def test_a_remote_index_longer_than_its_sample_count_allows_is_refused_unread(http_server, monkeypatch):
    from shardkit.io import http

    bounds = np.arange(0, 512 * (SAMPLES + 1), 512)
    cap = max_index_bytes(SAMPLES)
    url = http_server.add("/big.idx", encode_index(bounds) + os.urandom(16 << 20))
    received = []
    real_read = http._HttpResponse.read

    def counting_read(self, amt):
        data = real_read(self, amt)
        received.append(len(data))
        return data

    monkeypatch.setattr(http._HttpResponse, "read", counting_read)
    with pytest.raises(CorruptShardError, match=f"big.idx: offset index is corrupt: it holds more than {cap} bytes"):
        fetch_offset_index(url, num_samples=SAMPLES, options=fast_options())
    assert sum(received) == 0, "refused on the size the answer states, before reading its body"
    assert len(http_server.gets("/big.idx")) == 1, "and not asked again"
    http_server.add("/ok.idx", encode_index(bounds))
    assert fetch_offset_index(http_server.base_url + "/ok.idx", num_samples=SAMPLES).bounds.tolist() == bounds.tolist()


def test_an_fsspec_index_longer_than_allowed_is_refused_before_it_is_fetched(tmp_path):
    import fsspec

    bounds = np.arange(0, 512 * (SAMPLES + 1), 512)
    memory = fsspec.filesystem("memory")
    memory.pipe("/idxcap/big.idx", encode_index(bounds) + bytes(64 << 20))
    fetched = []
    real = type(memory).cat_file

    def spy(self, path, start=None, end=None, **kwargs):
        fetched.append((start, end))
        return real(self, path, start=start, end=end, **kwargs)

    try:
        type(memory).cat_file = spy
        options = SourceOptions(part_bytes=1 << 20)
        with pytest.raises(CorruptShardError, match="offset index is corrupt: it holds more than"):
            fetch_offset_index("memory://idxcap/big.idx", num_samples=SAMPLES, options=options)
    finally:
        type(memory).cat_file = real
        memory.rm("/idxcap", recursive=True)
    assert fetched == [], "refused on the size the filesystem states, before any byte is fetched"


def test_a_local_index_longer_than_allowed_is_refused(tmp_path):
    path = tmp_path / "big.idx"
    path.write_bytes(encode_index(np.arange(0, 512 * (SAMPLES + 1), 512)) + bytes(1 << 20))
    with pytest.raises(CorruptShardError, match=f"{path}: offset index is corrupt: it holds more than"):
        fetch_offset_index(str(path), num_samples=SAMPLES)


def test_a_missing_local_index_is_the_same_error(tmp_path):
    path = tmp_path / "none.idx"
    with pytest.raises(CorruptShardError, match=f"{path}: offset index is corrupt: the file is missing"):
        fetch_offset_index(str(path), num_samples=3)
