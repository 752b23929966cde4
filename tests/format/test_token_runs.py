"""run_token_arrays, the token reader's read of a run of documents as
arrays: the same ids and counts as token_array reads document by document,
wherever it answers; None (the reader then reads document by document, and
names what is wrong) for anything else."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardkit.format.plain import plain_run
from shardkit.format.tar import END_OF_ARCHIVE, encode_sample
from shardkit.format.tokens import run_token_arrays, token_array

INTEGERS = ["<u2", "|u1", "<i4", "<i8", "<u8", ">i2", "|i1", "<u4"]


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def run_of(fields: list[bytes]):
    parts = [encode_sample(f"d{i:05d}", [("tokens.npy", data)]) for i, data in enumerate(fields)]
    bounds = np.cumsum([0] + [len(p) for p in parts])
    run = plain_run(b"".join(parts) + END_OF_ARCHIVE, 0, 0, bounds, "tokens.npy")
    assert run is not None and len(run) == len(fields)
    return run


def one_by_one(run):
    arrays = [token_array(run.sample(i).fields["tokens.npy"]) for i in range(len(run))]
    return None if any(a is None for a in arrays) else arrays


@pytest.mark.parametrize("dtype", INTEGERS)
def test_what_numpy_writes_is_read_as_one_array(dtype):
    docs = [np.arange(n, dtype=dtype) for n in (0, 1, 9, 10, 123, 4000)]
    ids, counts = run_token_arrays(run_of([npy(d) for d in docs]))
    assert counts.tolist() == [len(d) for d in docs]
    assert ids.dtype.str[1:] == np.dtype(dtype).str[1:] and np.array_equal(ids, np.concatenate(docs))  # any byte order


@pytest.mark.parametrize(
    "field",
    [
        npy(np.zeros((2, 3), dtype=np.uint16)),  # two dimensions
        npy(np.zeros(5, dtype=np.float32)),  # not integers
        npy(np.zeros(5, dtype=np.int32)),  # another dtype than the first document's
        npy(np.zeros(5, dtype=np.uint16))[:-1],  # shorter than its header says
        npy(np.zeros(5, dtype=np.uint16)) + b"\0\0",  # longer
        npy(np.zeros(5, dtype=np.uint16)).replace(b"'fortran_order': False, ", b"").replace(b"}", b"}" + b" " * 24),
        npy(np.zeros(5, dtype=np.uint16)).replace(b"(5,), }", b"(5,1),}"),  # two dimensions, the data of one
        b"plain text, no array",
    ],
    ids=["2d", "float", "dtype", "short", "long", "other-form", "2d-header", "text"],
)
def test_anything_else_is_left_to_the_one_by_one_read(field):
    run = run_of([npy(np.arange(7, dtype=np.uint16)), field, npy(np.arange(3, dtype=np.uint16))])
    assert run_token_arrays(run) is None


@settings(max_examples=400, deadline=None)
@given(
    dtype=st.sampled_from(INTEGERS),
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    edits=st.lists(st.tuples(st.integers(0, 10**5), st.integers(0, 255)), max_size=2),
)
@example(dtype="<u2", lengths=[5], edits=[(58, ord("1"))])  # another count, the data's length unchanged
@example(dtype="<u2", lengths=[5], edits=[(9, 0)])  # a header length that is no header's
@example(dtype="<u2", lengths=[5], edits=[(6, 2)])  # version 2: a four-byte header length
@example(dtype="<u2", lengths=[50], edits=[(70, ord(" "))])  # a shape without its tail
def test_damaged_documents_give_the_one_by_one_answer_or_none(dtype, lengths, edits):
    fields = [bytearray(npy(np.arange(n, dtype=dtype))) for n in lengths]
    for at, value in edits:
        field = fields[at % len(fields)]
        field[(at // len(fields)) % len(field)] = value
    run = run_of([bytes(f) for f in fields])
    found, expected = run_token_arrays(run), one_by_one(run)
    if found is None:
        assert expected is None or edits  # what numpy writes, undamaged, is read as arrays
        return
    ids, counts = found
    assert expected is not None and counts.tolist() == [len(a) for a in expected]
    assert ids.dtype.str[1:] == expected[0].dtype.str[1:] and np.array_equal(ids, np.concatenate(expected))
