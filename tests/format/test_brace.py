"""Brace patterns kept as patterns give braceexpand's names, in its order."""

from __future__ import annotations

import pickle

import braceexpand
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardkit.format.brace import BraceList, expand_braces, expand_patterns, is_pattern, split_patterns

LITERAL = st.text(alphabet="abc/._-:?=", max_size=4)
NUMBER = st.integers(-12, 130).map(str) | st.integers(0, 130).map(lambda n: f"{n:04d}") | st.sampled_from(["0", "-0", "007"])
RANGE = st.tuples(NUMBER, NUMBER, st.none() | st.integers(0, 5).map(str)).map(
    lambda t: "{%s..%s%s}" % (t[0], t[1], "" if t[2] is None else ".." + t[2])
)
WORDS = st.lists(st.text(alphabet="xyz09_-", max_size=3), min_size=2, max_size=4).map(lambda w: "{" + ",".join(w) + "}")


@settings(max_examples=300, deadline=None)
@given(st.lists(LITERAL | RANGE | WORDS, max_size=4).map("".join))
def test_names_and_order_match_braceexpand(pattern):
    names = expand_braces(pattern)
    assert isinstance(names, BraceList)
    # Four ranges of ~140 names each are 10^8 names: braceexpand's list of them
    # filled 22 GB and the suite stalled. The lazy list's length costs nothing.
    assume(len(names) <= 20_000)
    expected = list(braceexpand.braceexpand(pattern))
    assert len(names) == len(expected)
    assert list(names) == expected
    assert [names[i] for i in range(-len(expected), 0)] == expected
    assert names[1:-1:2] == expected[1:-1:2]
    assert names == expected and pickle.loads(pickle.dumps(names)) == expected


def test_a_laion_sized_pattern_is_small_and_made_on_access():
    names = expand_braces("https://host/laion/{000000..499999}.tar")
    assert len(names) == 500_000 and names[123_456] == "https://host/laion/123456.tar"
    assert names[-1] == "https://host/laion/499999.tar"
    assert len(pickle.dumps(names)) < 200
    with pytest.raises(IndexError):
        names[500_000]


@pytest.mark.parametrize("pattern", ["a{b,{c,d}}", "x{a..e}.tar", r"a\{1..2\}", "a{b}c", "a{}", "a{1,2/3}"])
def test_other_patterns_are_expanded_by_braceexpand(pattern):
    names = expand_braces(pattern)
    assert isinstance(names, list) and names == list(braceexpand.braceexpand(pattern))


def test_unbalanced_braces_are_refused_as_braceexpand_refuses_them():
    for pattern in ("a{1..2", "a}b"):
        with pytest.raises(braceexpand.UnbalancedBracesError):
            expand_braces(pattern)
    assert expand_braces("a}1{") == ["a}1{"]  # braceexpand's reading, kept


def test_patterns_joined_by_double_colons_name_their_shards_in_turn():
    """webdataset's and OpenCLIP's way of giving several datasets in one string."""
    text = "/data/laion/{00000..00002}.tar::https://[::1]:8000/cc/{a,b}.tar::/x/one.tar"
    assert split_patterns(text) == ["/data/laion/{00000..00002}.tar", "https://[::1]:8000/cc/{a,b}.tar", "/x/one.tar"]
    names = expand_patterns(text)
    expected = ["/data/laion/00000.tar", "/data/laion/00001.tar", "/data/laion/00002.tar",
                "https://[::1]:8000/cc/a.tar", "https://[::1]:8000/cc/b.tar", "/x/one.tar"]
    assert len(names) == 6 and list(names) == expected and names[-3] == expected[-3] and names[1:3] == expected[1:3]
    assert len(pickle.dumps(names)) < 1000
    assert is_pattern("a.tar::b.tar") and not is_pattern("http://[::1]:8000/a.tar")
    assert expand_patterns("http://[::1]:8000/a.tar") == ["http://[::1]:8000/a.tar"]
