"""A table's path column checked at once (issue #42): the numpy rule finds
every entry that is not plain, and a plain entry is one the per-entry
resolver can only put under the base."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import ManifestError
from shardkit.format import path_column
from shardkit.format.location import resolve_inside
from shardkit.format.path_column import any_entry_ends_with, irregular_entries, is_plain
from shardkit.format.path_column import bytes_array_columns


def _column(entries: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [e.encode("utf-8", "surrogateescape") for e in entries]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return offsets, np.frombuffer(b"".join(encoded), dtype=np.uint8)


HOSTILE = [
    "", "..", "../x.tar", "a/../../x.tar", "a/..", "/etc/passwd", "//host/x.tar", "a//b.tar", "./a.tar", "a/./b.tar",
    "a/", "a/.", "file:///etc/passwd", "pipe:cat /etc/passwd", "s3://bucket/x.tar", "C:x.tar", "a\\..\\b.tar",
    "%2e%2e/x.tar", "a%2fb.tar", "x.tar?sig=1", "x.tar#frag", "a\0b.tar",
]
PLAIN = ["x.tar", "a/b/c.tar", "..a.tar", "a..", "a/.b/..c/d...tar", "ü/ß.tar", "a b.tar", ".hidden.tar", "a.-_~!$.tar"]


def test_every_hostile_shape_is_irregular_and_plain_names_are_not():
    offsets, blob = _column(PLAIN + HOSTILE)
    assert irregular_entries(offsets, blob).tolist() == list(range(len(PLAIN), len(PLAIN) + len(HOSTILE)))
    assert [is_plain(e) for e in PLAIN + HOSTILE] == [True] * len(PLAIN) + [False] * len(HOSTILE)


SEGMENT = st.sampled_from(["", ".", "..", "a", "b.tar", "..x", "é", "%2e", ":", "\\", "?q", "#", "\0", "s3:", " "])
ENTRY = st.lists(SEGMENT, min_size=1, max_size=5).map("/".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(ENTRY, min_size=1, max_size=40))
def test_numpy_rule_is_the_one_entry_rule(entries):
    found = irregular_entries(*_column(entries)).tolist()
    assert found == [i for i, e in enumerate(entries) if not is_plain(e)]


@settings(max_examples=300, deadline=None)
@given(ENTRY)
def test_a_plain_entry_resolves_to_the_base_joined_with_it(entry):
    """What lets the reader leave plain entries to be resolved when read: the
    resolver accepts them and only puts the base in front."""
    if not is_plain(entry):
        return
    base = os.path.abspath(os.sep + "no-such-dataset-42")
    assert resolve_inside(base, entry) == base + "/" + entry
    assert resolve_inside("https://host/data", entry) == "https://host/data/" + entry


@pytest.mark.parametrize("entry", HOSTILE)
def test_each_hostile_shape_is_refused_by_the_resolver_or_stays_inside(entry, tmp_path):
    """The entries the numpy rule sends to the resolver: refused there, or (a
    '.', an empty segment) resolved inside the base."""
    base = str(tmp_path)
    try:
        resolved = resolve_inside(base, entry)
    except ManifestError:
        return
    assert os.path.realpath(resolved).startswith(os.path.realpath(base) + os.sep) or resolved.startswith(base + "/")


def test_blocks_do_not_hide_or_shift_an_entry(monkeypatch):
    monkeypatch.setattr(path_column, "BLOCK_ENTRIES", 7)
    entries = [f"d{i % 3}/s{i}.tar" for i in range(100)]
    for bad in (0, 6, 7, 13, 14, 50, 99):
        entries[bad] = "../x.tar" if bad % 2 else "a//b.tar"
    assert irregular_entries(*_column(entries)).tolist() == [0, 6, 7, 13, 14, 50, 99]
    assert irregular_entries(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)).tolist() == []


def test_a_column_of_a_million_names_is_checked_in_numpy():
    n = 10**6
    names = np.char.add(np.char.add(b"part/", np.char.mod(b"%07x", np.arange(n))), b".tar")
    offsets, blob = bytes_array_columns(names, n)
    assert irregular_entries(offsets, blob).tolist() == []
    blob = blob.copy()
    blob[int(offsets[765_432]) : int(offsets[765_432]) + 2] = list(b"..")  # "../" + the rest
    blob[int(offsets[765_432]) + 2] = ord("/")
    assert irregular_entries(offsets, blob).tolist() == [765_432]


def test_suffixes_are_found_at_the_end_of_an_entry_in_any_case():
    offsets, blob = _column(["a.tar", "b.tar.gz/c.tar", "gz", "d.TAR.GZ"])
    assert any_entry_ends_with(offsets, blob, [".tar.gz"])
    assert not any_entry_ends_with(*_column(["a.tar", "b.tar.gz/c.tar", "gz", ""]), [".tar.gz", ".tgz"])
    assert any_entry_ends_with(*_column(["x.tgz"]), [".tar.gz", ".tgz"])
    assert any_entry_ends_with(*_column(["a.tar", "b.tar.gz?x=1.tar?y", "c.tar?z.tgz"]), [".tar.gz"], cut="?")
    assert not any_entry_ends_with(*_column(["a.tar", "c.tar?z.tgz", "?.tgz"]), [".tgz"], cut="?")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab.tgzr?T/", max_size=12), min_size=1, max_size=20))
def test_suffixes_before_a_query_are_found_as_compression_from_name_finds_them(names):
    from shardkit.format.compression import SHARD_SUFFIXES, compression_from_name

    expected = any(compression_from_name(n) for n in names)
    assert any_entry_ends_with(*_column(names), SHARD_SUFFIXES, cut="?") == expected

