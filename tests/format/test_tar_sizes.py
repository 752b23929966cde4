"""Member sizes by arithmetic (what the planner uses) equal the encoder's bytes, byte for byte."""

from __future__ import annotations

import tarfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardkit.format.tar import (
    BLOCK_SIZE,
    append_joined_sample,
    append_sample,
    encode_header,
    encode_joined_block,
    encode_sample,
    encoded_header_size,
    encoded_member_size,
    encoded_sample_size,
    join_members,
    padding,
    sample_checksum,
    split_joined,
)

MAX_OCTAL_SIZE = 8**11 - 1  # the largest size an 11-digit octal field holds; beyond it a pax "size" record
#: Sizes on either side of the limits of tar's size field: 11 octal digits,
#: 12 (what GNU tar's octal would hold), base-256's 11 bytes, and a signed 64-bit int.
LIMIT_SIZES = [
    edge + delta for edge in (0, MAX_OCTAL_SIZE, 8**12 - 1, 256**11 - 1, 2**63 - 1) for delta in (-1, 0, 1, 2)
    if edge + delta >= 0
]

# Names that ustar holds and names it does not: short and long, with slashes
# where a prefix/name split may or may not fit, ASCII and not.
names = st.one_of(
    st.text(alphabet="ab/.", max_size=320),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=320),
    st.text(alphabet=st.sampled_from("a/é😀"), min_size=90, max_size=1100),
)
sizes = st.one_of(st.integers(min_value=0, max_value=1 << 20), st.sampled_from(LIMIT_SIZES), st.integers(0, 2**80))


@settings(max_examples=600, deadline=None)
@given(name=names, size=sizes)
@example(name="p" * 100, size=0)  # exactly the name field
@example(name="p" * 101, size=0)  # one over, no slash to split at: pax
@example(name="d" * 155 + "/" + "n" * 100, size=7)  # the longest prefix + name split
@example(name="d" * 156 + "/" + "n" * 100, size=7)  # prefix one too long
@example(name="d" * 10 + "/" + "n" * 101, size=7)  # name part one too long
@example(name="/" + "n" * 100, size=1)  # the split would leave an empty prefix
@example(name="", size=MAX_OCTAL_SIZE + 1)
def test_header_size_by_arithmetic_is_the_encoders(name, size):
    assert encoded_header_size(name, size) == len(encode_header(name, size))
    assert encoded_member_size(name, size) == len(encode_header(name, size)) + size + padding(size)


@pytest.mark.parametrize("extra", [0, 1])  # without and with a pax size record as well
@pytest.mark.parametrize(
    "name_bytes",
    # pax "path" records whose length field gains a digit (99 -> 100 and 999 -> 1000 bytes in all),
    # and whose records fill the pax data block to 512 bytes, give or take one.
    [*range(88, 96), *range(986, 996), *range(480, 512)],
)
def test_header_size_at_the_pax_length_and_block_boundaries(name_bytes, extra):
    name = "é" + "a" * (name_bytes - 2)  # non-ASCII: always a pax path
    assert len(name.encode()) == name_bytes
    size = MAX_OCTAL_SIZE + extra
    assert encoded_header_size(name, size) == len(encode_header(name, size))


def test_sample_sizes_by_arithmetic_equal_encoded_samples():
    fields = [("cls", b"3"), ("jpg", bytes(1000)), ("json", b"{}"), ("seg.png", b"")]
    for key in ("a1", "k" * 97, "k" * 200, "deep/" + "d" * 140 + "/b2", "ünï/c3"):
        assert encoded_sample_size(key, [(e, len(d)) for e, d in fields]) == len(encode_sample(key, fields))
    assert encoded_header_size("key.jpg", 10) == BLOCK_SIZE


@settings(max_examples=400, deadline=None)
@given(name=st.text(alphabet=st.characters(max_codepoint=127), max_size=100), size=sizes)
@example(name="k" * 100, size=MAX_OCTAL_SIZE)  # the largest name and size the short header holds
@example(name="", size=0)
def test_short_ascii_headers_equal_the_general_builder_and_tarfile_reads_them(name, size):
    from shardkit.format import ustar

    header = encode_header(name, size)
    if size > MAX_OCTAL_SIZE:
        return  # a pax size record: not the short path
    assert header == ustar._ustar_header(name.encode("ascii"), b"", size, b"0")
    info = tarfile.TarInfo.frombuf(header, "ascii", "strict")  # checks the checksum
    assert (info.name, info.size, info.mode, info.mtime) == (name.split("\x00")[0], size, 0o644, 0)


