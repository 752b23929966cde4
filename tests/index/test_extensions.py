"""manifest.extensions lists the fields readers give: `shardkit write`, ShardWriter and
`shardkit index` agree with the reader on upper-case extensions (KEY.JPG is read as jpg)."""

from __future__ import annotations

import shardkit
from shardkit import IndexOptions, ShardDataset, index_dataset
from shardkit.cli import main


def _fields(dataset: str) -> set[str]:
    return {k for sample in ShardDataset(dataset, mode="exact", shuffle=False) for k in sample if not k.startswith("__")}


def test_written_manifest_lists_extensions_as_readers_give_them(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        (folder / f"k{i}.JPG").write_bytes(b"jpeg %d" % i)
        (folder / f"k{i}.Txt").write_bytes(b"caption %d" % i)
        (folder / f"k{i}.cls").write_bytes(b"%d" % i)
    assert main(["write", str(folder), str(tmp_path / "dir"), "--format", "directory", "-q"]) == 0
    written = shardkit.load_manifest(str(tmp_path / "dir"))
    assert written.extensions == ("cls", "jpg", "txt")
    assert _fields(str(tmp_path / "dir")) == {"cls", "jpg", "txt"}
    # the Python writer, and a member compressed on the way (KEY.Txt -> KEY.Txt.gz, read as txt.gz)
    with shardkit.ShardWriter(str(tmp_path / "py")) as writer:
        writer.write({"__key__": "a", "JPG": b"x", "Txt": b"y"})
    assert writer.manifest is not None and writer.manifest.extensions == ("jpg", "txt")
    assert _fields(str(tmp_path / "py")) == {"jpg", "txt"}
    assert main(["write", str(folder), str(tmp_path / "gz"), "--format", "directory", "--compress-members", "gzip",
                 "-q"]) == 0
    compressed = shardkit.load_manifest(str(tmp_path / "gz")).extensions
    assert compressed == tuple(sorted(compressed)) and all(ext == ext.lower() for ext in compressed)
    assert "txt.gz" in compressed
    # `shardkit index` of the same shards records the same extensions
    assert index_dataset(str(tmp_path / "dir"), out=str(tmp_path / "idx"),
                         options=IndexOptions(workers=1)).manifest.extensions == written.extensions
