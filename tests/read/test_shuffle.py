"""ShuffleBuffer and the shuffle-quality measures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
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
