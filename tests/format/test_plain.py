"""plain_samples, the indexed parser's one pass over many whole samples: the
same samples as the full parser wherever it answers, and whatever it
leaves read by the full parser, so a parser with the one pass answers as
one without it (the same samples, the same fault in the same sample)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardkit.errors import CorruptShardError
from shardkit.format.plain import MAX_SAMPLES, SampleRun, plain_run, plain_samples
from shardkit.format.tar import END_OF_ARCHIVE, SampleParser, encode_sample, sample_checksum


class FullParser(SampleParser):
    """The parser without its one pass: every member read by the full parse."""

    def _one_pass(self):
        return []


def shard(samples):
    """Tar bytes of ``samples`` with the end marker, and their bounds."""
    parts = [encode_sample(key, fields) for key, fields in samples]
    bounds = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
    return b"".join(parts) + END_OF_ARCHIVE, bounds


def as_tuples(samples):
    return [(s.key, s.fields, s.start, s.end, s.stored_extensions) for s in samples]


def expanded(items):
    """A parser's items with each run as its samples."""
    out = []
    for item in items:
        out += [item.sample(i) for i in range(len(item))] if isinstance(item, SampleRun) else [item]
    return out


def outcome(parser_type, data, bounds, cuts=(), checksums=None, run_field=None):
    """What a parser returns for ``data`` fed in pieces cut at ``cuts``:
    the samples (a run's one by one), and the fault's sample (the one its
    offset falls in) and type, or None."""
    parser = parser_type(path="s.tar", bounds=bounds, checksums=checksums, run_field=run_field)
    got = []
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    try:
        for lo, hi in zip(edges, edges[1:]):
            got += expanded(parser.feed(data[lo:hi]))
        got += parser.finish()
    except CorruptShardError as exc:
        return as_tuples(got), (int(np.searchsorted(bounds, exc.offset, side="right")) - 1, type(exc))
    return as_tuples(got), None


MIXED = [
    ("a1", [("cls", b"3"), ("txt", b"a dog on the beach")]),
    ("b2", [("jpg", bytes(range(256)) * 41), ("json", b'{"x": 1}'), ("seg.png", b"")]),
    ("dir/c3", [("tokens.npy", b"\x93NUMPY" + bytes(500))]),
    ("d4", [("txt", b"")]),
    ("e5", [("txt", b"x" * 512)]),
]


def test_what_shardkit_writes_is_read_in_one_pass_as_the_full_parser_reads_it():
    data, bounds = shard(MIXED * 3)
    # Keys repeat every five samples but never side by side.
    found = plain_samples(data, 0, 0, bounds)
    full = FullParser(path="s.tar", bounds=bounds)
    assert as_tuples(found) == as_tuples(full.feed(data) + full.finish())
    assert len(found) == 15


def test_it_starts_anywhere_on_a_sample_and_takes_only_whole_samples():
    data, bounds = shard(MIXED)
    base = int(bounds[1])
    found = plain_samples(data[base : int(bounds[4]) + 100], 0, base, bounds[1:])  # sample 4 cut short
    assert [s.key for s in found] == ["b2", "dir/c3", "d4"]
    assert found[0].start == base


@pytest.mark.parametrize(
    "samples, plain",
    [
        ([("a", [("txt", b"1")]), ("F", [("JPG", b"upper case")]), ("c", [("txt", b"3")])], 1),
        ([("a", [("txt", b"1")]), ("n" * 180, [("txt", b"a pax path")])], 1),
        ([("a", [("txt", b"1")]), ("deep/" + "d" * 120 + "/k", [("txt", b"ustar prefix")])], 1),
        ([("a", [("txt", b"1")]), ("a", [("cls", b"2")])], 1),  # one key side by side: the full parser refuses
        ([("k" * 5, [(f"f{i}", b"") for i in range(70)])], 0),  # more members than MAX_MEMBERS
    ],
    ids=["upper-case", "pax", "prefix", "same-key", "many-members"],
)
def test_it_stops_before_what_is_not_plain(samples, plain):
    data, bounds = shard(samples)
    assert len(plain_samples(data, 0, 0, bounds)) == plain
    assert outcome(SampleParser, data, bounds) == outcome(FullParser, data, bounds)


def test_unaligned_arguments_take_no_one_pass():
    data, bounds = shard(MIXED)
    assert plain_samples(b"\0" + data, 1, 1, bounds + 1) == []
    assert plain_samples(data, 0, 0, bounds[:1]) == []


