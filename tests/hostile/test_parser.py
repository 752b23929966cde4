"""Crafted tar headers through every entry point, each in a child process
with a memory cap and a timeout: the parser always advances, every numeric
field is range-checked, and the readers and the writer agree on what a
valid shard is."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from shardkit.format.index import encode_index
from shardkit.format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from shardkit.format.tar import BLOCK_SIZE, END_OF_ARCHIVE, byte_sum, encode_sample

from shardkit.write.publish import publish_manifest
from tests.hostile.conftest import run_entries, run_entry

ENTRIES = ("stream", "loader", "indexed", "verify", "write")


def _header(name: bytes, size_field: bytes, typeflag: bytes) -> bytes:
    block = bytearray(BLOCK_SIZE)
    block[0 : len(name)] = name
    block[100:108] = b"0000755\0"
    block[124:136] = size_field
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000"
    block[148:156] = b" " * 8
    block[148:156] = format(byte_sum(bytes(block)), "06o").encode() + b"\0 "
    return bytes(block)


def _dataset(root, body: list[bytes], *, bounds: list[int] | None = None) -> str:
    """A dataset whose one shard is ``body`` + end marker, with a manifest
    (``bounds``: its index, default one sample per body part)."""
    os.makedirs(root, exist_ok=True)
    data = b"".join(body) + END_OF_ARCHIVE
    with open(os.path.join(root, "shard-000000.tar"), "wb") as f:
        f.write(data)
    if bounds is None:
        bounds = [0]
        for part in body:
            bounds.append(bounds[-1] + len(part))
    with open(os.path.join(root, "shard-000000.idx"), "wb") as f:
        f.write(encode_index(bounds))
    entry = ShardEntry(
        path="shard-000000.tar", index="shard-000000.idx", num_samples=len(bounds) - 1,
        num_bytes=len(data), sha256="0" * 64,
    )  # fmt: skip
    manifest = Manifest(shards=(entry,), extensions=("cls", "txt"), source={"format": "python"})
    publish_manifest(str(root), manifest)
    return str(root)


NEGATIVE = b"\xff" + b"\xff" * 10 + b"\xfe"  # -2 in GNU base-256


@pytest.mark.parametrize(
    ("typeflag", "entries"), [(b"5", ENTRIES), (b"x", ("stream", "indexed"))], ids=["directory", "pax"]
)
def test_a_negative_base256_size_on_a_stepped_over_header_hangs_no_entry_point(tmp_path, typeflag, entries):
    good = encode_sample("a", [("txt", b"hello")])
    root = _dataset(tmp_path / "ds", [good, _header(b"d/", NEGATIVE, typeflag) + encode_sample("b", [("txt", b"x")])])
    cases = [(entry, policy) for entry in entries for policy in ("raise", "skip")]
    outs = run_entries([
        ((entry, root), {"on_error": policy, "timeout_s": 90,
                         "options": {"dest": str(tmp_path / f"out-{entry}-{policy}")} if entry == "write" else {}})
        for entry, policy in cases
    ])  # fmt: skip
    for (entry, policy), out in zip(cases, outs):
        assert out.outcome in ("ok", "error"), (entry, policy, out)
        text = out.message + out.stderr + out.stdout
        if out.outcome == "error" or out.exit_code:
            assert "negative number in base-256" in text and "shard-000000.tar" in text, (entry, policy, text)
        else:
            assert policy == "skip" or entry == "write", (entry, policy, out)
        assert all(key == "a" for key in out.keys), (entry, policy, out.keys)
        assert out.peak_rss_mb < 2048


def test_lying_sizes_are_refused_at_the_header(tmp_path):
    cases = {
        "octal": b"77777777777\0",  # 8 GiB past a shard of a few KB
        "base256": b"\x80" + b"\x00" * 3 + b"\xff" * 8,  # 2**64 - 1
        "not octal": b"12345678zz\0\0",
    }
    roots = {name: _dataset(tmp_path / name, [_header(b"a.txt", field, b"0") + bytes(BLOCK_SIZE)]) for name, field in cases.items()}
    runs = [(name, entry, root) for name, root in roots.items() for entry in ("stream", "indexed")]
    outs = run_entries([((entry, root), {"timeout_s": 60, "mem_mb": 512}) for _, entry, root in runs])
    for (name, entry, _), out in zip(runs, outs):
        assert out.outcome == "error" and out.error_type == "CorruptShardError", (name, entry, out)
        assert "shard-000000.tar: member 'a.txt'" in out.message and out.keys == []


def test_readers_and_verify_agree_on_entries_between_samples(tmp_path):
    """A directory and a symlink entry between samples (as GNU tar and
    img2dataset write them) belong to the next sample's span: the streaming
    reader, random access and verify all accept the shard."""
    directory = _header(b"b/", b"00000000000\0", b"5")
    link = _header(b"b/link", b"00000000000\0", b"2")
    a = encode_sample("a", [("txt", b"first")])
    b = directory + link + encode_sample("b/c", [("txt", b"second")])
    root = _dataset(tmp_path / "ds", [a, b])
    outs = {entry: run_entry(entry, root, timeout_s=60) for entry in ("stream", "indexed")}
    for entry, out in outs.items():
        assert out.outcome == "ok" and out.keys == ["a", "b/c"], (entry, out)


def _hostile_tar(path: str, names: list[str]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            data = name.encode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(
    "bad", ["../escape/x.txt", "/etc/passwd.txt", "k\x1b[2J.txt", "dir/./k.txt"], ids=["dotdot", "absolute", "control", "dot"]
)
def test_the_writer_refuses_hostile_member_names(tmp_path, bad):
    src = tmp_path / "in.tar"
    _hostile_tar(str(src), ["good.txt", bad, "fine.txt"])
    out = run_entry("write", str(src), timeout_s=90, options={"dest": str(tmp_path / "raise")})
    assert out.exit_code == 2 and "name refused" in out.stderr and "in.tar" in out.stderr, out
    assert not os.path.exists(tmp_path / "raise" / MANIFEST_NAME)
    out = run_entry("write", str(src), on_error="skip", timeout_s=90, options={"dest": str(tmp_path / "skip")})
    assert out.exit_code == 0, out
    manifest = json.loads((tmp_path / "skip" / MANIFEST_NAME).read_text())
    assert manifest["num_samples"] == 2 and len(manifest["skipped"]) == 1
    assert "name refused" in manifest["skipped"][0]["reason"]
    read = run_entry("stream", str(tmp_path / "skip"))
    assert sorted(read.keys) == ["fine", "good"]
