"""`shardkit write NAME DEST --format hf`: a Hugging Face dataset by name, read from the `datasets` cache.

The cache entry is made hermetically: in a child process whose HF_HOME is a
temporary folder and whose Hub access is off (HF_HUB_OFFLINE=1), `datasets`
prepares a local Parquet file as the Hub dataset ``user/name`` would be
prepared, and loads it back by name offline, which proves the entry is one
`datasets` itself finds. Nothing touches the home folder or the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest

from shardkit.cli import main
from shardkit.errors import SourceError
from shardkit.write.sources.hf_cache import find_cached

pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

#: Prepares argv[1] (a Parquet file) in the cache as the Hub dataset argv[2]
#: would be (prepared under its bare name, then moved to ``namespace___name``:
#: ``datasets`` takes data files from the Hub only under a repo's name), then
#: loads that name back offline and prints its row count.
_PREPARE = """
import os, sys
import datasets
from datasets.packaged_modules.parquet.parquet import Parquet

path, name = sys.argv[1:3]
namespace, bare = name.split("/")
staging = os.path.join(datasets.config.HF_DATASETS_CACHE, "staging")
builder = Parquet(cache_dir=staging, dataset_name=bare, config_name="default", config_id="default",
                  hash="0123456789abcdef", data_files={"train": [path], "test": [path]})
builder.download_and_prepare()
os.rename(os.path.join(staging, bare), os.path.join(datasets.config.HF_DATASETS_CACHE, namespace + "___" + bare))
print(len(datasets.load_dataset(name, split="train")))
"""


def _hf_env(home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_CACHE"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", HOME=str(home))
    return env


@pytest.fixture
def cached_name(tmp_path, monkeypatch):
    """``user/my_table`` prepared in a temporary datasets cache (HF_HOME set for the test)."""
    rows = {"txt": [f"caption {i}" for i in range(7)], "cls": [str(i % 3) for i in range(7)]}
    path = tmp_path / "table.parquet"
    pq.write_table(pa.table(rows), str(path), row_group_size=3)
    home = tmp_path / "hf"
    done = subprocess.run(
        [sys.executable, "-c", _PREPARE, str(path), "user/my_table"],
        env=_hf_env(home), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "7"  # datasets loads the name from its cache, offline
    for name in ("HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    return rows


def _members(folder) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(folder, name)) as tar:
                for member in tar.getmembers():
                    out[member.name] = tar.extractfile(member).read()
    return out


def test_write_a_cached_dataset_by_name_gives_every_row_once(cached_name, tmp_path, capsys):
    dest = tmp_path / "out"
    assert main(["write", "user/my_table", str(dest), "--format", "hf", "--no-shuffle", "--workers", "2", "-q"]) == 0
    members = _members(dest)
    assert members == {
        **{f"{i:09d}.txt": text.encode() for i, text in enumerate(cached_name["txt"])},
        **{f"{i:09d}.cls": label.encode() for i, label in enumerate(cached_name["cls"])},
    }
    found = find_cached("user/my_table:test")
    assert found.split == "test" and found.config == "default" and len(found.files) == 1
    assert main(["write", "user/my_table:test", str(tmp_path / "test"), "--format", "hf", "-q"]) == 0
    assert _members(tmp_path / "test") == members  # the test split holds the same rows


def test_a_name_not_in_the_cache_is_one_line_saying_how_to_get_it(cached_name, tmp_path, capsys):
    code = main(["write", "user/other", str(tmp_path / "out"), "--format", "hf", "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "user/other: no such folder, and not in the datasets cache" in err and "datasets.load_dataset('user/other')" in err
    assert os.environ["HF_HOME"] in err and not os.path.exists(tmp_path / "out")
    with pytest.raises(SourceError, match=r"split 'validation' is not cached \(cached: test, train\)"):
        find_cached("user/my_table:validation")
    with pytest.raises(SourceError, match=r"config 'other' is not in the datasets cache \(cached: default\)"):
        find_cached("user/my_table:other:train")
