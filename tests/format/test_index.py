"""The .npy offset index: what NumPy writes loads back, anything else is refused by name."""

from __future__ import annotations

import io

import numpy as np
import pytest

from shardkit.errors import CorruptShardError
from shardkit.format.index import decode_index, encode_index, load_index


def _npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array, version=version, allow_pickle=False)
    return out.getvalue()


@pytest.mark.parametrize("version", [None, (1, 0), (2, 0), (3, 0)])
def test_indexes_numpy_writes_load_back_mapped_and_decoded(tmp_path, version):
    bounds = np.array([0, 1536, 3072, 10_000_000_000], dtype="<u8")
    data = _npy(bounds, version)
    path = tmp_path / "s.idx"
    path.write_bytes(data)
    assert load_index(str(path)).tolist() == bounds.tolist()
    assert decode_index(data).tolist() == bounds.tolist()
    assert decode_index(encode_index(bounds)).tolist() == bounds.tolist()


@pytest.mark.parametrize(
    "data, why",
    [
        (_npy(np.array([0, 512], dtype="<f8")), "dtype '<f8'"),
        (_npy(np.array([0, 512], dtype=">u8")), "dtype '>u8'"),
        (_npy(np.zeros((2, 2), dtype="<u8")), "1-D"),
        (_npy(np.zeros(0, dtype="<u8")), "empty"),
        (_npy(np.array([0, 512, 1024], dtype="<u8"))[:-8], "shorter than its header"),
        (b"\x93NUMPX" + bytes(100), "magic"),
        (_npy(np.array([5, 512], dtype="<u8")), "starting at 0"),
    ],
)
def test_anything_else_is_refused_naming_the_file(tmp_path, data, why):
    path = tmp_path / "bad.idx"
    path.write_bytes(data)
    with pytest.raises(CorruptShardError, match=why) as info:
        load_index(str(path))
    assert str(path) in str(info.value)
    with pytest.raises(CorruptShardError, match=why):
        decode_index(data, path="http://host/bad.idx")


def test_missing_index_says_what_to_do(tmp_path):
    with pytest.raises(CorruptShardError, match="offset index is corrupt: the file is missing.*shardkit verify"):
        load_index(str(tmp_path / "none.idx"))


def test_loading_an_index_never_goes_through_ast(tmp_path, monkeypatch):
    # np.load parses .npy headers with ast.literal_eval, and CPython 3.11 keeps
    # the AST recursion counter per interpreter, not per thread: reader threads
    # loading indexes at once could corrupt it, and every DataLoader worker
    # forked afterwards then fails ("AST constructor recursion depth
    # mismatch"). So the index loaders must not touch ast at all.
    import ast

    def refuse(*args, **kwargs):
        raise AssertionError("ast used while loading an index")

    path = tmp_path / "s.idx"
    data = encode_index(np.arange(0, 512 * 1000, 512))
    path.write_bytes(data)
    monkeypatch.setattr(ast, "literal_eval", refuse)
    assert len(load_index(str(path))) == 1000
    assert len(decode_index(data)) == 1000
