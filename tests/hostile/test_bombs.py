"""Data that inflates: compressed whole shards far larger than memory, member
decompression bombs and image bombs, each read by the entry points in a
child process under a memory cap (see :mod:`tests.hostile.entry`).

Every shard here is built in a few seconds from zeros: compressed streams
of zeros are tiny, which is what makes them bombs.
"""

from __future__ import annotations

import io
import json
import tarfile
import zlib

import numpy as np
import pytest
import zstandard
from PIL import Image

import shardkit
from shardkit import ShardWriter
from shardkit.errors import MemberTooLargeError
from shardkit.format.manifest import MANIFEST_NAME
from tests.hostile.conftest import run_entry

MIB = 1 << 20
#: A whole-shard stream: this many one-MiB members of zeros (2 GiB), read
#: under a cap of CAP_MB above the interpreter's baseline.
BIG_MEMBERS = 2048
CAP_MB = 1024
#: A member bomb: 5 GiB of zeros, compressed.
BOMB_BYTES = 5 << 30


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _big_shard(path: str, kind: str, *, members: int, member_bytes: int = MIB) -> str:
    """A tar of ``members`` members of zeros, compressed whole as it is
    written (never held in memory)."""
    zeros = bytes(member_bytes)
    pad = bytes(-member_bytes % 512)
    if kind == "gzip":
        comp = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    else:
        comp = zstandard.ZstdCompressor(level=1).compressobj()
    with open(path, "wb") as f:
        for i in range(members):
            f.write(comp.compress(_tar_header(f"s{i:06d}.bin", member_bytes) + zeros + pad))
        f.write(comp.compress(bytes(1024)))
        f.write(comp.flush())
    return path


