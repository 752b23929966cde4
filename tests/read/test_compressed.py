"""Shards compressed whole (.tar.gz, .tgz, .tar.zst): read, dealt whole, faults."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile

import pytest
import torch
import zstandard

from shardkit import CorruptShardError, ShardDataset, UsageError
from shardkit.cli import main
from shardkit.format.compression import compress
from tests.conftest import build_dataset

NUM_SHARDS = 4
PER_SHARD = 20


def _samples(dataset) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for sample in dataset:
        key = sample["__key__"]
        assert key not in out, f"sample {key} read twice"
        out[key] = {k: bytes(v) for k, v in sample.items() if not k.startswith("__")}
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A plain dataset, and what its samples hold."""
    root = tmp_path_factory.mktemp("plain")
    manifest = build_dataset(str(root / "ds"), [PER_SHARD] * NUM_SHARDS, payload_bytes=20_000)
    paths = [manifest.resolve(s.path) for s in manifest.shards]
    return paths, _samples(ShardDataset(paths, mode="exact", shuffle=False))


def _members(path: str) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _gnu_tar(src: str, dest: str, flag: str) -> None:
    """Repack ``src`` with GNU tar (its own headers), members in the same order."""
    work = dest + ".d"
    os.makedirs(work)
    members = _members(src)
    for name, data in members:
        with open(os.path.join(work, name), "wb") as f:
            f.write(data)
    subprocess.run(["tar", flag, "-cf", dest, "-C", work, *[n for n, _ in members]], check=True)
    shutil.rmtree(work)


