"""ShuffleBuffer and the shuffle-quality measures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import UsageError
from shardkit.read.shuffle import ShuffleBuffer, mean_displacement, shuffle_quality


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@given(n=st.integers(0, 300), size=st.integers(0, 50), seed=st.integers(0, 1000))
def test_buffer_yields_a_permutation_of_its_input(n, size, seed):
    out = list(ShuffleBuffer(size=size, rng=_rng(seed)).shuffle(range(n)))
    assert sorted(out) == list(range(n))


def test_same_seed_same_order_and_other_seed_other_order():
    first = list(ShuffleBuffer(size=64, rng=_rng(5)).shuffle(range(1000)))
    assert first == list(ShuffleBuffer(size=64, rng=_rng(5)).shuffle(range(1000)))
    assert first != list(ShuffleBuffer(size=64, rng=_rng(6)).shuffle(range(1000)))
    assert first != list(range(1000))


def test_byte_cap_limits_what_the_buffer_holds():
    items = [bytes(100)] * 500
    held = {"now": 0, "max": 0}

    def produce():
        for item in items:
            held["now"] += len(item)
            held["max"] = max(held["max"], held["now"])
            yield item

    buffer = ShuffleBuffer(size=1000, rng=_rng(), max_bytes=1000, nbytes=len)
    for item in buffer.shuffle(produce()):
        held["now"] -= len(item)
    assert held["max"] <= 1000


def test_displacement_grows_with_buffer_size():
    small = list(ShuffleBuffer(size=10, rng=_rng()).shuffle(range(20000)))
    large = list(ShuffleBuffer(size=1000, rng=_rng()).shuffle(range(20000)))
    assert mean_displacement(list(range(100))) == 0.0
    assert mean_displacement(small) < mean_displacement(large)


def test_shuffle_quality_tells_sorted_from_shuffled():
    labels = np.repeat(np.arange(10), 1000)  # class-sorted, like an ImageFolder
    assert shuffle_quality(labels, batch_size=64) > 5
    mixed = np.random.default_rng(1).permutation(labels)
    assert shuffle_quality(mixed, batch_size=64) == pytest.approx(1.0, abs=0.1)
    buffered = list(ShuffleBuffer(size=2000, rng=_rng()).shuffle(labels.tolist()))
    assert 1.0 < shuffle_quality(buffered, batch_size=64) < shuffle_quality(labels, batch_size=64)


def test_invalid_buffer_options_are_refused():
    with pytest.raises(UsageError, match="must be >= 0"):
        ShuffleBuffer(size=-1, rng=_rng())
    with pytest.raises(UsageError, match="nbytes"):
        ShuffleBuffer(size=5, rng=_rng(), max_bytes=10)
    with pytest.raises(UsageError, match="at least one batch"):
        shuffle_quality([1, 2], batch_size=5)


def _growing(size: int, initial: int, seed: int, max_bytes: int | None = None) -> ShuffleBuffer[int]:
    return ShuffleBuffer(
        size=size,
        rng=_rng(seed),
        initial=initial,
        max_bytes=max_bytes,
        nbytes=(lambda item: item % 7 + 1) if max_bytes is not None else None,
    )


def _counted(n: int, taken: list[int]):
    """``range(n)``, appending each item to ``taken`` as it is drawn."""
    for i in range(n):
        taken.append(i)
        yield i


def test_buffer_emits_after_its_initial_fill_and_grows_to_its_size():
    taken: list[int] = []
    stream = ShuffleBuffer(size=1000, rng=_rng(), initial=10).shuffle(_counted(5000, taken))
    next(stream)
    assert len(taken) == 10
    for _ in range(99):
        next(stream)
    assert len(taken) == 10 + 2 * 99  # two admitted per emit while growing
    for _ in range(2000):
        next(stream)
    emitted = 2100
    assert len(taken) - emitted == 999  # full: size - 1 resident between arrivals


def test_initial_fill_at_size_is_the_full_fill_shuffle():
    taken: list[int] = []
    stream = ShuffleBuffer(size=64, rng=_rng(), initial=1000).shuffle(_counted(300, taken))
    next(stream)
    assert len(taken) == 64


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(0, 150),
    size=st.integers(0, 30),
    initial=st.integers(1, 35),
    max_bytes=st.one_of(st.none(), st.integers(1, 80)),
    cut=st.integers(0, 160),
    seed=st.integers(0, 5),
)
def test_growing_buffer_advance_then_shuffle_the_rest_equals_one_shuffle(n, size, initial, max_bytes, cut, seed):
    whole = list(_growing(size, initial, seed, max_bytes).shuffle(range(n)))
    assert sorted(whole) == list(range(n))
    buffer = _growing(size, initial, seed, max_bytes)
    items = iter(range(n))
    resident, held, _ = buffer.advance(items, cut)
    rest = list(buffer.follow(nbytes=buffer._nbytes).shuffle(items, resident=resident, held=held))
    assert whole[: min(cut, n)] + rest == whole


@settings(max_examples=100, deadline=None)
@given(
    size=st.integers(2, 40),
    initial=st.integers(1, 45),
    length=st.one_of(st.none(), st.integers(0, 300)),
    num_out=st.integers(0, 320),
    seed=st.integers(0, 5),
)
def test_growing_buffer_vectorized_advance_matches_the_step_by_step_one(size, initial, length, num_out, seed):
    slow = _growing(size, initial, seed)
    items = iter(range(10**9) if length is None else range(length))
    resident, _, taken = slow.advance(items, num_out)
    fast = _growing(size, initial, seed)
    assert fast.advance_indices(length=length, num_out=num_out) == (resident, taken)
    assert fast._target == slow._target
    assert [slow._uniform() for _ in range(3)] == [fast._uniform() for _ in range(3)]


def test_an_initial_fill_below_one_is_refused():
    with pytest.raises(UsageError, match="initial fill must be >= 1"):
        ShuffleBuffer(size=5, rng=_rng(), initial=0)
