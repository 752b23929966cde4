"""ShardCatalog's token-count accessors (#40): what the token reader splits
an epoch by, read from the table and the offset indexes, local and remote."""

from __future__ import annotations

import numpy as np
import pytest

from shardkit import write_dataset
from shardkit.errors import CorruptShardError, UsageError
from shardkit.format.index import encode_index
from shardkit.io.base import SourceOptions
from shardkit.read.catalog import resolve_catalog
from shardkit.write.parallel import WriteOptions
from tests.write import map_functions as fns


@pytest.fixture
def corpus(tmp_path):
    """60 documents of ``i % 11`` uint16 tokens in 5 shards, in order."""
    dest = tmp_path / "corpus"
    write_dataset(range(60), str(dest), map=fns.token_ids, options=WriteOptions(workers=1, max_samples=12, shuffle=False))
    return dest


def test_counts_per_shard_and_per_document(corpus, tmp_path):
    catalog = resolve_catalog(str(corpus), options=SourceOptions())
    assert catalog.token_fields == ("tokens.npy",)
    totals = catalog.shard_tokens("tokens.npy")
    lengths = np.arange(60) % 11
    assert totals.dtype == np.int64 and totals.tolist() == [int(lengths[i : i + 12].sum()) for i in range(0, 60, 12)]
    for shard in range(5):
        counts = catalog.document_tokens(shard, "tokens.npy")
        assert counts.dtype == np.int64 and counts.tolist() == lengths[12 * shard : 12 * shard + 12].tolist()
    with pytest.raises(IndexError):
        catalog.document_tokens(5, "tokens.npy")


def test_a_field_without_counts_is_refused_saying_which_have_them(corpus):
    catalog = resolve_catalog(str(corpus), options=SourceOptions())
    with pytest.raises(UsageError, match=r"no token counts of field 'txt'; the dataset records counts of "
                                         r"'tokens.npy'.*`shardkit index DIR`.*`shardkit write`"):  # fmt: skip
        catalog.shard_tokens("txt")
    with pytest.raises(UsageError, match="no token counts of field 'txt'"):
        catalog.document_tokens(0, "txt")


def test_shards_without_a_manifest_have_no_counts(corpus):
    catalog = resolve_catalog(str(corpus / "shard-000000.tar"), options=SourceOptions())
    assert catalog.token_fields == ()
    with pytest.raises(UsageError, match="records no token counts"):
        catalog.shard_tokens("tokens.npy")


def test_an_index_whose_counts_disagree_with_the_table_is_named(corpus):
    catalog = resolve_catalog(str(corpus), options=SourceOptions())
    index = corpus / "shard-000001.idx"
    bounds = np.load(index)
    counts = np.ones((12, 1), dtype=np.int64)
    index.write_bytes(encode_index(bounds, np.zeros(12, dtype=np.uint32), counts))
    with pytest.raises(CorruptShardError, match=f"{index}: offset index is corrupt: its token counts of column 0 "
                                                "add up to 12, the shard table says"):  # fmt: skip
        catalog.document_tokens(1, "tokens.npy")


def test_remote_counts_come_in_one_bounded_request(corpus, http_server, tmp_path):
    for path in corpus.iterdir():
        http_server.add(f"/corpus/{path.name}", path.read_bytes())
    options = SourceOptions(cache_dir=str(tmp_path / "cache"))
    catalog = resolve_catalog(http_server.base_url + "/corpus/", options=options)
    assert catalog.token_fields == ("tokens.npy",)
    counts = catalog.document_tokens(2, "tokens.npy", options=options)
    assert counts.tolist() == (np.arange(24, 36) % 11).tolist()
    assert len(http_server.gets("/corpus/shard-000002.idx")) == 1
