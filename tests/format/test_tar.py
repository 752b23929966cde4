"""Tar encoding is reproducible and standard; the push parser is exact and strict."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import CorruptShardError
from shardkit.format.tar import (
    BLOCK_SIZE,
    END_OF_ARCHIVE,
    SampleParser,
    byte_sum,
    encode_header,
    encode_sample,
    encoded_sample_size,
    split_key,
)

SAMPLES = [
    ("a1", [("cls", b"3"), ("jpg", bytes(range(256)) * 5)]),
    ("deep/" + "d" * 120 + "/b2", [("txt", b"long path in the prefix field")]),
    ("ünïcode/c3", [("json", b'{"x": 1}')]),
    ("n" * 180, [("txt", b"needs a pax path")]),
    ("e4", [("seg.png", b"")]),
]


def archive(samples=SAMPLES) -> bytes:
    return b"".join(encode_sample(k, f) for k, f in samples) + END_OF_ARCHIVE


def parse(data: bytes, chunk: int) -> list:
    parser = SampleParser(path="mem.tar")
    out = []
    for i in range(0, len(data), chunk):
        out += parser.feed(data[i : i + chunk])
    return out + parser.finish()


def test_split_key_follows_webdataset_rule():
    assert split_key("dir/a.b/img_1.seg.png") == ("dir/a.b/img_1", "seg.png")
    assert split_key("noext") is None
    assert split_key(".hidden") is None
    assert split_key("trailing.") is None


def test_plain_names_get_one_ustar_block_and_fixed_metadata():
    header = encode_header("key.jpg", 10)
    assert len(header) == BLOCK_SIZE
    info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
    assert (info.name, info.size, info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (
        "key.jpg", 10, 0, 0, 0, "", "", 0o644,
    )  # fmt: skip


def test_pax_header_only_where_a_name_needs_it():
    assert len(encode_header("p" * 98 + ".x", 1)) == BLOCK_SIZE  # exactly 100 bytes fits
    assert len(encode_header("d" * 150 + "/k.txt", 1)) == BLOCK_SIZE  # fits prefix + name
    assert len(encode_header("k" * 200 + ".txt", 1)) > BLOCK_SIZE  # needs pax path
    assert len(encode_header("ü.txt", 1)) > BLOCK_SIZE  # non-ASCII goes through pax


def test_python_tarfile_reads_names_and_bytes():
    with tarfile.open(fileobj=io.BytesIO(archive())) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    want = {f"{k}.{e}": d for k, fields in SAMPLES for e, d in fields}
    assert got == want


def test_gnu_tar_lists_every_member(tmp_path):
    path = tmp_path / "x.tar"
    path.write_bytes(archive())
    listing = subprocess.run(["tar", "-tf", str(path)], capture_output=True, text=True, check=True).stdout
    assert listing.splitlines() == [f"{k}.{e}" for k, fields in SAMPLES for e, _ in fields]


def test_webdataset_reads_samples(tmp_path):
    path = tmp_path / "x.tar"
    path.write_bytes(archive())
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in wds.WebDataset(str(path), shardshuffle=False)}
    assert got == {k: dict(fields) for k, fields in SAMPLES}


def test_encoded_sample_size_is_exact():
    for key, fields in SAMPLES:
        assert encoded_sample_size(key, [(e, len(d)) for e, d in fields]) == len(encode_sample(key, fields))


@settings(max_examples=60, deadline=None)
@given(chunk=st.integers(min_value=1, max_value=5000))
def test_parser_gives_same_samples_for_any_chunking(chunk):
    samples = parse(archive(), chunk)
    assert [(s.key, s.fields) for s in samples] == [(k, dict(f)) for k, f in SAMPLES]
    data = archive()
    for s in samples:  # boundaries re-parse to exactly that sample
        parser = SampleParser(path="mem.tar", base_offset=s.start)
        [again] = parser.feed(data[s.start : s.end]) + parser.finish(expect_end_marker=False)
        assert again.key == s.key and again.fields == s.fields


def test_truncated_archive_never_yields_partial_sample():
    data = archive()
    cut = len(data) - len(END_OF_ARCHIVE) - 700  # inside the last member
    parser = SampleParser(path="cut.tar")
    complete = parser.feed(data[:cut])
    with pytest.raises(CorruptShardError, match=r"cut\.tar.*truncated") as info:
        parser.finish()
    assert all(s.key != SAMPLES[-1][0] for s in complete)
    assert info.value.path == "cut.tar" and info.value.offset is not None


def test_missing_end_marker_is_truncation():
    data = archive()[: -len(END_OF_ARCHIVE)]
    parser = SampleParser(path="x.tar")
    parser.feed(data)
    with pytest.raises(CorruptShardError, match="end-of-archive"):
        parser.finish()


def test_bad_checksum_names_offset():
    data = bytearray(archive())
    data[0] ^= 0xFF  # first header's name byte
    with pytest.raises(CorruptShardError, match="checksum") as info:
        parse(bytes(data), 4096)
    assert info.value.offset == 0


@settings(max_examples=300)
@given(st.binary(min_size=512, max_size=512), st.integers(0, 512))
def test_byte_sum_is_exact_for_sparse_and_dense_blocks(values, nonzero):
    # Blocks from mostly zero (every real header) to full, across the point
    # where the fast path hands over to plain summing.
    block = values[:nonzero] + bytes(512 - nonzero)
    assert byte_sum(block) == sum(block)


def test_dense_header_with_a_corrupt_byte_is_still_caught():
    data = bytearray(encode_sample("k" * 90, [("txt", b"x")]) + END_OF_ARCHIVE)
    # Fill fields the parser ignores (link name, user and group names) so that
    # the header has more non-zero bytes than the fast path takes.
    data[157:257] = b"L" * 100
    data[265:329] = b"u" * 64
    assert 512 - bytes(data[:512]).count(0) >= 257
    checksum = sum(data[:148]) + 256 + sum(data[156:512])
    data[148:156] = f"{checksum:06o}".encode() + b"\x00 "
    parse(bytes(data), 4096)  # consistent: parses
    data[20] ^= 0x01
    with pytest.raises(CorruptShardError, match="checksum"):
        parse(bytes(data), 4096)


def _entry(name: str, data: bytes = b"", typeflag: bytes = b"0") -> bytes:
    header = bytearray(encode_header(name, len(data)))
    header[156:157] = typeflag
    header[148:156] = b" " * 8
    header[148:156] = format(byte_sum(bytes(header)), "06o").encode() + b"\x00 "
    return bytes(header) + data + bytes(-len(data) % BLOCK_SIZE)


def test_entries_that_are_no_member_are_skipped_counted_and_spanned():
    """Directories, README, .DS_Store (at any depth) and a dotted directory
    belong to no sample: skipped and counted. Those before or between samples
    lead into the next sample's span, those after the last close its span,
    so the spans tile the shard up to the end marker."""
    body = (
        _entry("data.v1/", typeflag=b"5")
        + _entry("README", b"read me")
        + encode_sample("data.v1/a", [("JPG", b"jpeg"), ("Cls", b"1")])
        + _entry(".DS_Store", b"junk")
        + _entry("data.v1/.DS_Store", b"junk")
        + encode_sample("data.v1/b.x", [("seg.PNG", b"png")])
        + _entry("LICENSE", b"text")
    )
    data = body + END_OF_ARCHIVE
    parser = SampleParser(path="mem.tar")
    samples = parser.feed(data) + parser.finish()
    assert [(s.key, s.fields) for s in samples] == [
        ("data.v1/a", {"jpg": b"jpeg", "cls": b"1"}),
        ("data.v1/b", {"x.seg.png": b"png"}),
    ]
    assert parser.num_skipped_entries == 5 and parser.first_skipped == "data.v1/"
    assert samples[0].start == 0 and samples[1].start == samples[0].end and samples[1].end == len(body)
    bounds = [0, samples[0].end, samples[1].end]
    for k in range(2):  # each span alone, as an offset index reads it
        one = SampleParser(path="mem.tar", base_offset=bounds[k], bounds=bounds[k : k + 2])
        got = one.feed(data[bounds[k] : bounds[k + 1]]) + one.finish(expect_end_marker=False)
        assert [(s.key, s.fields) for s in got] == [(samples[k].key, samples[k].fields)]
    whole = SampleParser(path="mem.tar", bounds=bounds)
    assert [s.key for s in whole.feed(data) + whole.finish()] == ["data.v1/a", "data.v1/b"]


def test_extensions_equal_but_for_case_repeat_a_field():
    data = encode_sample("k", [("jpg", b"1"), ("JPG", b"2")]) + END_OF_ARCHIVE
    with pytest.raises(CorruptShardError, match="repeats extension 'jpg'"):
        parse(data, 1 << 20)


def test_skipped_entries_are_logged_once_per_shard(caplog):
    data = _entry("README", b"x") + encode_sample("a", [("txt", b"1")]) + _entry("NOTES") + END_OF_ARCHIVE
    for _ in range(2):
        parser = SampleParser(path="once.tar")
        parser.feed(data)
        parser.finish()
    assert caplog.text.count("once.tar: skipping tar entries") == 1 and "'README'" in caplog.text
