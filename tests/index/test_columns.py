"""The columnar steps of `shardkit index` at 10^5 shards: names as numpy bytes arrays, never a Python object per shard."""

from __future__ import annotations

import os
import shutil
import tracemalloc

import numpy as np
import pytest

from shardkit.format.table import Naming, build_table, open_table
from shardkit.index.columns import (
    INDEXED,
    RECORD,
    SKIPPED,
    ShardResults,
    published,
    write_table,
    write_versions,
)
from shardkit.index.source import list_shards
from shardkit.format.naming import NumberedNames, numbered
from shardkit.index.columns import index_name_for
from shardkit.index.previous import PreviousRun, names_of

N = 100_000


def test_paths_from_a_bytes_array_round_trip_through_the_table():
    names = np.array([f"part-{i % 7}/ü{i:06d}.tar".encode() for i in range(N)])
    table = build_table(np.ones(N), np.ones(N), np.zeros((N, 32), np.uint8), paths=names,
                        index_paths=index_name_for(names), naming=None)
    assert table.path(0) == "part-0/ü000000.tar" and table.index_path(N - 1) == f"part-{(N - 1) % 7}/ü{N - 1:06d}.idx"
    assert np.array_equal(names_of(table._columns["path_offsets"], table._columns["path_bytes"]), names)


def test_numbered_shards_get_a_naming_pattern_and_others_do_not():
    names = np.array([f"{i:05d}.tar".encode() for i in range(N)])
    naming = numbered(names)
    assert naming is not None and naming.shard == "{:05d}.tar" and naming.index == "{:05d}.idx"
    assert np.array_equal(NumberedNames(naming.shard, N)[np.arange(N)], names)
    assert NumberedNames(naming.index, N)[np.array([N - 1])][0] == b"99999.idx"
    gap = np.delete(names, 500)  # img2dataset leaves a gap where a shard failed
    assert numbered(gap) is None
    assert numbered(np.array([b"00001.tar", b"00002.tar"])) is None
    assert numbered(np.array([b".h00000.tar"])) is None


def test_previous_run_is_matched_by_name_whatever_the_widths():
    old = np.sort(np.array([f"{i:06d}.tar".encode() for i in range(0, N, 2)]))
    previous = PreviousRun(old, np.arange(len(old)), np.zeros(len(old), np.int64), np.zeros((len(old), 32), np.uint8),
                         np.zeros(len(old), np.int64), index_name_for(old), ())
    now = np.array([f"{i:06d}.tar".encode() for i in range(N)] + [b"a-much-longer-name.tar"])
    rows = previous.match(now)
    assert rows[0] == 0 and rows[1] == -1 and rows[N - 2] == len(old) - 1 and rows[-1] == -1
    assert (rows >= 0).sum() == len(old)


def _synthetic_results(path, n: int, *, skip_every: int = 0) -> ShardResults:
    """``n`` rows as `shardkit index` leaves them: indexed, some skipped."""
    results = ShardResults(str(path), n)
    rng = np.random.default_rng(0)
    for start in range(0, n, 4096):
        records = np.zeros(min(4096, n - start), dtype=RECORD)
        records["count"] = rng.integers(0, 500, len(records))
        records["size"] = rng.integers(1 << 10, 1 << 30, len(records))
        records["version"] = np.arange(start, start + len(records))
        records["sha256"] = rng.integers(0, 256, (len(records), 32), dtype=np.uint8)
        records["state"] = INDEXED
        if skip_every:
            records["state"][(np.arange(start, start + len(records)) % skip_every) == 0] = SKIPPED
        results.put(start, records)
    return results


@pytest.mark.parametrize("numbered_names", [True, False])
def test_table_written_piece_by_piece_is_the_table_built_in_memory(tmp_path, numbered_names):
    n = 5000
    if numbered_names:
        names = np.array([f"{i:05d}.tar".encode() for i in range(n)])
    else:
        names = np.array([f"part-{i % 7}/ü{i:06d}.tar".encode() for i in range(n)])
    with _synthetic_results(tmp_path / "results", n, skip_every=0 if numbered_names else 9) as results:
        rows = results.get(0, n)
        ok = published(rows)
        naming = numbered(names[start : start + len(r)][published(r)] for start, r in results.chunks(700))
        assert (naming is not None) == numbered_names
        with open(tmp_path / "table", "wb") as f:
            sha, size = write_table(f, results, names, naming)
        with open(tmp_path / "versions", "wb") as f:
            write_versions(f, results)
    paths = {} if naming else {"paths": names[ok], "index_paths": index_name_for(names[ok])}
    expected = build_table(rows["count"][ok], rows["size"][ok], rows["sha256"][ok], naming=naming, **paths)
    data = (tmp_path / "table").read_bytes()
    assert data == expected.encode() and len(data) == size and sha == expected.file_sha256()
    table = open_table(str(tmp_path / "table"), naming=naming, expected_size=size, expected_sha256=sha)
    assert table.num_shards == ok.sum() and table.num_samples == rows["count"][ok].sum()
    assert table.path(1) == (f"{1:05d}.tar" if numbered_names else "part-2/ü000002.tar")
    assert np.array_equal(np.load(tmp_path / "versions"), rows["version"][ok])