def _bomb(kind: str) -> bytes:
    """5 GiB of zeros as a valid gzip (concatenated members, 5 MB: deflate
    stops near 1000:1) or zstandard (concatenated frames, ~160 KB) payload."""
    piece = 64 * MIB
    one = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if kind == "gzip" else None
    if one is not None:
        frame = one.compress(bytes(piece)) + one.flush()
    else:
        frame = zstandard.ZstdCompressor(level=19).compress(bytes(piece))
    return frame * (BOMB_BYTES // piece)


def _png_bomb() -> bytes:
    """A 20000 x 20000 1-bit PNG of a few tens of KB (400 megapixels)."""
    buf = io.BytesIO()
    Image.new("1", (20000, 20000)).save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def _jpeg_bomb() -> bytes:
    """A small JPEG whose frame header claims 60000 x 60000 pixels."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(buf, format="JPEG")
    data = bytearray(buf.getvalue())
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2
    return bytes(data)


def _tiny_png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    return {kind: _big_shard(str(root / f"big.tar.{ext}"), kind, members=BIG_MEMBERS) for kind, ext in
            (("gzip", "gz"), ("zstd", "zst"))}


@pytest.fixture(scope="module")
def half_big(tmp_path_factory):
    """1 GiB in a .tar.gz, for resharding (which writes it out twice)."""
    return _big_shard(str(tmp_path_factory.mktemp("half") / "big.tar.gz"), "gzip", members=BIG_MEMBERS // 2)


def _dataset(root, bad: dict[str, bytes], *, member_compression: str | None = None) -> str:
    """A shardkit dataset of three samples; the middle one holds ``bad``."""
    with ShardWriter(str(root)) as writer:
        writer.write({"__key__": "k0", "txt.gz": _gz(b"good 0"), "png": _tiny_png(), "cls": 0})
        writer.write({"__key__": "k1", **bad, "cls": 1})
        writer.write({"__key__": "k2", "txt.gz": _gz(b"good 2"), "png": _tiny_png(), "cls": 2})
    if member_compression is not None:
        manifest = json.loads((root / MANIFEST_NAME).read_text())
        manifest["member_compression"] = member_compression
        (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    return str(root)


def _gz(data: bytes) -> bytes:
    comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return comp.compress(data) + comp.flush()


@pytest.fixture(scope="module")
def baseline_mb(tmp_path_factory) -> float:
    """Peak RSS of a child reading a tiny dataset: the interpreter, torch
    and the reader, which the caps and the bounds below come on top of."""
    root = _dataset(tmp_path_factory.mktemp("plain") / "ds", {"txt.gz": _gz(b"fine"), "png": _tiny_png()})
    got = run_entry("stream", root, options={"decode": "tensor"})
    assert got.outcome == "ok" and len(got.samples) == 3, got.message
    return got.peak_rss_mb


@pytest.fixture(scope="module")
def member_bombs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bombs")
    return {
        "gzip": _dataset(root / "gz", {"txt.gz": _bomb("gzip"), "png": _tiny_png()}, member_compression="gzip"),
        "zstd": _dataset(root / "zst", {"json.zst": _bomb("zstd"), "png": _tiny_png()}, member_compression="zstd"),
    }


@pytest.fixture(scope="module")
def image_bombs(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    png = _dataset(root / "png", {"txt.gz": _gz(b"bad"), "png": _png_bomb()})
    jpg = _dataset(root / "jpg", {"txt.gz": _gz(b"bad"), "png": _jpeg_bomb()})
    return {"png": png, "jpg": jpg}


# ------------------------------------------------------- whole shards


# Each kind once, each entry once (a run inflates 2 GiB: ~11 s).
@pytest.mark.parametrize(("entry", "kind"), [("stream", "gzip"), ("loader", "zstd")])
def test_compressed_shard_far_larger_than_memory_streams_every_sample(big, kind, entry, baseline_mb):
    got = run_entry(entry, big[kind], mem_mb=CAP_MB, timeout_s=120)
    assert got.outcome == "ok", got.message or got.child_output[-2000:]
    assert len(got.samples) == BIG_MEMBERS
    assert got.keys == [f"s{i:06d}" for i in range(BIG_MEMBERS)]
    assert got.peak_rss_mb < baseline_mb + 200  # flat: nowhere near the 2 GiB it inflates to


def test_compressed_shard_larger_than_memory_reshards(half_big, tmp_path, baseline_mb):
    dest = tmp_path / "out"
    got = run_entry("write", half_big, mem_mb=CAP_MB // 2, timeout_s=180, options={"dest": str(dest)})
    assert got.outcome == "ok" and got.exit_code == 0, got.stderr or got.message
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert manifest["num_samples"] == BIG_MEMBERS // 2
    assert got.peak_rss_mb < baseline_mb + 400


def test_running_out_of_memory_is_not_reported_as_corruption(tmp_path):
    """One 768 MiB member must be held whole by the tar parser: under a 256
    MB cap that fails, and says so (a MemoryError), even under skip: it is
    not a fault of the data, and is not skipped as one."""
    shard = _big_shard(str(tmp_path / "one.tar.zst"), "zstd", members=1, member_bytes=768 * MIB)
    got = run_entry("stream", shard, mem_mb=256, on_error="skip", timeout_s=60)
    assert got.outcome == "foreign" and got.error_type == "MemoryError", (got.error_type, got.message)
    assert "corrupt" not in got.message.lower() and got.skipped == 0


# ------------------------------------------------------- member bombs


@pytest.mark.parametrize(("entry", "kind"), [("stream", "gzip"), ("loader", "gzip"), ("indexed", "zstd")])
def test_member_bomb_is_refused_naming_shard_member_and_limit(member_bombs, kind, entry, baseline_mb):
    member = "k1.txt.gz" if kind == "gzip" else "k1.json.zst"
    got = run_entry(entry, member_bombs[kind], mem_mb=CAP_MB, options={"decode": "pil"})
    assert got.outcome == "error" and got.error_type == "MemberTooLargeError", got.message or got.child_output[-2000:]
    assert f"member '{member}'" in got.message
    assert "shard-" in got.message and "max_member_bytes=268435456" in got.message
    assert got.peak_rss_mb < baseline_mb + 600  # the 256 MiB limit, twice, not 5 GiB


@pytest.mark.parametrize(("entry", "kind"), [("stream", "zstd"), ("indexed", "gzip")])
def test_member_bomb_is_skipped_under_skip(member_bombs, kind, entry, baseline_mb):
    got = run_entry(entry, member_bombs[kind], mem_mb=CAP_MB, on_error="skip", options={"decode": "tensor"})
    assert got.outcome == "ok", got.message or got.child_output[-2000:]
    assert got.keys == ["k0", "k2"]
    assert got.skipped == 1
    assert got.peak_rss_mb < baseline_mb + 600


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_verify_streams_members_and_names_the_bomb(member_bombs, kind, baseline_mb):
    member = "k1.txt.gz" if kind == "gzip" else "k1.json.zst"
    got = run_entry("verify", member_bombs[kind], mem_mb=512)
    assert got.outcome == "ok" and got.exit_code == 1, got.stderr or got.message
    assert f"member '{member}'" in got.stderr and "max_member_bytes=268435456" in got.stderr
    assert got.peak_rss_mb < baseline_mb + 100  # streamed: no member held whole


# ------------------------------------------------------- image bombs


@pytest.mark.parametrize(
    ("image", "options"),
    [
        ("png", {"decode": "pil"}),
        ("png", {"decode": "tensor"}),  # torchvision's decoder
        ("jpg", {"fused": "random_resized_crop"}),  # simplejpeg's header
        ("png", {"fused": "resize_center_crop"}),  # PIL's lazy open
    ],
    ids=["pil", "tensor", "fused-train-jpeg", "fused-eval-png"],
)
def test_image_bomb_is_refused_from_its_header(image_bombs, options, image, baseline_mb):
    got = run_entry("stream", image_bombs[image], mem_mb=CAP_MB, options=options)
    assert got.outcome == "error" and got.error_type == "ImageTooLargeError", got.message or got.child_output[-2000:]
    pixels = "400,000,000" if image == "png" else "3,600,000,000"
    assert "member 'k1.png'" in got.message and pixels in got.message
    assert "max_image_pixels=89478485" in got.message and "shard-" in got.message
    assert got.peak_rss_mb < baseline_mb + 100  # refused from the header: no pixel allocated


@pytest.mark.parametrize(
    ("entry", "options"), [("loader", {"decode": "tensor"}), ("indexed", {"fused": "random_resized_crop"})]
)
def test_image_bomb_is_skipped_under_skip(image_bombs, entry, options):
    got = run_entry(entry, image_bombs["png"], mem_mb=CAP_MB, on_error="skip", options=options)
    assert got.outcome == "ok", got.message or got.child_output[-2000:]
    assert got.keys == ["k0", "k2"] and got.skipped == 1


# ------------------------------------------------------- arrays that inflate or lie


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def _npy_claiming(shape: tuple[int, ...]) -> bytes:
    """A valid npy header claiming ``shape`` of float64, followed by 64 bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue() + bytes(64)


def test_an_npz_bomb_is_refused_from_its_stated_sizes_naming_member_and_limit(tmp_path):
    bomb = _npz(a=np.zeros(8 << 20, dtype=np.uint8))  # 8 MiB of zeros in ~8 KB
    assert len(bomb) < 64 << 10
    decoder = shardkit.Decoder(max_member_bytes=1 << 20)
    with pytest.raises(MemberTooLargeError) as caught:
        decoder({"__key__": "k1", "npz": bomb}, path="s.tar")
    message = str(caught.value)
    assert "member 'k1.npz'" in message and "max_member_bytes=1048576" in message and "s.tar" in message
    # Under the limit it decodes as numpy.load does.
    small = decoder({"__key__": "k2", "npz": _npz(a=np.arange(5), b=np.ones((2, 2)))})["npz"]
    assert sorted(small) == ["a", "b"] and small["a"].tolist() == [0, 1, 2, 3, 4] and small["b"].shape == (2, 2)
    # A reader skips the sample under skip, keeping the others.
    root = tmp_path / "ds"
    with ShardWriter(str(root)) as writer:
        for i, data in enumerate([_npz(a=np.arange(3)), bomb, _npz(a=np.arange(4))]):
            writer.write({"__key__": f"k{i}", "npz": data})
    stream = shardkit.ShardDataset(str(root), shuffle=False, decode=decoder, on_error="skip")
    assert [s["__key__"] for s in stream] == ["k0", "k2"] and stream.num_skipped == 1
    indexed = shardkit.IndexedDataset(str(root), decode=decoder, on_error="skip")
    assert [s and s["__key__"] for s in map(indexed.__getitem__, range(3))] == ["k0", None, "k2"]
    assert indexed.num_skipped == 1


@pytest.mark.parametrize("shape", [(1 << 40,), (1 << 27,), (3, 5)], ids=["8TiB", "1GiB", "120B"])
def test_an_npy_header_claiming_more_than_follows_is_refused_before_allocating(shape):
    decoder = shardkit.Decoder()
    with pytest.raises(ValueError, match="but only 64 bytes follow") as caught:
        decoder({"__key__": "k1", "npy": _npy_claiming(shape)})
    assert not isinstance(caught.value, MemoryError)
    assert decoder({"__key__": "k3", "npy": _npy_claiming((8,))})["npy"].tolist() == [0.0] * 8


def _with_broken_text_chunk(image: Image.Image, fmt: str = "PNG") -> bytes:
    """A PNG whose ``tEXt`` chunk has a bad CRC: PIL will not open it,
    libpng (torchvision's decoder) warns and decodes it anyway."""
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "x")
    buf = io.BytesIO()
    image.save(buf, format=fmt, pnginfo=info)
    data = bytearray(buf.getvalue())
    at = data.find(b"tEXt")
    crc = at + 4 + int.from_bytes(data[at - 4 : at], "big")
    data[crc : crc + 4] = bytes(4)
    return bytes(data)


def test_tensor_decoding_checks_pixels_where_pil_cannot_read_the_header():
    from shardkit.errors import ImageTooLargeError

    damaged = _with_broken_text_chunk(Image.new("L", (100, 80)))
    with pytest.raises(ImageTooLargeError, match="100 x 80 = 8,000 pixels") as caught:
        shardkit.Decoder(image="tensor", max_image_pixels=1000)({"__key__": "k1", "png": damaged}, path="s.tar")
    assert "member 'k1.png'" in str(caught.value) and "max_image_pixels=1000" in str(caught.value)
    # Under the limit torchvision still decodes it, as before.
    assert tuple(shardkit.Decoder(image="tensor")({"__key__": "k2", "png": damaged})["png"].shape) == (1, 80, 100)


def test_image_size_is_read_from_png_and_jpeg_bytes_without_pil():
    from shardkit.read.decoders.images import header_size

    # The frame header of a JPEG comes after other segments (JFIF, tables).
    assert header_size(_tiny_png()) == (8, 8) and header_size(_jpeg_bomb()) == (60000, 60000)
    assert header_size(b"\xff\xd8" + b"\xff\xe0\x00\x01" * 3) is None and header_size(b"GIF89a") is None
