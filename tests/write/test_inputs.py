"""JSONL rows: the scan's hot path agrees with the full parser, and rows the
shard writer takes from the spill give the bytes their lines give."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.write.extensions import TEXT_EXTENSIONS
from shardkit.write.sources.base import sample_size as _sample_size
from shardkit.write.sources.jsonl import _common_row, _jsonl_fields, pack_inline, unpack_inline
from shardkit.write.parallel import WriteOptions, write_dataset
from shardkit.write.plan import PlanReader
from tests.write.test_write_dataset import tree_bytes

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
keys = st.one_of(st.from_regex(r"[a-z0-9_-]{1,12}(/[a-z0-9]{1,5})?", fullmatch=True), st.text(max_size=12), st.just("a" * 98))
extensions = st.one_of(st.sampled_from(sorted(TEXT_EXTENSIONS) + ["jpg", "x.y", "Cls", "é", "a/b", "__meta"]), st.text(max_size=4))


@settings(max_examples=400, deadline=None)
@given(key=keys, row=st.dictionaries(extensions, json_values, max_size=4), indent=st.sampled_from([None, 1]), space=st.booleans())
def test_the_scans_hot_path_agrees_with_the_full_parser(key, row, indent, space):
    line = ((" " if space else "") + json.dumps({"__key__": key, **row}, indent=indent) + "\n").encode()
    common = _common_row(line)
    if common is None:
        return  # the full path alone decides (and names what is wrong)
    full_key, fields = _jsonl_fields(line, "rows.jsonl", "/nowhere", "/nowhere", lambda: 1)
    assert common == (full_key, tuple(ext for ext, *_ in fields), pack_inline(fields), _sample_size(full_key, [(e, n) for e, n, _, _ in fields]))
    assert unpack_inline(common[2]) == [(ext, data) for ext, _, _, data in fields]


def test_rows_from_the_spill_give_the_bytes_their_lines_give(tmp_path, monkeypatch):
    (tmp_path / "img.jpg").write_bytes(b"\xff\xd8 jpeg")
    rows = [{"__key__": f"r{i:03d}", "txt": "é" * (i % 5), "json": {"i": i, "b": [1.5, None]}, "cls": i % 3} for i in range(60)]
    rows += [{"__key__": "with/file", "jpg": "img.jpg", "txt": "x"}, {"__key__": "ünï", "txt": "non-ASCII key"}]
    rows += [{"__key__": "k" * 97, "json": "a name past 100 bytes"}, {"__key__": "dot.ted/k", "Cls": 7}]
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n  " + json.dumps({"__key__": "sp", "txt": "s"}) + "\n")
    options = WriteOptions(max_samples=16, seed=5, workers=1, partition_bytes=900)
    write_dataset(str(source), str(tmp_path / "spilled"), options=options)
    monkeypatch.setattr(PlanReader, "unchanged", lambda self, part: False)  # every row read from its line
    write_dataset(str(source), str(tmp_path / "lines"), options=options)
    assert tree_bytes(tmp_path / "spilled") == tree_bytes(tmp_path / "lines")
