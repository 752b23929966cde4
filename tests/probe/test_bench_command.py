"""``shardkit bench`` (issue #56) on real shards and real DataLoader
workers: the storage's ceiling beside the loader, the verdict, the files it
writes, and its bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardkit.cli import main
from tests.conftest import build_dataset

IS_ROOT = os.geteuid() == 0
SLOW_MAP = "def slow(sample):\n    import time\n    time.sleep(0.004)\n    return sample\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    dest = str(tmp_path_factory.mktemp("bench") / "ds")
    build_dataset(dest, [40] * 6, payload_bytes=20_000)
    return dest


def test_a_slow_map_is_reported_cpu_bound_and_named(dataset, tmp_path, monkeypatch, capsys):
    (tmp_path / "slowmap.py").write_text(SLOW_MAP)
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "out")
    code = main(["bench", dataset, "--map", "slowmap:slow", "--workers", "0,1", "--seconds", "1.5", "--out", out])
    assert code == 0
    printed = capsys.readouterr().out
    assert "0 workers: CPU-bound" in printed and "map" in printed.split("0 workers:")[1].splitlines()[0]
    record = json.loads(open(os.path.join(out, "bench.json")).read())
    assert [row["workers"] for row in record["rows"]] == [0, 1]
    for row in record["rows"]:
        raw, mapped, ceiling = row["raw"], row["options"], row["ceiling_mb_per_s"]
        assert raw["samples"] > 0 and mapped["samples"] > 0
        assert raw["mb_per_s"] <= 1.5 * ceiling  # never above the storage's own read by more than noise
        assert raw["mb_per_s"] == pytest.approx(raw["nbytes"] / 1e6 / raw["seconds"])
        assert raw["nbytes"] >= raw["samples"] * 20_000  # the bytes read hold the samples delivered
        assert mapped["samples_per_s"] < 0.5 * raw["samples_per_s"]  # the map's cost shows as the difference
        assert mapped["stats"]["stages_s"]["map"] > mapped["stats"]["stages_s"]["parse"]
    assert record["best_workers"] in (0, 1)
    assert sorted(os.listdir(out)) == ["bench.json", "bench.md", "bench.png"]
    assert "| workers |" in open(os.path.join(out, "bench.md")).read()
    assert not any(name.startswith("bench") for name in os.listdir(dataset))  # nothing written into the dataset


def test_bad_options_are_refused_with_what_to_do(dataset, tmp_path, capsys):
    assert main(["bench", dataset, "--workers", "1,x"]) == 2
    assert "--workers must be worker counts" in capsys.readouterr().err
    assert main(["bench", dataset, "--seconds", "0"]) == 2
    assert "--seconds must be a positive number" in capsys.readouterr().err
    assert main(["bench", dataset, "--out", os.path.join(dataset, "results")]) == 2
    assert "never writes into a dataset" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(dataset, "results"))
    assert main(["bench", str(tmp_path / "missing")]) == 2


@pytest.mark.skipif(not IS_ROOT or not os.path.exists("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device"),
                    reason="needs root and cgroup v1 blkio (bench/profiles)")
def test_a_throttled_disk_is_reported_storage_bound(tmp_path):
    from bench.profiles import mounted

    source = str(tmp_path / "ds")
    build_dataset(source, [60] * 8, payload_bytes=200_000)  # 96 MB
    with mounted("hdd", str(tmp_path / "work"), image_bytes=160 << 20) as profile:
        data = profile.place("ds", source)
        profile.start()
        out = str(tmp_path / "out")
        done = subprocess.run(
            [sys.executable, "-m", "shardkit", "bench", data, "--workers", "1", "--seconds", "3", "--out", out],
            capture_output=True, text=True, preexec_fn=profile.join, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "1 workers: storage-bound" in done.stdout, done.stdout
        row = json.loads(open(os.path.join(out, "bench.json")).read())["rows"][0]
        assert row["ceiling_mb_per_s"] < 400  # throttled (about 170 MB/s), where the loop device alone is faster
