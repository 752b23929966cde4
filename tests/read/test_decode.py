"""Decoder: the extension table, compressed members, unsafe types, errors.

webdataset parity on webdataset-written shards is in test_decode_parity.py;
these tests cover what webdataset does not write or decode, and the rules.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit import ShardDataset, ShardWriter
from shardkit.errors import UsageError
from shardkit.format.compression import compress
from shardkit.read.decode import Decoder, make_decoder
from shardkit.read.decoders.arrays import decode_tenbin

pytestmark = pytest.mark.filterwarnings(
    "ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning"
)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def _image_bytes(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def _tenbin(arrays: list[np.ndarray], codes: list[str]) -> bytes:
    """tenbin bytes written by hand: magic, int64 length, payload padded to 64."""

    def chunk(payload: bytes) -> bytes:
        return b"~TenBin~" + struct.pack("<q", len(payload)) + payload + b"\0" * (-len(payload) % 64)

    def text(s: str) -> int:
        return struct.unpack("<q", s.encode().ljust(8, b"\0"))[0]

    out = b""
    for array, code in zip(arrays, codes):
        header = np.array([text(code), text("info"), array.ndim, *array.shape], dtype="<i8").tobytes()
        out += chunk(header) + chunk(np.ascontiguousarray(array).tobytes())
    return out


def test_unknown_extensions_stay_bytes():
    sample = {"__key__": "k", "bin": b"\x00\x01", "html": b"<p>", "foo.bar": b"x", "mp4": b"\x00\x00", "h5": b"\x89HDF"}
    assert Decoder()(dict(sample)) == sample


def test_extensions_match_by_last_component_and_ignore_case():
    decoded = Decoder()({"__key__": "k", "seg.cls": b"3", "input.TXT": b"hi", "JSON": b"[1]", "txt.extra": b"x"})
    assert decoded == {"__key__": "k", "seg.cls": 3, "input.TXT": "hi", "JSON": [1], "txt.extra": b"x"}


def test_label_extensions_beyond_webdatasets_decoder_are_ints():
    # webdataset's writer encodes class / count as text but its decoder leaves
    # them bytes; shardkit reads them (and its own `label`) as ints.
    decoded = Decoder()({"class": b"4", "count": b" 12\n", "label": b"-1"})
    assert decoded == {"class": 4, "count": 12, "label": -1}


def test_msgpack_and_tenbin_aliases():
    import msgpack

    packed = msgpack.packb({"a": [1, 2]})
    decoded = Decoder()({"mp": packed, "msg": packed, "msgpack": packed})
    assert decoded == {"mp": {"a": [1, 2]}, "msg": {"a": [1, 2]}, "msgpack": {"a": [1, 2]}}
    buffer = _tenbin([np.arange(3, dtype=np.float32)], ["f4"])
    for ext in ("ten", "tb", "tenbin"):
        (array,) = Decoder()({ext: buffer})[ext]
        assert array.tolist() == [0.0, 1.0, 2.0] and array.dtype == np.float32


def test_tenbin_reads_every_dtype_and_refuses_malformed_buffers():
    arrays = [np.arange(6, dtype=np.uint32).reshape(2, 3), np.array(7, dtype=np.int8), np.zeros((0, 4), np.float16)]
    decoded = decode_tenbin(_tenbin(arrays, ["u4", "i1", "f2"]))
    assert [a.dtype for a in decoded] == [np.uint32, np.int8, np.float16]
    assert [a.shape for a in decoded] == [(2, 3), (), (0, 4)]
    assert decoded[0].tolist() == [[0, 1, 2], [3, 4, 5]] and decoded[0].flags.writeable
    good = _tenbin([np.arange(4, dtype=np.int64)], ["i8"])
    with pytest.raises(ValueError, match="no '~TenBin~' marker at byte 0"):
        decode_tenbin(b"x" + good)
    with pytest.raises(ValueError, match="claims 32 bytes; only 8 follow"):
        decode_tenbin(good[: 64 + 16 + 16 + 8])
    with pytest.raises(ValueError, match="dtype code 'c8' is not one of"):
        decode_tenbin(_tenbin([np.zeros(2, np.complex64)], ["c8"]))


def test_npz_is_a_dict_of_arrays_and_npy_refuses_object_arrays():
    out = io.BytesIO()
    np.savez(out, x=np.arange(3), y=np.eye(2))
    decoded = Decoder()({"npz": out.getvalue()})["npz"]
    assert type(decoded) is dict and list(decoded) == ["x", "y"]
    assert decoded["x"].tolist() == [0, 1, 2] and decoded["y"].tolist() == [[1, 0], [0, 1]]
    with pytest.raises(ValueError, match="allow_pickle"):
        Decoder()({"npy": _npy(np.array([{"a": 1}], dtype=object))})


def test_gzip_and_zstd_members_decompress_then_decode():
    text = "a caption " * 50
    sample = {
        "__key__": "k",
        "txt.gz": gzip.compress(text.encode()),
        "txt.zst": compress(text.encode(), "zstd"),
        "json.zst": compress(json.dumps({"x": [1, 2]}).encode(), "zstd"),
        "npy.zst": compress(_npy(np.arange(5)), "zstd"),
        "png.gz": gzip.compress(_image_bytes(Image.new("RGB", (4, 3), (1, 2, 3)), "PNG")),
        "gz": gzip.compress(b"plain bytes"),
        "zst": compress(b"more bytes", "zstd"),
        "bin.gz": gzip.compress(b"\x00\x01"),
    }
    decoded = Decoder(image="tensor")(sample)
    assert decoded["txt.gz"] == decoded["txt.zst"] == text
    assert decoded["json.zst"] == {"x": [1, 2]} and decoded["npy.zst"].tolist() == [0, 1, 2, 3, 4]
    assert decoded["png.gz"].shape == (3, 3, 4) and decoded["png.gz"][:, 0, 0].tolist() == [1, 2, 3]
    assert decoded["gz"] == b"plain bytes" and decoded["zst"] == b"more bytes" and decoded["bin.gz"] == b"\x00\x01"


def test_compressed_members_stay_compressed_without_a_decoder_and_images_without_an_image_mode():
    png = _image_bytes(Image.new("L", (2, 2)), "PNG")
    sample = {"png.gz": gzip.compress(png), "png": png}
    assert Decoder(image=None)(dict(sample)) == {"png.gz": png, "png": png}


def test_zstd_members_written_by_shardkit_read_back_decoded(tmp_path):
    with ShardWriter(str(tmp_path / "z"), max_samples=10) as writer:
        for i in range(3):
            writer.write({"__key__": f"k{i}", "txt.zst": compress(f"text {i}".encode(), "zstd"), "cls": str(i).encode()})
    samples = list(ShardDataset(str(tmp_path / "z"), mode="exact", shuffle=False, decode="pil"))
    assert [(s["txt.zst"], s["cls"]) for s in samples] == [("text 0", 0), ("text 1", 1), ("text 2", 2)]


@pytest.mark.parametrize("ext", ["pickle", "pkl", "pyd", "pkl.gz"])
def test_pickles_are_refused_unless_allowed(ext):
    data = pickle.dumps({"k": [1, 2]})
    if ext.endswith(".gz"):
        data = gzip.compress(data)
    with pytest.raises(UsageError, match=rf"field '{ext}' is a pickle; .*Pass decode=Decoder\(allow_pickle=True\)"):
        Decoder()({ext: data})
    assert Decoder(allow_pickle=True)({ext: data}) == {ext: {"k": [1, 2]}}
    with pytest.raises(UsageError, match="allow_pickle=True"):
        Decoder(allow_torch_load=True)({ext: data})


@pytest.mark.parametrize("ext", ["pth", "pt"])
def test_torch_load_is_refused_unless_allowed(ext):
    out = io.BytesIO()
    torch.save({"w": torch.arange(3)}, out)
    with pytest.raises(UsageError, match=rf"field '{ext}' needs torch.load.*Decoder\(allow_torch_load=True\)"):
        Decoder(allow_pickle=True)({ext: out.getvalue()})
    loaded = Decoder(allow_torch_load=True)({ext: out.getvalue()})[ext]
    assert torch.equal(loaded["w"], torch.arange(3))


def test_tensor_mode_decodes_formats_torchvision_does_not(tmp_path):
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    palette = rgb.convert("P")
    wide = Image.fromarray(rng.integers(0, 65536, (5, 7), dtype=np.uint16))
    sample = {
        "bmp": _image_bytes(rgb, "BMP"),
        "tif": _image_bytes(rgb, "TIFF"),
        "gif": _image_bytes(palette, "GIF"),
        "trans.gif": _image_bytes(palette, "GIF", transparency=int(np.asarray(palette)[0, 0])),
        "pbm": _image_bytes(rgb.convert("1"), "PPM"),
        "tiff": _image_bytes(wide, "TIFF"),
    }
    decoded = Decoder(image="tensor")(sample)
    expected = torch.from_numpy(np.array(rgb)).permute(2, 0, 1)
    assert torch.equal(decoded["bmp"], expected) and torch.equal(decoded["tif"], expected)
    assert torch.equal(decoded["gif"], torch.from_numpy(np.array(palette.convert("RGB"))).permute(2, 0, 1))
    assert decoded["trans.gif"].shape == (4, 5, 7) and decoded["trans.gif"][3, 0, 0] == 0
    assert decoded["pbm"].shape == (1, 5, 7) and set(decoded["pbm"].unique().tolist()) <= {0, 255}
    assert decoded["tiff"].dtype == torch.uint16 and torch.equal(decoded["tiff"][0], torch.from_numpy(np.array(wide)))


def test_a_field_that_fails_to_decode_names_field_and_key():
    with pytest.raises(ValueError, match="invalid literal for int") as info:
        Decoder()({"__key__": "shard3/k9", "cls": b"seven"})
    assert "while decoding field 'cls' of sample 'shard3/k9'" in info.value.__notes__
    with pytest.raises(ValueError) as info:
        Decoder()({"__key__": "k9", "cls": b"seven"}, path="https://user:secret@host/shard-3.tar?sig=token")
    (note,) = info.value.__notes__
    assert note.startswith("while decoding field 'cls' of sample 'k9' in https://") and "shard-3.tar" in note
    assert "secret" not in note and "token" not in note
    with pytest.raises(ValueError, match="corrupt gzip data"):
        Decoder()({"__key__": "k", "txt.gz": b"\x1f\x8b not really"})


def test_missing_msgpack_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "msgpack", None)
    with pytest.raises(ImportError, match=r"msgpack \(mp, msg, msgpack\) fields needs the msgpack package.*shardkit\[torch\]"):
        Decoder()({"mp": b"\x90"})
    monkeypatch.setitem(sys.modules, "cbor2", None)
    with pytest.raises(ImportError, match=r"CBOR \(cbor\) fields needs the cbor2 package.*shardkit\[torch\]"):
        Decoder()({"cbor": b"\x80"})


def test_decoder_pickles_without_its_cache():
    decoder = Decoder(image="tensor", allow_pickle=True)
    decoder({"txt.gz": gzip.compress(b"x"), "cls": b"1"})
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy == decoder and "_functions" not in copy.__dict__
    assert copy({"txt.gz": gzip.compress(b"y")}) == {"txt.gz": "y"}


def test_make_decoder_shorthands():
    assert make_decoder(None) is None
    assert make_decoder("tensor") == Decoder(image="tensor", audio="tensor")
    with pytest.raises(UsageError, match="decode must be 'pil', 'tensor'"):
        make_decoder("rgb8")  # type: ignore[arg-type]


def test_importing_the_decoder_loads_no_decoding_package():
    code = (
        "import sys, shardkit, shardkit.read.decode; "
        "print(sorted(m for m in ('msgpack', 'cbor2', 'PIL', 'torchvision', 'zstandard') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_member_and_image_limits_are_options_of_the_decoder():
    import io as _io

    from PIL import Image

    from shardkit import Decoder, ImageTooLargeError, MemberTooLargeError
    from shardkit.format.compression import compress

    sample = {"__key__": "k7", "txt.gz": compress(b"a" * 1000, "gzip")}
    with pytest.raises(MemberTooLargeError, match=r"s\.tar: member 'k7\.txt\.gz': .*max_member_bytes=100\)") as info:
        Decoder(max_member_bytes=100)(dict(sample), path="s.tar")
    assert (info.value.path, info.value.member, info.value.limit) == ("s.tar", "k7.txt.gz", 100)
    assert Decoder(max_member_bytes=1000)(dict(sample))["txt.gz"] == "a" * 1000
    buf = _io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    for image in ("pil", "tensor"):
        with pytest.raises(ImageTooLargeError, match=r"member 'k7\.png': image header gives 8 x 8 = 64 pixels"):
            Decoder(image=image, max_image_pixels=63)({"__key__": "k7", "png": buf.getvalue()})
        Decoder(image=image, max_image_pixels=64)({"__key__": "k7", "png": buf.getvalue()})
    with pytest.raises(UsageError, match="max_member_bytes"):
        Decoder(max_member_bytes=0)


def test_without_torchvision_decoders_tensors_come_from_pil_alike(monkeypatch):
    """torchvision.io's image decoders are deprecated since 0.29; where the
    installed torchvision no longer has them, decode="tensor" decodes JPEG
    and PNG through PIL: same shape and dtype, PNG bit for bit."""
    from shardkit.read.decoders import images

    rng = np.random.default_rng(0)
    pixels = Image.fromarray(rng.integers(0, 256, (12, 20, 3), dtype=np.uint8))
    encoded = {}
    for fmt in ("PNG", "JPEG"):
        out = io.BytesIO()
        pixels.save(out, format=fmt)
        encoded[fmt] = out.getvalue()
    assert images.torchvision_decoder() is not None  # this machine's torchvision still has them
    with_torchvision = {fmt: images.decode_tensor(data) for fmt, data in encoded.items()}
    images.torchvision_decoder.cache_clear()
    monkeypatch.setitem(sys.modules, "torchvision.io", None)  # `from torchvision.io import ...` now fails
    try:
        assert images.torchvision_decoder() is None
        with_pil = {fmt: images.decode_tensor(data) for fmt, data in encoded.items()}
    finally:
        images.torchvision_decoder.cache_clear()
    assert torch.equal(with_pil["PNG"], with_torchvision["PNG"])
    jpeg_a, jpeg_b = with_pil["JPEG"], with_torchvision["JPEG"]
    assert jpeg_a.shape == jpeg_b.shape == (3, 12, 20) and jpeg_a.dtype == jpeg_b.dtype == torch.uint8
    assert (jpeg_a.int() - jpeg_b.int()).abs().float().mean() < 2.0
