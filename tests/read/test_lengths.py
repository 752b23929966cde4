"""shardkit.token_counts (issue #55): each sample's recorded token count,
without reading a sample; removed samples left out as every reader leaves them."""

from __future__ import annotations

import numpy as np
import pytest

import shardkit
from shardkit.errors import UsageError
from tests.read.token_data import write_documents


def test_token_counts_are_each_samples_length_in_reading_order(tmp_path):
    dest = str(tmp_path / "docs")
    documents = write_documents(dest, 60, per_shard=9)
    by_key = {f"doc{i:06d}": len(d) for i, d in enumerate(documents)}
    indexed = shardkit.IndexedDataset(dest)
    keys = [indexed.raw_sample(i).key for i in range(len(indexed))]
    counts = shardkit.token_counts(dest, "tokens.npy")
    assert counts.dtype == np.int64 and counts.tolist() == [by_key[k] for k in keys]
    manifest = shardkit.load_manifest(dest)
    assert shardkit.token_counts(dest, "tokens.npy", shard=2).tolist() == counts[18:27].tolist()
    assert int(counts.sum()) == int(manifest.table.tokens[:, 0].sum())
    gone = keys[3:7]
    shardkit.remove_samples(dest, gone)
    assert shardkit.token_counts(dest, "tokens.npy").tolist() == [by_key[k] for k in keys if k not in gone]
    with pytest.raises(UsageError, match="no token counts of field 'txt'"):
        shardkit.token_counts(dest, "txt")


def test_gather_states_is_exported_at_the_top():
    """(What it gathers is tested under torchrun: tests/read/test_torchrun_resume.py.)"""
    from shardkit.read.resume.state import gather_states

    assert shardkit.gather_states is gather_states and "gather_states" in shardkit.__all__
