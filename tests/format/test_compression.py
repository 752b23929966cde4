"""Gzip/zstandard detection, reproducible compression and the push decompressor."""

from __future__ import annotations

import gzip
import shutil
import subprocess

import pytest

from shardkit import CorruptShardError
from shardkit.format.compression import (
    COMPRESSIONS,
    ChunkDecompressor,
    compress,
    compressed_extension,
    compression_from_name,
    decompress,
    detect_compression,
    member_compression,
    should_compress,
)

PAYLOAD = b"".join(f"line {i} of a compressible text member\n".encode() for i in range(3000))


@pytest.mark.parametrize("kind", COMPRESSIONS)
def test_compress_is_reproducible_and_round_trips(kind):
    data = compress(PAYLOAD, kind)
    assert data == compress(PAYLOAD, kind)
    assert len(data) < len(PAYLOAD) // 5
    assert detect_compression(data) == kind
    assert decompress(data, kind) == PAYLOAD


def test_gzip_member_has_no_timestamp():
    data = compress(PAYLOAD, "gzip")
    assert data[4:8] == bytes(4)  # MTIME field
    assert gzip.decompress(data) == PAYLOAD


def test_detection_is_by_magic_bytes():
    assert detect_compression(b"\x1f\x8b\x08\x00") == "gzip"
    assert detect_compression(b"\x28\xb5\x2f\xfd") == "zstd"
    assert detect_compression(b"k1.txt\x00\x00") is None
    assert detect_compression(b"") is None
    assert compression_from_name("a/shard-0.tar.gz") == "gzip"
    assert compression_from_name("https://h/x.tgz?sig=1") == "gzip"
    assert compression_from_name("x.tar.zst") == "zstd"
    assert compression_from_name("x.tar") is None


def test_member_suffixes_and_what_gets_compressed():
    assert member_compression("txt.gz") == ("txt", "gzip")
    assert member_compression("seg.npy.zst") == ("seg.npy", "zstd")
    assert member_compression("jpg") == ("jpg", None)
    assert member_compression("gz") == ("gz", None)
    for ext in ("txt", "json", "npy", "csv", "xml"):
        assert should_compress(ext)
    for ext in ("jpg", "png", "webp", "mp4", "cls", "txt.gz", "flac"):
        assert not should_compress(ext)
    assert compressed_extension("txt", "zstd") == "txt.zst"
    assert compressed_extension("jpg", "zstd") == "jpg"
    assert compressed_extension("txt", None) == "txt"


@pytest.mark.parametrize("kind", COMPRESSIONS)
def test_stream_follows_concatenated_frames_fed_in_small_pieces(kind):
    data = compress(PAYLOAD, kind) + compress(b"second frame", kind)
    stream = ChunkDecompressor(kind, path="s.tar")
    out = b"".join(stream.feed(data[i : i + 333]) for i in range(0, len(data), 333))
    stream.finish()
    assert out == PAYLOAD + b"second frame"


@pytest.mark.parametrize("kind", COMPRESSIONS)
def test_truncated_stream_names_the_compressed_offset(kind):
    data = compress(PAYLOAD, kind)
    stream = ChunkDecompressor(kind, path="s.tar.x")
    stream.feed(data[:-10])
    with pytest.raises(CorruptShardError, match=f"s.tar.x: {kind}-compressed shard is truncated") as info:
        stream.finish()
    assert info.value.offset == len(data) - 10
    assert info.value.path == "s.tar.x"


def test_corrupt_gzip_stream_is_a_corrupt_shard_error():
    data = bytearray(compress(PAYLOAD, "gzip"))
    data[40:60] = bytes(range(100, 120))
    stream = ChunkDecompressor("gzip", path="s.tgz")
    with pytest.raises(CorruptShardError, match=r"s.tgz: gzip-compressed shard is corrupt .* compressed bytes 0\.\."):
        stream.feed(bytes(data))
        stream.finish()


@pytest.mark.skipif(shutil.which("gzip") is None, reason="no gzip")
def test_gzip_cli_output_with_trailing_zero_padding_is_accepted(tmp_path):
    path = tmp_path / "a"
    path.write_bytes(PAYLOAD)
    data = subprocess.run(["gzip", "-c", str(path)], capture_output=True, check=True).stdout
    stream = ChunkDecompressor("gzip", path="a.gz")
    out = stream.feed(data + bytes(100))
    stream.finish()
    assert out == PAYLOAD


@pytest.mark.parametrize("kind", COMPRESSIONS)
def test_stream_output_is_bounded_per_piece_whatever_the_ratio(kind):
    data = compress(bytes(64 << 20), kind)  # ~1000:1 (gzip) to ~30000:1 (zstd)
    stream = ChunkDecompressor(kind, path="zeros.tar", max_output_bytes=1 << 20)
    sizes = [len(piece) for piece in stream.pieces(data)]
    stream.finish()
    assert sum(sizes) == 64 << 20
    assert max(sizes) <= 1 << 20


@pytest.mark.parametrize("kind", COMPRESSIONS)
def test_decompress_refuses_past_max_bytes(kind):
    from shardkit import MemberTooLargeError

    data = compress(bytes(8 << 20), kind)
    assert decompress(data, kind, max_bytes=8 << 20) == bytes(8 << 20)
    with pytest.raises(MemberTooLargeError, match=r"more than 1,048,576 bytes.*max_member_bytes=1048576") as info:
        decompress(data, kind, max_bytes=1 << 20)
    assert info.value.limit == 1 << 20 and isinstance(info.value, CorruptShardError)


def test_zstd_block_claiming_more_than_a_block_is_corrupt():
    data = bytearray(compress(PAYLOAD, "zstd"))
    d = data[4]  # the frame header descriptor: what follows it, up to the first block
    single = (d >> 5) & 1
    header = 5 + (1 - single) + (0, 1, 2, 4)[d & 3] + (single, 2, 4, 8)[d >> 6]
    data[header : header + 3] = ((200_000 << 3) | (2 << 1)).to_bytes(3, "little")
    with pytest.raises(CorruptShardError, match="claims 200000 bytes"):
        ChunkDecompressor("zstd", path="s.tar.zst").feed(bytes(data))
