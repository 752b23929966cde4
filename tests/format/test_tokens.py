"""Token counts (#40): which fields count, the third array of an offset index,
the table's ``tokens`` column and the manifest's ``token_fields``."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardkit.errors import CorruptShardError, ManifestError
from shardkit.format.index import (
    MAX_TOKEN_FIELDS,
    decode_offset_index,
    encode_index,
    load_offset_index,
    max_index_bytes,
    read_document_tokens,
    read_index_file,
)
from shardkit.format.manifest import Manifest, load_manifest
from shardkit.format.npy import parse_npy_header
from shardkit.format.table import WRITER_NAMING, build_table, encode_columns, open_table
from shardkit.format.tokens import TokenTally, dataset_tokens, token_count
from shardkit.io.index import fetch_document_tokens, fetch_offset_index


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", ">i4"])
def test_a_1d_integer_array_of_any_integer_dtype_counts(dtype):
    assert token_count(npy(np.arange(7, dtype=dtype))) == 7
    assert token_count(npy(np.zeros(0, dtype=dtype))) == 0


@pytest.mark.parametrize(
    "data",
    [
        npy(np.zeros((2, 3), dtype=np.int32)),  # 2-D
        npy(np.zeros(3, dtype=np.float32)),  # floats
        npy(np.zeros(3, dtype=bool)),
        npy(np.int64(5)),  # 0-D
        npy(np.arange(4, dtype=np.int32))[:-1],  # fewer bytes than the header says
        npy(np.arange(4, dtype=np.int32)) + b"\0",  # more
        b"not an npy file",
        b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 100,  # a header running past the data
    ],
)
def test_anything_else_does_not_count(data):
    assert token_count(data) is None


def test_the_header_parser_evaluates_nothing():
    header = parse_npy_header(npy(np.zeros((4, 2), dtype="<u4")))
    assert header.shape == (4, 2) and header.dtype() == np.dtype("<u4") and not header.fortran_order
    crafted = b"\x93NUMPY\x01\x00" + (60).to_bytes(2, "little") + b"{'descr': __import__('os'), 'shape': (1,)}".ljust(60)
    with pytest.raises(ValueError, match="no plain dtype"):
        parse_npy_header(crafted)


def test_a_field_that_is_not_tokens_in_every_sample_is_not_a_token_field():
    tally = TokenTally()
    tally.add([("tokens.npy", npy(np.arange(3, dtype=np.uint16))), ("emb.npy", npy(np.zeros(2, np.int8)))])
    tally.add([("txt", b"no tokens here")])  # lacks both: counts 0
    tally.add([("tokens.npy", npy(np.arange(5, dtype=np.uint16))), ("emb.npy", npy(np.zeros((2, 2), np.int8)))])
    tally.skip()
    assert tally.fields == ("tokens.npy",)
    assert tally.counts().tolist() == [[3], [0], [5], [0]]


def test_shards_that_disagree_record_no_counts(caplog):
    fields, column = dataset_tokens([("a.npy",), (), ("a.npy",)], [(3,), (), (4,)], [2, 0, 2])
    assert fields == ("a.npy",) and column.tolist() == [[3], [0], [4]]  # an empty shard agrees with anything
    fields, column = dataset_tokens([("a.npy",), ("b.npy",)], [(3,), (4,)], [2, 2], ["x.tar", "y.tar"])
    assert fields == () and column is None
    assert "y.tar has token fields ['b.npy'], x.tar has ['a.npy']" in caplog.text


# ---------------------------------------------------------------- the third array of an index


def _index(counts: np.ndarray) -> bytes:
    n = len(counts)
    return encode_index(np.arange(n + 1, dtype=np.uint64) * 512, np.zeros(n, dtype=np.uint32), counts)


@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 9)), min_size=1, max_size=40))
def test_counts_follow_the_checksums_and_every_reader_still_reads_the_rest(rows):
    counts = np.array(rows, dtype=np.int64)
    data = _index(counts)
    n = len(counts)
    assert np.load(io.BytesIO(data)).tolist() == [512 * i for i in range(n + 1)]  # np.load: the boundaries
    assert len(data) <= max_index_bytes(n)
    assert decode_offset_index(data).bounds.tolist() == [512 * i for i in range(n + 1)]
    view = memoryview(data)
    got = read_document_tokens(lambda at, size: bytes(view[at : at + size]), len(data), path="x.idx",
                               num_samples=n, totals=counts.sum(axis=0))
    assert got.dtype == np.int64 and got.tolist() == counts.tolist()
    stored = np.lib.format.read_array  # the third array is a plain .npy array: uint32, or int64 when needed
    stream = io.BytesIO(data)
    for _ in range(3):
        last = stored(stream, allow_pickle=False)
    assert last.dtype == (np.dtype("<u4") if counts.max() < 2**32 else np.dtype("<i8"))


def test_local_readers_accept_an_index_with_counts(tmp_path):
    counts = np.array([[3], [4]], dtype=np.int64)
    path = tmp_path / "s.idx"
    path.write_bytes(_index(counts))
    index = load_offset_index(str(path), max_bytes=max_index_bytes(2))
    assert index.bounds.tolist() == [0, 512, 1024] and index.checksums.tolist() == [0, 0]
    fd = os.open(path, os.O_RDONLY)
    try:
        bounds, layout = read_index_file(fd, os.fstat(fd).st_size, path=str(path), max_bytes=max_index_bytes(2))
    finally:
        os.close(fd)
    assert bounds.tolist() == [0, 512, 1024] and layout.checksums_at is not None
    assert fetch_offset_index(str(path), num_samples=2).bounds.tolist() == [0, 512, 1024]
    assert fetch_document_tokens(str(path), num_samples=2, totals=np.array([7])).tolist() == [[3], [4]]


def _crafted(third: bytes) -> bytes:
    """An index of 2 samples whose third array is ``third`` as given."""
    return encode_index([0, 512, 1024], [0, 0]) + third


@pytest.mark.parametrize(
    ("data", "totals", "why"),
    [
        (_index(np.array([[3], [4]])), [8], "add up to 7, the shard table says 8"),
        (_crafted(npy(np.array([3, 4], dtype="<u4"))), [7], r"shape \(2,\), want"),
        (_crafted(npy(np.array([[3, 1], [4, 1]], dtype="<u4"))), [7], r"shape \(2, 2\)"),
        (_crafted(npy(np.array([[3], [4]], dtype="<f8"))), [7], "'<f8'"),
        (_crafted(npy(np.array([[3], [-4]], dtype="<i8"))), [-1], "negative token count"),
        (_crafted(npy(np.array([[3], [4]], dtype="<u4"))[:-2]), [7], "need bytes up to"),
        (_crafted(npy(np.array([[3], [4]], dtype="<u4")) + b"junk"), [7], "need bytes up to"),
        (_crafted(b"\x93NUMPY\x02\x00" + (1 << 30).to_bytes(4, "little") + b"{"), [7], "header cut short"),
        (_crafted(b"garbage"), [7], "not a .npy array"),
        (encode_index([0, 512, 1024], [0, 0]), [7], "holds no token counts"),
        (encode_index([0, 512, 1024]), [7], "holds no token counts"),
        (encode_index([0, 512], [0]), [7], "lists 1 samples but the manifest says 2"),
        (_crafted(bytes(max_index_bytes(2, 1))), [7], "more than an index"),
    ],
)
def test_crafted_counts_are_refused_naming_the_file(tmp_path, data, totals, why):
    path = tmp_path / "bad.idx"
    path.write_bytes(data)
    with pytest.raises(CorruptShardError, match=why) as info:
        fetch_document_tokens(str(path), num_samples=2, totals=np.array(totals))
    assert str(info.value).startswith(f"{path}: offset index is corrupt")


def test_a_missing_index_is_named(tmp_path):
    with pytest.raises(CorruptShardError, match="the file is missing"):
        fetch_document_tokens(str(tmp_path / "none.idx"), num_samples=1, totals=np.array([1]))


# ---------------------------------------------------------------- the table and the manifest


def _manifest(tmp_path, tokens, fields) -> Manifest:
    table = build_table([2, 3], [2048, 3072], ["0" * 64, "1" * 64], tokens=tokens)
    return Manifest.from_table(table, token_fields=fields, location=str(tmp_path))


def _publish(tmp_path, manifest: Manifest) -> None:
    for name, data in manifest.to_files():
        (tmp_path / name).write_bytes(data)


def test_token_counts_go_into_a_last_column_and_a_format3_manifest(tmp_path):
    manifest = _manifest(tmp_path, np.array([[5, 1], [7, 2]]), ("a.npy", "tokens.npy"))
    _publish(tmp_path, manifest)
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["format_version"] == 3 and data["token_fields"] == ["a.npy", "tokens.npy"]
    loaded = load_manifest(str(tmp_path))
    assert loaded.token_fields == ("a.npy", "tokens.npy") and loaded.loaded_version == 3
    assert loaded.table.tokens.dtype == np.int64 and loaded.table.tokens.tolist() == [[5, 1], [7, 2]]


def test_without_token_fields_nothing_changes(tmp_path):
    plain = build_table([2, 3], [2048, 3072], ["0" * 64, "1" * 64])
    manifest = Manifest.from_table(plain, location=str(tmp_path))
    assert plain.tokens is None and "token_fields" not in manifest.to_dict()
    assert manifest.to_dict()["format_version"] == 2
    assert plain.encode() == encode_columns([plain.starts, plain.counts, plain.num_bytes, plain.sha256])


@pytest.mark.parametrize(
    ("tokens", "why"),
    [
        (np.array([[1], [2], [3]], dtype=np.int64), r"column tokens has shape \(3, 1\), the table has 2 shards"),
        (np.array([1, 2], dtype=np.int64), r"column tokens has shape \(2,\)"),
        (np.array([[1], [-2]], dtype=np.int64), "a negative token count"),
        (np.array([[1], [2]], dtype=np.float64), "column tokens has dtype float64"),
    ],
)
def test_a_damaged_tokens_column_is_refused_naming_the_table(tmp_path, tokens, why):
    columns = [np.array([0, 2, 5]), np.array([2, 3]), np.array([10, 20]), np.zeros((2, 32), dtype=np.uint8)]
    path = tmp_path / "shards-0000000000000000.table"
    path.write_bytes(encode_columns([*columns, tokens]))
    with pytest.raises(ManifestError, match=why) as info:
        open_table(str(path), naming=WRITER_NAMING)
    assert str(info.value).startswith(f"{path}: damaged shard table")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"token_fields": ["a.npy"]}, "counts tokens of 2 fields, the manifest names 1"),
        ({"token_fields": "a.npy"}, "'token_fields' must be a list"),
        ({"token_fields": ["a.npy", "a.npy"]}, "'token_fields' must be a list of 1 to 4 distinct"),
        ({"token_fields": [f"f{i}.npy" for i in range(MAX_TOKEN_FIELDS + 1)]}, "'token_fields' must be"),
        ({"format_version": 2}, "'token_fields' must be .* in format 3"),
    ],
)
def test_a_manifest_whose_token_fields_disagree_is_refused(tmp_path, change, why):
    _publish(tmp_path, _manifest(tmp_path, np.array([[5, 1], [7, 2]]), ("a.npy", "tokens.npy")))
    data = json.loads((tmp_path / "manifest.json").read_text())
    data.update(change)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=why):
        load_manifest(str(tmp_path))


def test_a_format3_manifest_without_its_column_is_refused(tmp_path):
    _publish(tmp_path, _manifest(tmp_path, None, ()))
    data = json.loads((tmp_path / "manifest.json").read_text())
    data.update(format_version=3, token_fields=["tokens.npy"])
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="counts tokens of 0 fields, the manifest names 1"):
        load_manifest(str(tmp_path))
