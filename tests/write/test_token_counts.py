"""The writer records token counts (#40): per shard in the table, per sample
in each offset index, for ``write_dataset`` (a map function's arrays
included), ``shardkit write`` and ``ShardWriter``; a dataset without token
fields is written byte for byte as before."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import ShardWriter, write_dataset
from shardkit.cli import main
from shardkit.read.catalog import from_manifest
from shardkit.write.parallel import WriteOptions
from tests.write import map_functions as fns


def _check_counts(dest: Path, field: str, lengths: dict[str, int]) -> shardkit.Manifest:
    """The manifest records ``field``, and every shard's total and each
    sample's count (by key) are ``lengths``."""
    manifest = shardkit.load_manifest(str(dest))
    assert manifest.token_fields == (field,)
    catalog = from_manifest(manifest)
    totals = catalog.shard_tokens(field)
    assert totals.dtype == np.int64 and int(totals.sum()) == sum(lengths.values())
    for shard in range(manifest.num_shards):
        index = dest / manifest.shards[shard].index
        bounds = np.load(index)  # np.load still reads the boundaries
        assert len(bounds) == manifest.shards[shard].num_samples + 1
        keys = _keys(dest / manifest.shards[shard].path)
        counts = catalog.document_tokens(shard, field)
        assert counts.tolist() == [lengths.get(k, 0) for k in keys]
        assert int(totals[shard]) == int(counts.sum())
    return manifest


def _keys(shard: Path) -> list[str]:
    import tarfile

    keys: list[str] = []
    with tarfile.open(shard) as tar:
        for member in tar.getmembers():
            key = member.name.partition(".")[0]
            if not keys or keys[-1] != key:
                keys.append(key)
    return keys


@pytest.mark.parametrize("workers", [1, 2])
def test_a_map_function_returning_token_arrays_has_them_counted(tmp_path, workers):
    dest = tmp_path / "out"
    write_dataset(range(60), str(dest), map=fns.token_ids, options=WriteOptions(workers=workers, max_samples=13, seed=1))
    manifest = _check_counts(dest, "tokens.npy", {f"{i:06d}": i % 11 for i in range(60)})
    data = json.loads((dest / "manifest.json").read_text())
    assert data["format_version"] == 3 and data["token_fields"] == ["tokens.npy"]
    assert manifest.num_shards == 5


def test_one_and_two_workers_write_the_same_counts(tmp_path):
    for workers in (1, 2):
        write_dataset(range(40), str(tmp_path / f"w{workers}"), map=fns.token_ids,
                      options=WriteOptions(workers=workers, max_samples=9, seed=3))  # fmt: skip
    digests = [
        {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((tmp_path / f"w{w}").iterdir())}
        for w in (1, 2)
    ]
    assert digests[0] == digests[1]


def test_a_field_that_is_floats_in_one_sample_is_not_counted(tmp_path, caplog):
    dest = tmp_path / "out"
    write_dataset(range(20), str(dest), map=fns.tokens_then_floats, options=WriteOptions(workers=1, max_samples=8))
    manifest = shardkit.load_manifest(str(dest))
    assert manifest.token_fields == () and manifest.table.tokens is None
    assert json.loads((dest / "manifest.json").read_text())["format_version"] == 2
    # the shard holding item 5 has no token field; the first other one has tokens.npy
    assert re.search(r"shard-00000\d.tar has token fields \[\], shard-00000\d.tar has \['tokens.npy'\]: the dataset "
                     "records no token counts", caplog.text)  # fmt: skip
    with pytest.raises(shardkit.UsageError, match=r"no token counts of field 'tokens.npy'.*shardkit index DIR"):
        from_manifest(manifest).shard_tokens("tokens.npy")


def test_source_dicts_of_every_integer_dtype_are_counted_and_others_not(tmp_path):
    dtypes = [np.int8, np.int16, np.int32, np.uint64]
    samples = [
        {"__key__": f"{i:03d}", "npy": np.arange(i, dtype=dtypes[i % 4]),
         "emb.npy": np.zeros(4, dtype=np.float32), "grid.npy": np.zeros((2, i + 1), dtype=np.int32)}
        for i in range(12)
    ]  # fmt: skip
    dest = tmp_path / "out"
    write_dataset(samples, str(dest), options=WriteOptions(workers=1, max_samples=5))
    _check_counts(dest, "npy", {f"{i:03d}": i for i in range(12)})


def test_shard_writer_records_token_counts(tmp_path):
    dest = tmp_path / "out"
    with ShardWriter(str(dest), max_samples=4) as writer:
        for i in range(10):
            sample = {"__key__": f"{i:03d}", "txt": "x"}
            if i % 3:
                sample["tokens.npy"] = np.arange(i, dtype=np.int32)  # a sample without it counts 0
            writer.write(sample)
    _check_counts(dest, "tokens.npy", {f"{i:03d}": i for i in range(10) if i % 3})


