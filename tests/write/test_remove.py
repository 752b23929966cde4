"""Removing samples without rewriting shards (issue #41): ``remove_samples``
and ``shardkit remove`` leave the shards byte for byte, publish a new table
revision, and every reader (every mode, workers, ranks, ``IndexedDataset``,
mixtures, token blocks, resume) leaves the removed samples out."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import shardkit
from shardkit import IndexedDataset, ShardDataset, Stream, TokenBlocks, make_loader, remove_samples
from shardkit.errors import ManifestError, StateError, UsageError
from shardkit.format.manifest import REMOVED_VERSION, load_manifest
from shardkit.format.removed import kept_positions, pack, stored_positions, unpack
from tests.conftest import build_dataset, sample_payload
from tests.read.token_data import write_documents

SIZES = [9, 14, 0, 13, 7, 11]  # 54 samples
ALL_KEYS = sorted(f"s{shard:03d}_{i:05d}" for shard, n in enumerate(SIZES) for i in range(n))
#: A shard's first and last sample, a run of neighbours, samples of other shards.
REMOVED = ["s000_00000", "s001_00013", "s003_00005", "s003_00006", "s003_00007", "s005_00004"]
KEPT = sorted(set(ALL_KEYS) - set(REMOVED))


def _files(folder: str) -> dict[str, str]:
    """SHA-256 of each shard and index file in ``folder``."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith((".tar", ".idx")):
            with open(os.path.join(folder, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture
def removed(tmp_path) -> str:
    """A dataset of :data:`SIZES` with :data:`REMOVED` removed."""
    dest = str(tmp_path / "ds")
    build_dataset(dest, SIZES)
    report = remove_samples(dest, REMOVED)
    assert report.num_removed == len(REMOVED) and report.num_missing == 0
    return dest


def _keys(loader) -> list[str]:
    return [sample["__key__"] for sample in loader]


def _keys_of(samples: list[dict]) -> list[str]:
    return [s["__key__"] for s in samples]


# ------------------------------------------------------------------ the format


def test_kept_and_stored_positions_are_inverse():
    gone = np.array([0, 3, 4, 9])
    kept = np.setdiff1d(np.arange(12), gone)
    assert np.array_equal(stored_positions(gone, np.arange(len(kept))), kept)
    assert np.array_equal(kept_positions(gone, kept), np.arange(len(kept)))
    assert stored_positions(gone, 2) == 5 and kept_positions(gone, 5) == 2
    shards, positions = unpack(pack([3, 0, 3, 0], [7, 2, 1, 2]))
    assert shards.tolist() == [0, 3, 3] and positions.tolist() == [2, 1, 7]


def test_removal_leaves_shards_untouched_and_publishes_a_new_revision(tmp_path):
    dest = str(tmp_path / "ds")
    build_dataset(dest, SIZES)
    before, old = _files(dest), load_manifest(dest)
    report = remove_samples(dest, [*REMOVED, "no-such-key"])
    assert _files(dest) == before  # the same shards and indexes, byte for byte
    assert report.num_removed == len(REMOVED) and report.missing == ("no-such-key",) and report.num_missing == 1
    new = load_manifest(dest)
    assert new.loaded_version == REMOVED_VERSION and new.num_removed == len(REMOVED)
    assert new.num_samples == len(KEPT) and new.fingerprint != old.fingerprint == new.earlier_fingerprints[0]
    assert [f for f in os.listdir(dest) if f.endswith(".table")] == [os.path.basename(new.table.file)]
    with open(os.path.join(dest, "manifest.json")) as f:
        assert json.load(f)["removed"] == {"num_samples": len(REMOVED), "earlier_fingerprints": [old.fingerprint]}
    # Again: nothing changes, nothing is written.
    again = remove_samples(dest, REMOVED[:2])
    assert not again.changed and again.num_already_removed == 2 and again.fingerprint == new.fingerprint
    assert load_manifest(dest).table.file == new.table.file
    # A second removal adds to the first, and remembers both earlier revisions.
    remove_samples(dest, ["s004_00000"])
    third = load_manifest(dest)
    assert third.num_removed == len(REMOVED) + 1 and third.earlier_fingerprints == (old.fingerprint, new.fingerprint)
    assert sorted(_keys(ShardDataset(dest, mode="exact"))) == sorted(set(KEPT) - {"s004_00000"})


@pytest.mark.parametrize("mode", ["exact", "balanced", "infinite"])
def test_no_reader_yields_a_removed_sample_in_any_mode_over_ranks_and_workers(removed, mode):
    got: list[str] = []
    lengths = []
    for rank in range(2):
        ds = ShardDataset(removed, mode=mode, seed=4, rank=rank, world_size=2, buffer_size=6)
        if mode == "infinite":
            # A prefix of an endless stream: taken in worker round-robin order, so
            # which samples it holds does not depend on how fast each worker runs.
            loader = make_loader(ds, batch_size=None, num_workers=2, in_order=True)
            got += [s["__key__"] for s, _ in zip(loader, range(3 * len(KEPT)))]
            continue
        loader = make_loader(ds, batch_size=None, num_workers=2)
        keys = _keys(loader)
        lengths.append(len(keys))
        assert len(keys) == len(ds)
        got += keys
    assert not set(got) & set(REMOVED)
    if mode == "exact":
        assert sorted(got) == KEPT  # every kept sample once
    elif mode == "balanced":
        assert lengths[0] == lengths[1] == len(KEPT) // 2 and len(set(got)) == len(got)
    else:
        assert set(got) == set(KEPT)


def test_the_samples_read_are_the_bytes_written(removed):
    for sample in ShardDataset(removed, mode="exact"):
        assert sample["bin"] == sample_payload(sample["__key__"], 100)


def test_indexed_dataset_numbers_the_kept_samples(removed):
    ds = IndexedDataset(removed)
    assert len(ds) == len(KEPT)
    assert [ds[i]["__key__"] for i in range(len(ds))] == KEPT  # kept samples in stored order, renumbered
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda s: s["__key__"])
    assert sorted(loader) == KEPT


def test_a_checkpoint_mid_epoch_resumes_every_kept_sample_once(removed):
    def loader():
        ds = ShardDataset(removed, mode="exact", seed=7, buffer_size=10)
        return make_loader(ds, batch_size=3, num_workers=2, collate_fn=_keys_of)

    first = loader()
    it = iter(first)
    before = [k for _, batch in zip(range(4), it) for k in batch]
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    after = [k for batch in again for k in batch]
    assert sorted(before + after) == KEPT


def test_a_checkpoint_saved_before_the_removal_is_refused_with_what_to_do(tmp_path):
    dest = str(tmp_path / "ds")
    build_dataset(dest, SIZES)
    ds = ShardDataset(dest, mode="exact", seed=2, epoch=3)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    remove_samples(dest, REMOVED)
    with pytest.raises(StateError, match=r"saved before samples were removed.*set_epoch\(3\) without load_state_dict"):
        ShardDataset(dest, mode="exact", seed=2).load_state_dict(state)
    # As the message says: epoch 3 afresh, without the removed samples.
    fresh = ShardDataset(dest, mode="exact", seed=2)
    fresh.set_epoch(3)
    assert sorted(_keys(fresh)) == KEPT


def test_a_mixture_shares_and_reads_without_the_removed_samples(removed, tmp_path):
    other = str(tmp_path / "other")
    build_dataset(other, [20, 20])
    # Shares follow the streams' sizes: the kept samples, 48 and 40.
    ds = ShardDataset([Stream(removed, name="a"), Stream(other, name="b")], mode="exact", seed=1)
    got = list(make_loader(ds, batch_size=None, num_workers=2))
    assert len(got) == len(KEPT) + 40
    assert sorted(s["__key__"] for s in got if s["__stream__"] == "a") == KEPT  # each kept sample once


def test_token_blocks_leave_the_removed_documents_out(tmp_path):
    dest = str(tmp_path / "tokens")
    documents = write_documents(dest, 60, per_shard=7)
    report = remove_samples(dest, ["doc000003", "doc000016", "doc000017", "doc000040"])
    assert report.num_removed == 4
    by_key = {f"doc{i:06d}": ids for i, ids in enumerate(documents)}
    order = _keys(ShardDataset(dest, shuffle=False, mode="exact"))  # the stored order, less the removed
    assert len(order) == 56 and not {"doc000003", "doc000016", "doc000017", "doc000040"} & set(order)
    ds = ShardDataset(dest, tokens=TokenBlocks("tokens.npy", 32), mode="exact", shuffle=False)
    blocks = torch.cat(list(ds)).numpy()
    stream = np.concatenate([by_key[key] for key in order])
    assert np.array_equal(blocks, stream[: len(blocks)]) and len(blocks) == len(stream) // 32 * 32
    assert load_manifest(dest).table.tokens.sum() == len(stream)


def test_verify_passes_and_counts_them_and_info_reports_them(removed):
    run = subprocess.run([sys.executable, "-m", "shardkit", "verify", removed, "-q", "--workers", "1"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert f"{len(KEPT)} samples" in run.stdout and f"{len(REMOVED)} removed samples checked" in run.stdout
    info = subprocess.run([sys.executable, "-m", "shardkit", "info", removed], capture_output=True, text=True, timeout=120)
    assert f"samples:    {len(KEPT)} ({len(REMOVED)} removed" in info.stdout


def test_the_command_reads_keys_from_text_csv_and_parquet_and_says_what_is_missing(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    dest = str(tmp_path / "ds")
    build_dataset(dest, SIZES)
    lines = tmp_path / "keys.txt"
    lines.write_text(f"{REMOVED[0]}\n\n  {REMOVED[1]}  \nmissing-one\n")
    run = subprocess.run([sys.executable, "-m", "shardkit", "remove", dest, "--keys", str(lines), "-q"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 1 and "not found: missing-one" in run.stderr and "1 of 3 keys" in run.stderr
    assert "removed 2 samples" in run.stdout
    table = tmp_path / "keys.csv"
    with open(table, "w", newline="") as f:
        csv.writer(f).writerows([["url", "sample"], ["x", REMOVED[2]], ["y", REMOVED[3]]])
    run = subprocess.run([sys.executable, "-m", "shardkit", "remove", dest, "--keys", str(table), "--column", "sample",
                          "-q"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0 and "removed 2 samples" in run.stdout, run.stderr
    parquet = tmp_path / "keys.parquet"
    pq.write_table(pa.table({"key": REMOVED[4:] + REMOVED[:1]}), parquet)
    run = subprocess.run([sys.executable, "-m", "shardkit", "remove", dest, "--keys", str(parquet), "-q"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0 and "1 of the keys' samples were removed before" in run.stdout, run.stderr
    assert sorted(_keys(ShardDataset(dest, mode="exact"))) == KEPT
    bad = subprocess.run([sys.executable, "-m", "shardkit", "remove", dest, "--keys", str(parquet), "--column", "k"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "no column 'k' (it has key)" in bad.stderr


def test_a_remote_dataset_is_refused_naming_the_local_index_way():
    with pytest.raises(UsageError, match=r"shardkit index URL --out DIR"):
        remove_samples("https://example.com/data/", ["a"])


# ------------------------------------------------------------------ hostile tables


def _edit_manifest(dest: str, change) -> None:  # noqa: ANN001 - a function of the parsed JSON
    """Rewrite ``dest``'s manifest.json with ``change`` applied to its JSON."""
    path = os.path.join(dest, "manifest.json")
    with open(path) as f:
        doc = json.load(f)
    change(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def _table_with(dest: str, packed: np.ndarray) -> None:
    """Rewrite ``dest``'s table with this ``removed`` column, checks bypassed."""
    from shardkit.format.table import encode_columns, table_name

    columns = dict(load_manifest(dest).table._columns)
    columns["removed"] = packed.astype("<u8")
    data = encode_columns([columns[n] for n in ("starts", "counts", "num_bytes", "sha256", "removed")])
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(dest, table_name(digest)), "wb") as f:
        f.write(data)

    def point_at_it(doc: dict) -> None:
        doc["table"] = {"path": table_name(digest), "num_bytes": len(data), "sha256": digest}
        doc["removed"]["num_samples"] = len(packed)

    _edit_manifest(dest, point_at_it)


@pytest.mark.parametrize(
    "packed,problem",
    [
        (pack([1, 0], [2, 2])[::-1].copy(), "does not rise strictly"),
        (pack([9], [0]), "names shard 9, the table has 6 shards"),
        (pack([0], [40]), "names sample 40 of shard 0, which holds 9 samples"),
    ],
)
def test_a_damaged_removed_column_is_refused_naming_the_table(removed, packed, problem):
    _table_with(removed, packed)
    with pytest.raises(ManifestError, match=rf"damaged shard table: column removed {problem}"):
        load_manifest(removed)


def test_a_manifest_whose_removed_count_disagrees_with_its_table_is_refused(removed):
    _edit_manifest(removed, lambda doc: doc["removed"].update(num_samples=2))
    with pytest.raises(ManifestError, match=r"says 2 samples were removed, its shard table lists 6 removed samples"):
        load_manifest(removed)


def test_an_older_format_manifest_with_a_removed_block_is_refused(removed):
    _edit_manifest(removed, lambda doc: doc.update(format_version=2))
    with pytest.raises(ManifestError, match=r"'removed' must be present in format 4 and only there"):
        load_manifest(removed)


def test_bad_keys_files_are_clear_errors(tmp_path):
    from shardkit.revise.remove import read_keys

    with pytest.raises(UsageError, match="no such keys file"):
        read_keys(str(tmp_path / "none.txt"))
    text = tmp_path / "k.txt"
    text.write_text("a\n")
    with pytest.raises(UsageError, match="--column needs a .parquet or .csv file"):
        read_keys(str(text), column="key")
    assert shardkit.remove_samples is remove_samples


def test_resharding_the_tar_files_is_refused_and_writing_from_the_reader_leaves_them_out(removed, tmp_path):
    from shardkit.errors import SourceError

    with pytest.raises(SourceError, match=r"6 samples were removed.*would bring them back"):
        shardkit.write_dataset(removed, str(tmp_path / "again"))
    shardkit.write_dataset(IndexedDataset(removed), str(tmp_path / "clean"))
    assert sorted(_keys(ShardDataset(str(tmp_path / "clean"), mode="exact"))) == KEPT
