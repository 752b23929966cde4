"""The pure parts of shardkit.ray: how rows become shards and shards become read tasks (no cluster)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ray", reason="shardkit.ray needs `pip install 'shardkit[ray]'`")

from shardkit.errors import UsageError  # noqa: E402
from shardkit.io.base import SourceOptions  # noqa: E402
from shardkit.ray.datasource import plan_ranges, split_counts  # noqa: E402
from shardkit.ray.sink import plan_pieces, row_fields  # noqa: E402
from shardkit.write.limits import ShardLimits  # noqa: E402


def test_pieces_follow_block_order_and_cross_block_boundaries():
    sizes = [np.array([100] * 3), np.array([100] * 4), np.array([], dtype=np.int64), np.array([100] * 2)]
    plan = plan_pieces(sizes, limits=ShardLimits(max_samples=4, max_bytes=None))
    assert plan == [[(0, 0, 3), (1, 0, 1)], [(1, 1, 4), (3, 0, 1)], [(3, 1, 2)]]


def test_pieces_respect_max_bytes_and_give_an_oversized_row_its_own_shard():
    sizes = [np.array([400, 400, 5000, 400])]
    plan = plan_pieces(sizes, limits=ShardLimits(max_samples=None, max_bytes=2048))
    assert plan == [[(0, 0, 2)], [(0, 2, 3)], [(0, 3, 4)]]


def test_split_counts_are_near_equal_and_never_empty():
    assert split_counts(10, 3) == [4, 3, 3]
    assert split_counts(2, 5) == [1, 1]
    assert sum(split_counts(12345, 7)) == 12345


def test_ranges_cut_at_index_bounds_when_shards_are_few(make_shards):
    manifest = make_shards((5, 0, 3))
    whole = plan_ranges(manifest, 2, options=SourceOptions())
    assert [(r.first, r.last, r.start, r.end) for r in whole] == [(0, 5, 0, None), (0, 3, 0, None)]
    cut = plan_ranges(manifest, 6, options=SourceOptions())
    assert [(r.first, r.last) for r in cut] == [(0, 2), (2, 4), (4, 5), (0, 1), (1, 2), (2, 3)]
    assert cut[0].start == 0 and cut[0].end == cut[1].start and cut[2].end < manifest.shards[0].num_bytes


def test_rows_encode_like_the_writer_and_need_a_key():
    key, fields = row_fields({"__key__": "a1", "cls": 3, "jpg": b"\xff", "json": {"b": 1}, "__url__": "x", "txt": None}, "__key__")
    assert (key, fields) == ("a1", [("cls", b"3"), ("jpg", b"\xff"), ("json", b'{"b":1}')])
    with pytest.raises(UsageError, match="every row needs a non-empty string '__key__' column, got None"):
        row_fields({"jpg": b""}, "__key__")