def test_shardkit_write_counts_npy_files_and_what_map_adds(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for i in range(15):
        (source / f"d{i:02d}.txt").write_text(f"doc {i}")
        (source / f"d{i:02d}.tokens.npy").write_bytes(_npy(np.arange(2 * i, dtype=np.int16)))
    assert main(["write", str(source), str(tmp_path / "plain"), "--max-samples", "6", "-q", "--workers", "1"]) == 0
    _check_counts(tmp_path / "plain", "tokens.npy", {f"d{i:02d}": 2 * i for i in range(15)})
    assert main(["write", str(source), str(tmp_path / "mapped"), "--map", "tests.write.map_functions:add_tokens",
                 "--max-samples", "6", "-q", "--workers", "2"]) == 0  # fmt: skip
    manifest = shardkit.load_manifest(str(tmp_path / "mapped"))
    assert manifest.token_fields == ("ids.npy", "tokens.npy")
    catalog = from_manifest(manifest)
    assert int(catalog.shard_tokens("ids.npy").sum()) == sum(range(15))
    assert int(catalog.shard_tokens("tokens.npy").sum()) == 2 * sum(range(15))


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _digests(dest: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted(dest.iterdir()) if p.is_file()}


def _plain_samples():
    for i in range(23):
        yield {"__key__": f"{i:04d}", "txt": f"doc {i}", "emb.npy": np.full(3, i, dtype=np.float32),
               "grid.npy": np.full((2, 2), i, dtype=np.int16), "cls": i % 3}  # fmt: skip


#: What shardkit wrote for :func:`_plain_samples` before it counted tokens
#: (at 2c6a85e; SHA-256, first 16 hex digits): a dataset without token fields is written byte for byte the same.
BEFORE = {
    "a": {
        "README.md": "ef1354c68bf80841",
        "manifest.json": "1d84185440fa1604",
        "shard-000000.idx": "11b992e6067919f6",
        "shard-000000.tar": "3702c74fe9ca669a",
        "shard-000001.idx": "d239a8e17e095afb",
        "shard-000001.tar": "8b60eeba3ddf411d",
        "shard-000002.idx": "cf37387ce7819a5c",
        "shard-000002.tar": "16d6fe8829aa8a68",
        "shards-851d2ca747645c3e.table": "851d2ca747645c3e",
    },
    "b": {
        "README.md": "ef1354c68bf80841",
        "manifest.json": "cb9fc10104f8f335",
        "shard-000000.idx": "1116245cf0caad68",
        "shard-000000.tar": "352b405daff264c8",
        "shard-000001.idx": "ef48f98ee2f38388",
        "shard-000001.tar": "b138103080bcd9ba",
        "shard-000002.idx": "6679338d224253f4",
        "shard-000002.tar": "5b1da71f4a55fc65",
        "shards-a12e056207116845.table": "a12e056207116845",
    },
}


def test_a_dataset_without_token_fields_is_written_as_before(tmp_path):
    write_dataset(list(_plain_samples()), str(tmp_path / "a"), options=WriteOptions(workers=1, max_samples=10))
    with ShardWriter(str(tmp_path / "b"), max_samples=10) as writer:
        for sample in _plain_samples():
            writer.write(sample)
    assert {"a": _digests(tmp_path / "a"), "b": _digests(tmp_path / "b")} == BEFORE
    index = np.lib.format.read_array  # two arrays, as before
    with open(tmp_path / "a" / "shard-000000.idx", "rb") as f:
        index(f), index(f)
        assert f.read() == b""
    assert "token_fields" not in (tmp_path / "a" / "manifest.json").read_text()


def test_a_resumed_write_keeps_the_counts_of_the_shards_it_reuses(tmp_path):
    dest = tmp_path / "out"
    options = WriteOptions(workers=1, max_samples=13, seed=1)
    first = write_dataset(range(60), str(dest), map=fns.token_ids, options=options)
    again = write_dataset(range(60), str(dest), map=fns.token_ids, options=WriteOptions(workers=1, max_samples=13,
                                                                                       seed=1, resume=True))  # fmt: skip
    assert again.num_reused == 5 and again.num_written == 0
    assert again.manifest.token_fields == ("tokens.npy",)
    assert again.manifest.table.tokens.tolist() == first.manifest.table.tokens.tolist()


def test_a_resumed_shard_writer_counts_the_shards_it_finds(tmp_path):
    dest = tmp_path / "out"
    samples = [{"__key__": f"{i:03d}", "tokens.npy": np.arange(i, dtype=np.int16)} for i in range(10)]
    writer = ShardWriter(str(dest), max_samples=4)
    for sample in samples[:9]:
        writer.write(sample)
    writer.abort()  # two shards finished, the third dropped
    with ShardWriter(str(dest), max_samples=4, resume=True) as writer:
        assert writer.resumed_samples == 8
        for sample in samples[8:]:
            writer.write(sample)
    _check_counts(dest, "tokens.npy", {f"{i:03d}": i for i in range(10)})


def test_info_says_how_many_tokens_a_dataset_holds(tmp_path, capsys):
    dest = tmp_path / "out"
    write_dataset(range(60), str(dest), map=fns.token_ids, options=WriteOptions(workers=1, max_samples=13))
    assert main(["info", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "format:     3\n" in out and f"tokens:     tokens.npy {sum(i % 11 for i in range(60)):,}\n" in out