def test_table_building_memory_is_flat_in_the_number_of_shards(tmp_path, monkeypatch):
    """The table and versions sidecar are written from the results file a
    chunk at a time: at 10^5 shards the memory peak stays under what one
    full int64 column (0.8 MB), let alone a Python object per shard (a list
    of ints: 3.6 MB), would take."""
    import shardkit.index.columns as columns

    n = 100_000
    monkeypatch.setattr(columns, "CHUNK_ROWS", 1024)
    names = np.array([f"p{i % 3}/{i:07d}.tar".encode() for i in range(n)])  # paths stored: the costlier table

    def build(results: ShardResults, names: np.ndarray) -> Naming | None:
        naming = numbered(names[start : start + len(r)][published(r)] for start, r in results.chunks())
        with open(tmp_path / "table", "wb") as f:
            write_table(f, results, names, naming)
        with open(tmp_path / "versions", "wb") as f:
            write_versions(f, results)
        return naming

    with _synthetic_results(tmp_path / "warm", 3000, skip_every=11) as results:
        build(results, names[:3000])  # numpy's first-call costs, not counted
    with _synthetic_results(tmp_path / "results", n, skip_every=11) as results:
        tracemalloc.start()
        try:
            naming = build(results, names)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert naming is None
    assert open_table(str(tmp_path / "table"), naming=None).num_shards == n - len(range(0, n, 11))
    assert peak < 600_000, f"table building peaked at {peak} bytes for {n} shards"


def _shard_tree(root, n: int) -> None:
    """``n`` empty-named shards (hard links to one file) in two folders, plus files that are no shards."""
    root.mkdir()
    seed = root / "seed.bin"
    seed.write_bytes(b"\0" * 1024)
    for folder in ("b", "a/c"):
        (root / folder).mkdir(parents=True)
    for i in range(n):
        os.link(seed, root / ("b" if i % 3 else "a/c") / f"{(i * 7919) % n:06d}.tar")
    (root / "b" / "000000.parquet").write_bytes(b"PAR1")


def test_a_spilled_listing_is_the_listing_in_memory(tmp_path, monkeypatch):
    import shardkit.index.source as source

    _shard_tree(tmp_path / "src", 1000)
    monkeypatch.setattr(source, "RUN_ROWS", 97)  # 11 sorted runs to merge
    (tmp_path / "spill").mkdir()
    spilled = list_shards(str(tmp_path / "src"), spill=str(tmp_path / "spill"))
    memory = list_shards(str(tmp_path / "src"))
    try:
        assert spilled.num_shards == memory.num_shards == 1000
        for column in ("names", "sizes", "versions"):
            assert np.array_equal(getattr(spilled, column)[0:1000], getattr(memory, column))
        assert memory.names[0].startswith(b"a/c/") and (memory.names[1:] > memory.names[:-1]).all()  # sorted
        picked = np.array([5, 17, 999])
        assert np.array_equal(spilled.names[picked], memory.names[picked]) and spilled.name(-1) == memory.name(-1)
        assert sorted(os.listdir(tmp_path / "spill")) == ["listing.names", "listing.sizes", "listing.versions"]
    finally:
        spilled.close()


def test_listing_a_folder_memory_is_flat_in_the_number_of_shards(tmp_path, monkeypatch):
    """Spilled, the listing of 2*10^4 shards peaks under what a Python object
    per shard (a list of their names alone: ~1 MB) would take."""
    import shardkit.index.source as source

    monkeypatch.setattr(source, "RUN_ROWS", 1024)
    n = 20_000
    _shard_tree(tmp_path / "src", n)
    (tmp_path / "spill").mkdir()
    list_shards(str(tmp_path / "src"), spill=str(tmp_path / "spill")).close()  # first-call costs, not counted
    shutil.rmtree(tmp_path / "spill")
    (tmp_path / "spill").mkdir()
    tracemalloc.start()
    try:
        listing = list_shards(str(tmp_path / "src"), spill=str(tmp_path / "spill"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    listing.close()
    assert listing.num_shards == n
    assert peak < 700_000, f"listing peaked at {peak} bytes for {n} shards"


def test_a_numbered_previous_run_is_matched_without_an_array_of_its_names():
    naming = Naming(shard="part-{:05d}.tar", index="part-{:05d}.idx")
    shards = np.array([f"part-{i:05d}.tar".encode() for i in range(N)])
    names = NumberedNames(naming.shard, N)
    assert len(names) == N and np.array_equal(names[np.arange(N)], shards)
    assert list(NumberedNames(naming.index, N)[np.array([0, N - 1])]) == [b"part-00000.idx", b"part-99999.idx"]
    mask = np.zeros(N, dtype=bool)
    mask[[3, 77]] = True
    assert list(names[mask]) == [b"part-00003.tar", b"part-00077.tar"]
    asked = np.array([b"part-00042.tar", b"part-99999.tar", b"part-0042.tar", b"part-00042.tar.gz", b"x/part-00001.tar",
                      b"part-0004a.tar", b"part-00000.tar", b"Part-00001.tar"])
    assert list(names.rows_of(asked)) == [42, N - 1, -1, -1, -1, -1, 0, -1]
    assert list(NumberedNames(naming.shard, 50).rows_of(asked[:2])) == [42, -1]  # past the table's rows
    previous = PreviousRun(names, np.arange(N), np.zeros(N, np.int64), np.zeros((N, 32), np.uint8),
                         np.zeros(N, np.int64), NumberedNames(naming.index, N), ())
    assert list(previous.match(shards[[5, 6]])) == [5, 6]