def test_a_call_takes_at_most_max_samples():
    data, bounds = shard([(f"k{i}", [("txt", b"")]) for i in range(MAX_SAMPLES + 10)])
    assert len(plain_samples(data, 0, 0, bounds)) == MAX_SAMPLES
    assert len(SampleParser(path="s.tar", bounds=bounds).feed(data)) == MAX_SAMPLES + 10  # calls until the end


def test_stored_checksums_are_checked_on_the_one_pass():
    data, bounds = shard(MIXED)
    sums = [sample_checksum(key, fields) for key, fields in MIXED]
    assert len(outcome(SampleParser, data, bounds, checksums=sums)[0]) == len(MIXED)
    sums[2] ^= 1
    fast = outcome(SampleParser, data, bounds, cuts=[int(bounds[2])], checksums=sums)
    assert [key for key, *_ in fast[0]] == ["a1", "b2"] and fast[1] == (2, CorruptShardError)
    _consistent(fast, outcome(FullParser, data, bounds, cuts=[int(bounds[2])], checksums=sums))


def test_a_sample_the_one_pass_returned_may_not_go_on_in_the_next_span():
    first = encode_sample("a", [("txt", b"1")])
    data = first + encode_sample("a", [("cls", b"2")]) + encode_sample("b", [("txt", b"3")]) + END_OF_ARCHIVE
    bounds = np.array([0, len(first), len(first) + 1024, len(first) + 2048])
    with pytest.raises(CorruptShardError, match="continues sample 'a'"):
        SampleParser(path="s.tar", bounds=bounds).feed(data[: len(first)] + data[len(first) : len(first) + 2048])
    got, fault = outcome(SampleParser, data, bounds, cuts=[len(first)])
    assert fault == (1, CorruptShardError) and outcome(FullParser, data, bounds)[1] == fault