def _python_tar(src: str, dest: str, kind: str) -> None:
    """Repack ``src`` with Python's tarfile, compressed by gzip or zstandard."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in _members(src):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    if kind == "gzip":
        with tarfile.open(dest, mode="w:gz") as tar:  # tarfile's own gzip writer
            for name, data in _members(src):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    else:
        with open(dest, "wb") as f:
            f.write(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw))


def _has_tar_zstd() -> bool:
    if shutil.which("tar") is None or shutil.which("zstd") is None:
        return False
    return subprocess.run(["tar", "--zstd", "--help"], capture_output=True).returncode == 0


WRITERS = {
    "gnu-tar-gzip": lambda s, d: _gnu_tar(s, d, "-z"),
    "gnu-tar-zstd": lambda s, d: _gnu_tar(s, d, "--zstd"),
    "python-tarfile-gzip": lambda s, d: _python_tar(s, d, "gzip"),
    "python-zstandard": lambda s, d: _python_tar(s, d, "zstd"),
    "gzip-of-our-shard": lambda s, d: open(d, "wb").write(compress(open(s, "rb").read(), "gzip")),
}
SUFFIX = {"gzip": ".tar.gz", "zstd": ".tar.zst"}


def _compressed(tmp_path, plain_paths, writer: str, *, suffix: str | None = None) -> list[str]:
    if writer.startswith("gnu-tar") and shutil.which("tar") is None:
        pytest.skip("no tar")
    if writer == "gnu-tar-zstd" and not _has_tar_zstd():
        pytest.skip("this tar has no --zstd")
    suffix = suffix or (".tar.zst" if "zst" in writer else ".tgz" if writer.endswith("gzip") else ".tar.gz")
    out = []
    for i, src in enumerate(plain_paths):
        dest = str(tmp_path / f"c-{i:03d}{suffix}")
        WRITERS[writer](src, dest)
        out.append(dest)
    return out


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_compressed_shards_read_back_exactly(tmp_path, plain, writer):
    paths, expected = plain
    shards = _compressed(tmp_path, paths, writer)
    assert _samples(ShardDataset(shards, mode="exact", shuffle=False)) == expected


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_compression_is_detected_by_magic_not_name(tmp_path, plain, kind):
    paths, expected = plain
    writer = "gzip-of-our-shard" if kind == "gzip" else "python-zstandard"
    shards = _compressed(tmp_path, paths, writer, suffix=".tar")
    # Even next to .idx sidecars (which describe the plain shards) they are read whole.
    for plain_path, shard in zip(paths, shards):
        shutil.copy(plain_path[: -len(".tar")] + ".idx", shard[: -len(".tar")] + ".idx")
    dataset = ShardDataset(shards, mode="exact", shuffle=False)
    assert dataset.catalog.compressed and dataset.catalog.counts is None
    assert _samples(dataset) == expected


def _truncated(tmp_path, plain_paths, kind: str) -> tuple[str, int]:
    writer = "gzip-of-our-shard" if kind == "gzip" else "python-zstandard"
    shard = _compressed(tmp_path, plain_paths[:1], writer)[0]
    data = open(shard, "rb").read()
    cut = len(data) * 2 // 3
    with open(shard, "wb") as f:
        f.write(data[:cut])
    return shard, cut


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_truncated_compressed_shard_raises_naming_shard_and_compressed_offset(tmp_path, plain, kind):
    paths, _ = plain
    shard, cut = _truncated(tmp_path, paths, kind)
    with pytest.raises(CorruptShardError, match=f"{shard}: {kind}-compressed shard is truncated") as info:
        list(ShardDataset([shard], mode="exact"))
    assert info.value.path == shard
    assert info.value.offset == cut
    assert f"compressed byte {cut}" in str(info.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_truncated_compressed_shard_never_yields_a_partial_sample(tmp_path, plain, kind):
    paths, expected = plain
    shard, _ = _truncated(tmp_path, paths, kind)
    dataset = ShardDataset([shard], mode="exact", shuffle=False, on_error="skip")
    got = _samples(dataset)
    assert 0 < len(got) < PER_SHARD
    assert all(got[key] == expected[key] for key in got)  # every sample whole
    assert dataset.num_skipped == 1


@pytest.mark.timeout(30)
def test_corrupt_compressed_shard_raises(tmp_path, plain):
    paths, _ = plain
    shard = _compressed(tmp_path, paths[:1], "gzip-of-our-shard")[0]
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(range(64))
    open(shard, "wb").write(bytes(data))
    with pytest.raises(CorruptShardError, match=f"{shard}: ") as info:
        list(ShardDataset([shard], mode="exact"))
    assert info.value.path == shard


def test_compressed_shards_are_dealt_whole_to_dataloader_workers(tmp_path, plain):
    paths, expected = plain
    shards = _compressed(tmp_path, paths, "python-zstandard")
    dataset = ShardDataset(shards, mode="exact", seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert _samples(loader) == expected


def test_compressed_shards_are_dealt_whole_over_ranks(tmp_path, plain):
    paths, expected = plain
    shards = _compressed(tmp_path, paths, "gzip-of-our-shard")
    seen: dict[str, dict[str, bytes]] = {}
    for rank in range(3):
        part = _samples(ShardDataset(shards, mode="exact", seed=1, rank=rank, world_size=3))
        assert not set(part) & set(seen), "a sample read by two ranks"
        assert len(part) % PER_SHARD == 0  # whole shards only
        seen.update(part)
    assert seen == expected


def test_reshard_from_compressed_shards_gives_the_same_samples(tmp_path, plain):
    paths, expected = plain
    src = tmp_path / "src"
    src.mkdir()
    for shard in _compressed(tmp_path, paths, "gnu-tar-gzip", suffix=".tar.gz"):
        shutil.move(shard, src / os.path.basename(shard))
    assert main(["write", str(src), str(tmp_path / "out"), "--max-samples", "7", "--workers", "2", "-q"]) == 0
    dataset = ShardDataset(str(tmp_path / "out"), mode="exact")
    assert len(dataset) == NUM_SHARDS * PER_SHARD
    assert _samples(dataset) == expected


def test_balanced_mode_on_compressed_shards_says_why_and_what_to_do(tmp_path):
    path = str(tmp_path / "a.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        data = b"x" * 10
        info = tarfile.TarInfo("k0.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UsageError, match=r"compressed shards .* shard granularity.*shardkit write"):
        ShardDataset([path], mode="balanced")
