"""`shardkit verify` catches flipped bytes, truncation and bad indexes."""

from __future__ import annotations

import os

import numpy as np

from shardkit.cli import main
from shardkit.format.index import encode_index


def first_shard(manifest) -> str:
    return manifest.resolve(manifest.shards[0].path)


def test_flipped_byte_fails_naming_the_shard(make_shards, capsys):
    manifest = make_shards([4, 4])
    path = first_shard(manifest)
    with open(path, "r+b") as f:
        f.seek(700)
        byte = f.read(1)
        f.seek(700)
        f.write(bytes([byte[0] ^ 1]))
    assert main(["verify", "-q", manifest.location]) == 1
    err = capsys.readouterr().err
    assert "shard-000000.tar" in err and "SHA-256 mismatch" in err


def test_truncated_shard_fails(make_shards, capsys):
    manifest = make_shards([4, 4])
    path = manifest.resolve(manifest.shards[1].path)
    os.truncate(path, os.path.getsize(path) - 1500)
    assert main(["verify", "-q", manifest.location]) == 1
    err = capsys.readouterr().err
    assert "shard-000001.tar" in err and "truncated" in err


def test_wrong_index_fails(make_shards, capsys):
    manifest = make_shards([4])
    index = manifest.resolve(manifest.shards[0].index)
    bounds = np.load(index)
    bounds[2] += 512
    with open(index, "wb") as f:
        f.write(encode_index(bounds))
    assert main(["verify", "-q", manifest.location]) == 1
    assert "offset index does not match" in capsys.readouterr().err


def test_intact_dataset_passes(make_shards, capsys):
    manifest = make_shards([3, 0, 5])
    assert main(["verify", "-q", manifest.location]) == 0
    assert "8 samples" in capsys.readouterr().out