def _consistent(fast, full):
    """The one pass may return a whole sample the full parser still held
    when the fault came; otherwise both answer alike."""
    (fast_samples, fast_fault), (full_samples, full_fault) = fast, full
    assert fast_fault == full_fault
    assert fast_samples[: len(full_samples)] == full_samples
    assert len(fast_samples) - len(full_samples) <= (0 if full_fault is None else 1)


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    cuts=st.lists(st.integers(0, 10**6), max_size=3),
    stretch=st.integers(-600, 600),
    run_field=st.sampled_from([None, "txt", "cls"]),
)
@example(edits=[(156, ord("5"))], cuts=[], stretch=0, run_field=None)  # a directory entry
@example(edits=[(124, ord("9"))], cuts=[], stretch=0, run_field=None)  # a size that is not octal
@example(edits=[(154, ord(" "))], cuts=[], stretch=0, run_field=None)  # a checksum field of another form
@example(edits=[(0, ord("."))], cuts=[], stretch=0, run_field=None)  # a hidden file: no member
@example(edits=[], cuts=[700], stretch=-512, run_field=None)  # the last sample's span ends inside its member
@example(edits=[], cuts=[], stretch=0, run_field="txt")
def test_damage_gets_the_same_answer_with_and_without_the_one_pass(edits, cuts, stretch, run_field):
    data, bounds = shard(MIXED[:1] + MIXED[3:] + MIXED[:2])
    data = bytearray(data)
    for at, value in edits:
        data[at % len(data)] = value
    bounds = bounds.copy()
    bounds[-1] = max(bounds[-1] + stretch // 512 * 512, bounds[-2] + 512)
    data = bytes(data)
    fast = outcome(SampleParser, data, bounds, cuts, run_field=run_field)
    _consistent(fast, outcome(FullParser, data, bounds, cuts))


def _rewritten(data: bytes, header: int, at: int, value: bytes, checksum: bytes = b"%06o\x00 ") -> bytes:
    """``data`` with bytes ``at`` of the header at ``header`` replaced and
    its checksum made right again (in the form ``checksum``), so only the
    field's form is odd."""
    block = bytearray(data[header : header + 512])
    block[at : at + len(value)] = value
    block[148:156] = b" " * 8
    block[148:156] = checksum % sum(block)
    return data[:header] + bytes(block) + data[header + 512 :]


@pytest.mark.parametrize(
    "at, value, checksum",
    [
        (156, b"2", b"%06o\x00 "),  # a symbolic link named like a member
        (156, b"5", b"%06o\x00 "),  # a directory named like a member
        (156, b"7", b"%06o\x00 "),  # a contiguous file: regular to the full parser
        (124, b" 0000000001 ", b"%06o\x00 "),  # a size padded with spaces
        (124, b"\x80" + bytes(10) + b"\x01", b"%06o\x00 "),  # a base-256 size
        (0, b"e5.TXT\x00", b"%06o\x00 "),  # an upper-case extension
        (0, b"a1.txt\x00", b"%06o\x00 "),  # the key of the sample before
        (0, b"x/.hidden\x00", b"%06o\x00 "),  # no KEY.EXT name
        (0, b"", b"%07o\x00"),  # a checksum of seven digits
        (0, b"", b"%06o  "),  # a checksum ended by spaces
        (0, b"", b"%06o7\x00"),  # six digits that are the sum, and a seventh the full parser reads
        (124, b"000000010007", b"%06o\x00 "),  # 512 in eleven digits, and a twelfth the full parser reads
    ],
)
def test_a_valid_header_of_another_form_gets_the_full_parsers_answer(at, value, checksum):
    data, bounds = shard(MIXED[:1] + MIXED[4:] + MIXED[:2])  # a1, e5, a1, b2
    data = _rewritten(data, int(bounds[1]), at, value, checksum)
    for cuts in ([], [int(bounds[2])]):
        full = outcome(FullParser, data, bounds, cuts)
        for run_field in (None, "txt"):
            _consistent(outcome(SampleParser, data, bounds, cuts, run_field=run_field), full)


@pytest.mark.parametrize(
    "members",
    [[("a", "txt"), ("b", "txt")], [("a", "txt"), ("a", "txt")], [("a", "txt"), ("a", "TXT")]],
    ids=["two-keys", "one-extension-twice", "one-field-twice"],
)
def test_a_span_of_members_that_make_no_one_sample_is_refused(members):
    data = b"".join(encode_sample(key, [(ext, b"x")]) for key, ext in members) + END_OF_ARCHIVE
    bounds = np.array([0, 2048])
    assert plain_samples(data, 0, 0, bounds) == []
    fast = outcome(SampleParser, data, bounds)
    assert fast == outcome(FullParser, data, bounds) and fast[1] == (0, CorruptShardError)


# ------------------------------------------------------------------ runs of one field

DOCUMENTS = [(f"doc/{i:04d}", [("tokens.npy", bytes(range(i % 256)) * (i % 7))]) for i in range(40)]


def test_one_member_samples_of_one_field_come_as_one_run_of_the_same_samples():
    data, bounds = shard(DOCUMENTS)
    run = plain_run(data, 0, 0, bounds, "tokens.npy")
    assert len(run) == 40 and (run.start, run.end) == (0, int(bounds[-1]))
    full = FullParser(path="s.tar", bounds=bounds)
    assert as_tuples(expanded([run])) == as_tuples(full.feed(data) + full.finish())
    assert [run.key(i) for i in (0, 39)] == ["doc/0000", "doc/0039"]


@pytest.mark.parametrize(
    "other, taken",
    [
        (("x", [("tokens.npy", b"1"), ("txt", b"2")]), 3),  # two members
        (("x", [("txt", b"2")]), 3),  # another field
        (("x", [("TOKENS.NPY", b"2")]), 3),  # the field, upper-case as stored
        (("doc/0002", [("tokens.npy", b"2")]), 3),  # the key before it: the full parser refuses it
        (("a.b", [("npy", b"2")]), 3),  # a key with a dot: field "b.npy"
        (("doc/", [("tokens.npy", b"2")]), 3),  # "doc/.tokens.npy": a hidden file, no member
    ],
    ids=["two-members", "other-field", "upper-case", "same-key", "dotted-key", "hidden"],
)
def test_a_run_stops_before_a_sample_of_another_shape(other, taken):
    samples = DOCUMENTS[:3] + [other] + DOCUMENTS[3:5]
    data, bounds = shard(samples)
    field = "npy" if other[0] == "a.b" else "tokens.npy"
    if field == "npy":
        samples = [(f"k{i}", [("npy", b"1")]) for i in range(3)] + [other]
        data, bounds = shard(samples)
    assert len(plain_run(data, 0, 0, bounds, field)) == taken
    for cuts in ([], [int(bounds[4])]):
        _consistent(outcome(SampleParser, data, bounds, cuts, run_field=field), outcome(FullParser, data, bounds, cuts))


def test_a_run_is_never_made_under_stored_checksums():
    data, bounds = shard(DOCUMENTS[:5])
    sums = [sample_checksum(key, fields) for key, fields in DOCUMENTS[:5]]
    items = SampleParser(path="s.tar", bounds=bounds, checksums=sums, run_field="tokens.npy").feed(data)
    assert not any(isinstance(item, SampleRun) for item in items)
