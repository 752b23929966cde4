"""The columnar steps of `shardkit index` at 10^5 shards: names as numpy bytes arrays, never a Python object per shard."""

from __future__ import annotations

import numpy as np

from shardkit.format.table import build_table
from shardkit.write.indexer import _names_of, _Previous, index_name_for, naming_names, numbered

N = 100_000


def test_paths_from_a_bytes_array_round_trip_through_the_table():
    names = np.array([f"part-{i % 7}/ü{i:06d}.tar".encode() for i in range(N)])
    table = build_table(np.ones(N), np.ones(N), np.zeros((N, 32), np.uint8), paths=names,
                        index_paths=index_name_for(names), naming=None)
    assert table.path(0) == "part-0/ü000000.tar" and table.index_path(N - 1) == f"part-{(N - 1) % 7}/ü{N - 1:06d}.idx"
    assert np.array_equal(_names_of(table._columns["path_offsets"], table._columns["path_bytes"]), names)


def test_numbered_shards_get_a_naming_pattern_and_others_do_not():
    names = np.array([f"{i:05d}.tar".encode() for i in range(N)])
    naming = numbered(names)
    assert naming is not None and naming.shard == "{:05d}.tar" and naming.index == "{:05d}.idx"
    shards, indexes = naming_names(naming, N)
    assert np.array_equal(shards, names) and indexes[-1] == b"99999.idx"
    gap = np.delete(names, 500)  # img2dataset leaves a gap where a shard failed
    assert numbered(gap) is None
    assert numbered(np.array([b"00001.tar", b"00002.tar"])) is None
    assert numbered(np.array([b".h00000.tar"])) is None


def test_previous_run_is_matched_by_name_whatever_the_widths():
    old = np.sort(np.array([f"{i:06d}.tar".encode() for i in range(0, N, 2)]))
    previous = _Previous(old, np.arange(len(old)), np.zeros(len(old), np.int64), np.zeros((len(old), 32), np.uint8),
                         np.zeros(len(old), np.int64), index_name_for(old), ())
    now = np.array([f"{i:06d}.tar".encode() for i in range(N)] + [b"a-much-longer-name.tar"])
    rows = previous.match(now)
    assert rows[0] == 0 and rows[1] == -1 and rows[N - 2] == len(old) - 1 and rows[-1] == -1
    assert (rows >= 0).sum() == len(old)