@settings(max_examples=200, deadline=None)
@given(key=names, fields=st.lists(st.tuples(st.text(alphabet="abJ.ü", min_size=1, max_size=8), st.binary(max_size=1200)), max_size=4))
def test_append_sample_is_encode_sample_with_its_checksum(key, fields):
    out = bytearray(b"before")
    crc = append_sample(out, key, fields)
    assert bytes(out) == b"before" + encode_sample(key, fields)
    assert crc == sample_checksum(key, fields)


@settings(max_examples=200, deadline=None)
@given(key=names, fields=st.lists(st.tuples(st.text(alphabet="abJ.ü", min_size=1, max_size=8), st.binary(max_size=1200)), max_size=4))
def test_joined_members_give_the_same_bytes_and_checksum(key, fields):
    # The writer's path for carried values: extensions and sizes as bytes, the data in one buffer.
    heads = [item for ext, data in fields for item in (ext.encode("utf-8"), b"%d" % len(data))]
    out, joined = bytearray(b"before"), bytearray(b"before")
    crc = append_sample(out, key, fields)
    assert append_joined_sample(joined, key, heads, b"".join(data for _, data in fields)) == crc
    assert joined == out


block_keys = st.one_of(st.text(alphabet="ab/_-09", min_size=1, max_size=110), names)
block_fields = st.lists(st.tuples(st.text(alphabet="abJ.ü", min_size=1, max_size=8), st.binary(max_size=1200)), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(samples=st.lists(st.tuples(block_keys, block_fields), min_size=1, max_size=12))
@example(samples=[("k" * 95, [("json", b"{}")]), ("k", [("txt", b"x" * 512), ("cls", b"")])])  # a name of 100 bytes; block edges
@example(samples=[("k" * 96, [("json", b"{}")])])  # 101 bytes: not taken
def test_a_block_of_joined_samples_is_each_sample_appended(samples):
    raw_keys = [key.encode("utf-8") for key, _ in samples]
    joined = [join_members((ext.encode("utf-8"), data) for ext, data in fields) for _, fields in samples]
    out, ends, crcs = bytearray(), [], []
    for key, fields in samples:
        crcs.append(append_sample(out, key, fields))
        ends.append(len(out))
    encoded = encode_joined_block(raw_keys, joined)
    short = all(len(name) <= 100 and name.isascii() for key, fields in samples for name in (f"{key}.{ext}" for ext, _ in fields))
    if not short:
        assert encoded is None  # the writer then appends these one by one
        return
    block, block_ends, block_crcs = encoded
    assert block.tobytes() == bytes(out)
    assert block_ends.tolist() == ends
    assert block_crcs == crcs
    assert [split_joined(j) for j in joined] == [
        ([item for ext, data in fields for item in (ext.encode("utf-8"), b"%d" % len(data))], b"".join(d for _, d in fields))
        for _, fields in samples
    ]


@pytest.mark.parametrize(
    "joined",
    [
        [b"txt\x003\x00\x00abc", b"txt\x002\x00\x00xyz"],  # 2 bytes claimed, 3 there
        [b"txt\x003\x00\x00ab"],  # 3 claimed, 2 there
        [b"txt\x00-3\x00\x00abc"],  # not a size
        [b"txt\x00" + b"9" * 30 + b"\x00\x00abc"],  # past any octal size (and int64)
        [b"txt\x00\x00abc"],  # an extension without its size
        [b"txt\x003abc"],  # no end to the list
        [b"\x00\x00txt\x003\x00\x00abc"],  # an empty list
        [b"t\xc3\xbcx\x003\x00\x00abc"],  # an extension that is not ASCII
    ],
)
def test_a_block_not_laid_out_as_joined_members_is_left_to_the_one_by_one_path(joined):
    assert encode_joined_block([b"k%d" % i for i in range(len(joined))], joined) is None


def test_the_one_by_one_path_names_members_that_do_not_add_up():
    with pytest.raises(ValueError, match="claims 3 bytes; 2 are left"):
        append_joined_sample(bytearray(), "k", *split_joined(b"txt\x003\x00\x00ab"))
