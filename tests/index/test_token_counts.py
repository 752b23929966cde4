"""``shardkit index`` records token counts (#40) of shards others wrote:
webdataset's TarWriter, Python's tarfile."""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest

from shardkit import IndexOptions, index_dataset, load_manifest
from shardkit.cli import main
from shardkit.format.table import build_table
from shardkit.index.previous import TOKENS_COUNTED, versions_name
from shardkit.read.catalog import from_manifest
from shardkit.write.publish import publish_manifest

webdataset = pytest.importorskip("webdataset")


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def write_wds_tokens(folder, *, num=23, per_shard=5) -> dict[str, int]:
    """Shards of ``tokens.npy`` (int32, length i % 9) written by webdataset; the lengths by key."""
    os.makedirs(folder, exist_ok=True)
    with webdataset.ShardWriter(os.path.join(folder, "s-%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(num):
            sink.write({"__key__": f"k{i:05d}", "tokens.npy": _npy(np.arange(i % 9, dtype=np.int32)), "txt": str(i)})
    return {f"k{i:05d}": i % 9 for i in range(num)}


def _check(folder, field: str, lengths: dict[str, int]) -> None:
    manifest = load_manifest(str(folder))
    assert manifest.token_fields == (field,)
    catalog = from_manifest(manifest)
    assert int(catalog.shard_tokens(field).sum()) == sum(lengths.values())
    for shard in range(manifest.num_shards):
        path = os.path.join(folder, manifest.shards[shard].path)
        with tarfile.open(path) as tar:
            keys = list(dict.fromkeys(m.name.partition(".")[0] for m in tar.getmembers() if m.isfile()))
        assert catalog.document_tokens(shard, field).tolist() == [lengths.get(k, 0) for k in keys]
        assert np.load(os.path.join(folder, manifest.shards[shard].index))[0] == 0


def test_index_counts_tokens_of_shards_webdataset_wrote(tmp_path):
    folder = tmp_path / "wds"
    lengths = write_wds_tokens(folder)
    assert main(["index", str(folder), "-q", "--workers", "2"]) == 0
    _check(folder, "tokens.npy", lengths)
    assert json.loads((folder / "manifest.json").read_text())["format_version"] == 3


def test_a_rerun_keeps_the_counts_of_unchanged_shards(tmp_path):
    folder = tmp_path / "wds"
    lengths = write_wds_tokens(folder)
    index_dataset(str(folder), options=IndexOptions(workers=1))
    report = index_dataset(str(folder), options=IndexOptions(workers=1))
    assert report.num_unchanged == 5 and report.num_indexed == 0
    _check(folder, "tokens.npy", lengths)


def test_an_index_made_before_token_counts_is_read_again(tmp_path):
    folder = tmp_path / "wds"
    lengths = write_wds_tokens(folder)
    index_dataset(str(folder), options=IndexOptions(workers=1))
    # What an older shardkit left: the same shards and versions, a format-2 manifest without counts.
    manifest = load_manifest(str(folder))
    table = manifest.table
    plain = build_table(table.counts, table.num_bytes, table.sha256, naming=table.naming)
    versions = folder / versions_name(os.path.basename(table.file))
    older_source = {k: v for k, v in manifest.source.items() if k != TOKENS_COUNTED}  # not written then
    publish_manifest(str(folder), type(manifest).from_table(plain, extensions=manifest.extensions,
                                                             source=older_source, location=str(folder)))  # fmt: skip
    again = load_manifest(str(folder))
    assert again.token_fields == () and again.table.tokens is None
    os.replace(versions, folder / versions_name(os.path.basename(again.table.file)))
    report = index_dataset(str(folder), options=IndexOptions(workers=1))
    assert report.num_indexed == 5
    _check(folder, "tokens.npy", lengths)


@pytest.mark.parametrize("fields", [["vec.npy"], ["a.npy", "b.npy"]], ids=["floats", "fields_differ"])
def test_a_rerun_reads_no_shard_again_when_the_npy_fields_count_no_tokens(tmp_path, capsys, fields):
    # .npy members that hold no tokens (floats), or token fields that differ
    # between shards: the index records no counts, and says it counted.
    folder = tmp_path / "shards"
    folder.mkdir()
    for s in range(4):
        with tarfile.open(folder / f"part-{s}.tar", "w") as tar:
            for i in range(3):
                field = fields[s % len(fields)]
                value = np.zeros(3, dtype=np.float32) if field == "vec.npy" else np.arange(i, dtype=np.int32)
                for ext, data in ((field, _npy(value)), ("txt", b"x")):
                    info = tarfile.TarInfo(f"s{s}i{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    assert main(["index", str(folder), "--workers", "1"]) == 0
    assert "(4 read, 0 unchanged, 0 removed)" in capsys.readouterr().out
    manifest = load_manifest(str(folder))
    assert manifest.token_fields == () and manifest.source[TOKENS_COUNTED] is True
    assert main(["index", str(folder), "--workers", "1"]) == 0
    assert "(0 read, 4 unchanged, 0 removed)" in capsys.readouterr().out


def test_index_counts_integer_arrays_of_tarfile_shards_and_leaves_the_rest(tmp_path):
    folder = tmp_path / "tf"
    folder.mkdir()
    dtypes = [np.int8, np.int16, np.int32, np.uint64]
    lengths = {}
    for s in range(3):
        with tarfile.open(folder / f"part-{s}.tar", "w") as tar:
            for i in range(4):
                key = f"s{s}i{i}"
                members = {"ids.npy": _npy(np.arange(s + i, dtype=dtypes[i])),
                           "vec.npy": _npy(np.zeros(3, dtype=np.float64)),
                           "img.npy": _npy(np.zeros((2, 2), dtype=np.uint8)), "txt": b"x"}  # fmt: skip
                if i == 3:
                    del members["ids.npy"]  # counts 0
                else:
                    lengths[key] = s + i
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    index_dataset(str(folder), options=IndexOptions(workers=1))
    _check(folder, "ids.npy", lengths)


def test_shards_with_other_token_fields_record_none(tmp_path, caplog):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for s, field in enumerate(["a.npy", "b.npy"]):
        with tarfile.open(folder / f"part-{s}.tar", "w") as tar:
            data = _npy(np.arange(4, dtype=np.int32))
            info = tarfile.TarInfo(f"k{s}.{field}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    report = index_dataset(str(folder), options=IndexOptions(workers=1))
    assert report.manifest.token_fields == () and report.manifest.table.tokens is None
    assert "part-1.tar has other token fields" in caplog.text
    assert json.loads((folder / "manifest.json").read_text())["format_version"] == 2


def test_a_run_stopped_half_way_goes_on_with_the_counts_it_found(tmp_path):
    folder = tmp_path / "wds"
    lengths = write_wds_tokens(folder)
    seen = []

    def stop_after_two(result):
        seen.append(result)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        index_dataset(str(folder), options=IndexOptions(workers=1), progress=stop_after_two)
    report = index_dataset(str(folder), options=IndexOptions(workers=1))
    assert report.num_resumed == 2 and report.num_indexed == 3
    _check(folder, "tokens.npy", lengths)
