"""`shardkit info` and `verify` work on a dataset served over HTTP."""

from __future__ import annotations

from shardkit.cli import main


def test_info_and_verify_over_http(make_shards, serve_dataset, capsys):
    manifest = make_shards([4, 0, 3])
    url = serve_dataset(manifest)
    assert main(["info", url]) == 0
    assert "samples:    7" in capsys.readouterr().out
    assert main(["verify", "-q", url]) == 0
    assert "OK: 3 shards, 7 samples" in capsys.readouterr().out


def test_verify_over_http_names_a_corrupt_shard(make_shards, serve_dataset, http_server, capsys):
    manifest = make_shards([4, 3])
    path = manifest.resolve(manifest.shards[1].path)
    data = bytearray(open(path, "rb").read())
    data[600] ^= 1
    open(path, "wb").write(bytes(data))
    url = serve_dataset(manifest)
    assert main(["verify", "-q", url]) == 1
    err = capsys.readouterr().err
    assert "shard-000001.tar: sample 's001_00000' at byte 0 fails its checksum" in err


def test_file_url_destination_writes_locally(make_shards, tmp_path, capsys):
    source = make_shards([3, 2]).location
    dest = tmp_path / "out"
    assert main(["write", source, f"file://{dest}", "-q"]) == 0
    assert (dest / "manifest.json").exists() and not (tmp_path / "file:").exists()
    assert main(["verify", "-q", f"file://{dest}"]) == 0
