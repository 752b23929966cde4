"""The one sample encoder: arrays stored as np.save stores them, named fields by their last part."""

from __future__ import annotations

import io

import numpy as np
import pytest

from shardkit.write.encode import npy_bytes, sample_fields


def _saved(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "array",
    [
        np.arange(5, dtype=np.int32),
        np.zeros((3, 4), np.float16),
        np.ones((2, 3, 4), ">f8"),
        np.arange(12).reshape(3, 4).T,  # not C-ordered: np.save's own path
        np.zeros((0,), np.uint8),
        np.array([True, False]),
        np.zeros(3, dtype=[("a", "<i4")]),
        np.array(["ab", "c"]),
        np.zeros(2, complex),
    ],
    ids=lambda a: f"{a.dtype}{a.shape}",
)
def test_npy_bytes_are_np_saves_bytes(array):
    assert npy_bytes(array) == _saved(array)
    assert np.array_equal(np.load(io.BytesIO(npy_bytes(array))), array)


def test_object_arrays_are_refused_not_pickled():
    with pytest.raises(ValueError):
        npy_bytes(np.array([{"a": 1}], dtype=object))


def test_named_fields_are_encoded_by_their_last_part():
    key, fields = sample_fields({"__key__": "k1", "tokens.npy": np.arange(3, dtype=np.int32), "cls": np.int64(7)})
    assert key == "k1"
    assert dict(fields) == {"cls": b"7", "tokens.npy": _saved(np.arange(3, dtype=np.int32))}
