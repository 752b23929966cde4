"""parse_span, the random reader's one-pass parse of a sample's exact span:
the same sample as the full parser wherever it answers, the full parser's
error wherever the span is damaged."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardkit.errors import CorruptShardError
from shardkit.format.span import _plain_sample, parse_span
from shardkit.format.tar import SampleParser, encode_sample, sample_checksum

SAMPLES = [
    ("a1", [("cls", b"3"), ("txt", b"a dog on the beach")]),  # tiny: the seed's samples
    ("b2", [("jpg", bytes(range(256)) * 41), ("json", b'{"x": 1}'), ("seg.png", b"")]),
    ("dir/c3", [("npy", b"\x93NUMPY" + bytes(500))]),
    ("deep/" + "d" * 120 + "/d4", [("txt", b"a name in the ustar prefix field")]),
    ("n" * 180, [("txt", b"a pax path")]),
    ("ünï/e5", [("txt", b"utf-8 key")]),
    ("F6", [("JPG", b"upper-case extension"), ("txt", b"x")]),
]


def full_parse(data: bytes, start: int, checksums=None):
    parser = SampleParser(path="s.tar", base_offset=start, bounds=(start, start + len(data)), checksums=checksums)
    return (parser.feed(data) + parser.finish(expect_end_marker=False))[0]


@pytest.mark.parametrize("key, fields", SAMPLES, ids=[k[:10] for k, _ in SAMPLES])
def test_every_span_parses_to_the_full_parsers_sample(key, fields):
    data = encode_sample(key, fields)
    got = parse_span(data, start=4096, path="s.tar")
    assert got == full_parse(data, 4096)
    assert (got.key, got.fields, got.start, got.end) == (key, {e.lower(): v for e, v in fields}, 4096, 4096 + len(data))


def test_what_shardkit_writes_takes_the_one_pass():
    plain = [encode_sample(key, fields) for key, fields in SAMPLES[:3]]
    assert all(_plain_sample(data, 0) is not None for data in plain)
    special = [encode_sample(key, fields) for key, fields in SAMPLES[3:]]  # prefix, pax, upper case: full parser
    assert [_plain_sample(data, 0) for data in special] == [None] * len(special)


def test_a_stored_checksum_is_checked():
    key, fields = SAMPLES[0]
    data = encode_sample(key, fields)
    good = sample_checksum(key, fields)
    assert parse_span(data, start=0, path="s.tar", checksums=(good,)).fields == dict(fields)
    with pytest.raises(CorruptShardError, match="fails its checksum"):
        parse_span(data, start=0, path="s.tar", checksums=(good ^ 1,))


def _outcome(parse):
    try:
        return parse()
    except CorruptShardError as exc:
        return str(exc), exc.offset


TWO = encode_sample("a1", [("cls", b"3"), ("txt", b"a dog on the beach")])
SECOND_KEY = TWO + encode_sample("a2", [("txt", b"x")])


@settings(max_examples=400)
@given(
    base=st.sampled_from([TWO, SECOND_KEY, encode_sample(*SAMPLES[1])]),
    at=st.integers(0, 10**6),
    value=st.integers(0, 255),
    cut=st.integers(-1024, 1024),
)
@example(base=TWO, at=156, value=ord("5"), cut=0)  # a directory entry
@example(base=TWO, at=124, value=ord("9"), cut=0)  # a size that is not octal
@example(base=TWO, at=125, value=ord("o"), cut=0)  # a size int() would read as "0o..."
@example(base=TWO, at=124, value=ord("+"), cut=0)  # a signed size
@example(base=TWO, at=130, value=ord("_"), cut=0)  # a size int() would read with "_" in it
@example(base=TWO, at=149, value=ord("o"), cut=0)  # a checksum int() would read as "0o..."
@example(base=TWO, at=0, value=ord("."), cut=0)  # a hidden file: no member
@example(base=TWO, at=0, value=0, cut=-512)  # the span ends inside the last member's padding
def test_a_damaged_span_gets_the_full_parsers_answer(base, at, value, cut):
    data = bytearray(base)
    data[at % len(data)] = value
    data = bytes(data[: len(data) + cut] if cut < 0 else data + bytes(cut))
    if not data:
        return
    assert _outcome(lambda: parse_span(data, start=512, path="s.tar")) == _outcome(lambda: full_parse(data, 512))


def _with_field(data: bytes, at: int, value: bytes) -> bytes:
    """``data`` with its first header's bytes at ``at`` replaced and the
    header's checksum made right again, so only the field's form is wrong."""
    header = bytearray(data[:512])
    header[at : at + len(value)] = value
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header) + data[512:]


@pytest.mark.parametrize(
    "at, value",
    [
        (124, b"0o000000003"),  # what int(_, 8) reads as a prefix
        (124, b"+0000000003"),  # a sign
        (124, b"-0000000003"),
        (124, b"0000_000003"),  # a digit separator
        (124, b" 000000003 "),  # spaces around the digits (tar writers pad so)
        (124, b"00000000009"),  # not octal
        (156, b"1"),  # a hard link
    ],
)
def test_a_header_with_a_valid_checksum_but_an_odd_field_gets_the_full_parsers_answer(at, value):
    data = _with_field(TWO, at, value)
    assert _outcome(lambda: parse_span(data, start=0, path="s.tar")) == _outcome(lambda: full_parse(data, 0))
