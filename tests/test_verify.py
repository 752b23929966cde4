"""`shardkit verify` catches flipped bytes, truncation and bad indexes."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from shardkit import verify
from shardkit.cli import main
from shardkit.errors import UsageError, VerifyError
from shardkit.format.index import encode_index
from shardkit.verify import verify_dataset


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


def flip(path: str, at: int = 700) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))


BAD = (1, 4, 6)


@pytest.fixture
def damaged(make_shards):
    """Eight shards, of which BAD have a flipped byte."""
    manifest = make_shards([3] * 8)
    for number in BAD:
        flip(manifest.resolve(manifest.shards[number].path))
    return manifest


@pytest.mark.parametrize("workers", ["1", "2"])
def test_every_bad_shard_is_named_in_one_run_and_counted(damaged, capsys, workers):
    assert main(["verify", "-q", "--workers", workers, damaged.location]) == 1
    err = capsys.readouterr().err
    named = {int(line.split("shard-")[1][:6]) for line in err.splitlines() if line.startswith("FAILED: /")}
    assert named == set(BAD)
    assert "FAILED: 3 of 8 shards" in err and "good copy" in err


def test_fail_fast_stops_at_the_first_bad_shard(damaged, capsys):
    assert main(["verify", "-q", "--workers", "1", "--fail-fast", damaged.location]) == 1
    err = capsys.readouterr().err
    assert "shard-000001.tar" in err and "shard-000004.tar" not in err
    assert "FAILED: 1 of 8 shards; stopped there (--fail-fast), 2 checked" in err


def test_verify_dataset_raises_one_error_for_all_bad_shards_and_it_pickles(damaged):
    with pytest.raises(VerifyError) as caught:
        verify_dataset(damaged.location, workers=2)
    error = pickle.loads(pickle.dumps(caught.value))
    assert error.num_failed == 3 and "and 2 more failed shards" in str(error)
    assert error.path.endswith("shard-000001.tar")
    assert [f.path.rsplit("-", 1)[1] for f in error.failures] == ["000001.tar", "000004.tar", "000006.tar"]
    report = verify_dataset(damaged.location, raise_on_failure=False)
    assert report.num_failed == 3 and report.num_shards_checked == 8
    assert report.num_samples_checked == 3 * 5  # the shards that passed


def test_failures_listed_are_bounded_and_the_lowest_numbered(damaged, monkeypatch):
    """At LAION scale a whole prefix can go bad: the report lists a bounded
    number of failures (the first by shard number) and counts them all."""
    monkeypatch.setattr(verify, "LISTED", 2)
    report = verify_dataset(damaged.location, raise_on_failure=False, workers=2)
    assert report.num_failed == 3
    assert [f.path[-10:-4] for f in report.failures] == ["000001", "000004"]


def test_workers_give_the_same_report_as_one_process(make_shards):
    manifest = make_shards([4, 0, 7, 2, 5])
    one = verify_dataset(manifest.location, workers=1)
    two = verify_dataset(manifest.location, workers=2)
    assert one.num_samples_checked == two.num_samples_checked == 18
    assert one.num_shards_checked == two.num_shards_checked == 5
    assert one.failures == two.failures == ()


def test_bad_workers_value_is_a_usage_error(make_shards, capsys):
    manifest = make_shards([1])
    with pytest.raises(UsageError, match="workers"):
        verify_dataset(manifest.location, workers=0)
    assert main(["verify", "--workers", "two", manifest.location]) == 2
    assert "--workers must be a whole number" in capsys.readouterr().err


def test_token_counts_that_are_not_the_samples_are_named(tmp_path):
    from shardkit import write_dataset
    from shardkit.write.parallel import WriteOptions
    from tests.write import map_functions as fns

    dest = tmp_path / "corpus"
    write_dataset(range(30), str(dest), map=fns.token_ids, options=WriteOptions(workers=1, max_samples=10, shuffle=False))
    assert verify_dataset(str(dest)).num_failed == 0
    index = dest / "shard-000001.idx"
    counts = (np.arange(10, 20) % 11)[::-1].reshape(10, 1)  # the right total, in the wrong samples
    index.write_bytes(_reindexed(index, counts))
    with pytest.raises(VerifyError, match=r"shard-000001.idx: token counts of 'tokens.npy' do not match the samples "
                                          r"of shard 1 \(sample 0: 8 recorded, 10 found\)"):  # fmt: skip
        verify_dataset(str(dest))


def _reindexed(index, counts) -> bytes:
    """The index with its checksums kept and ``counts`` as its token counts."""
    with open(index, "rb") as f:
        bounds = np.lib.format.read_array(f)
        checksums = np.lib.format.read_array(f)
    return encode_index(bounds, checksums, counts)
