"""`shardkit write --engine ray` on a real two-node Ray cluster: same bytes as the local engine."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from shardkit.cli import main
from shardkit.errors import UsageError
from shardkit.write.parallel import WriteOptions
from tests.ray.conftest import ROOT, tree_bytes

WRITE_FLAGS = ("--max-samples", "6", "--seed", "7", "-q")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """The demo's synthetic JPEGs (tools/gen_images.py): 6 classes x 20 images."""
    spec = importlib.util.spec_from_file_location("_gen_images", ROOT / "tools" / "gen_images.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    root = tmp_path_factory.mktemp("ray-images") / "train"
    gen.generate(str(root), classes=6, per_class=20, target_kb=6)
    return root


@pytest.fixture(scope="module")
def local_output(images, tmp_path_factory) -> dict[str, bytes]:
    dest = tmp_path_factory.mktemp("ray-local") / "out"
    assert main(["write", str(images), str(dest), "--workers", "2", *WRITE_FLAGS]) == 0
    return tree_bytes(dest)


def test_cli_ray_engine_writes_the_local_engines_bytes(ray_cluster, images, local_output, tmp_path):
    dest = tmp_path / "out"
    done = ray_cluster.shardkit(
        "write", str(images), str(dest), "--engine", "ray", "--ray-address", ray_cluster.address, *WRITE_FLAGS
    )
    assert done.returncode == 0, done.stderr
    got = tree_bytes(dest)
    assert sorted(got) == sorted(local_output)  # no probe, journal or temporary file left behind
    assert got == local_output
    assert len([n for n in got if n.endswith(".tar")]) == 20


def test_ray_engine_writes_to_s3_from_the_workers(ray_cluster, images, local_output, tmp_path):
    """Each task uploads its own shard; the driver publishes the manifest last; read_shards reads it back.

    The driver stages the scan and the plan in its TMPDIR, here a tmpfs in a
    mount namespace of its own that no Ray node sees: the tasks carry their
    rows of the plan, so the write needs no file system shared with the driver.
    """
    private = tmp_path / "driver-tmp"
    private.mkdir()
    driver = [sys.executable, str(ROOT / "tests" / "ray" / "driver.py"), ray_cluster.address, "s3-write", str(images)]
    folder = shlex.quote(str(private))
    script = f"mount -t tmpfs tmpfs {folder} && TMPDIR={folder} exec {shlex.join(driver)}"
    done = ray_cluster.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in local_output.items()}
    assert result["objects"] == expected
    assert result["num_written"] == 20 and result["rows"] == 120
    assert not os.listdir(private)  # the driver's staging folder was on its tmpfs, not here
    # shardkit.ray.write_shards of the same rows to s3:// (same limit): the same shards, every row.
    shards = sorted(name for name in expected if name.startswith("shard-"))
    assert sorted(name for name in result["again"] if name.startswith("shard-")) == shards
    assert "manifest.json" in result["again"] and result["again_rows"] == 120


def _pids_running(task_name: str) -> list[int]:
    """Ray workers now executing a task named ``task_name`` (Ray sets the process title)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    title = f.read().split(b"\0")[0]
            except OSError:
                continue
            if title.strip() == f"ray::{task_name}".encode():
                found.append(int(entry))
    return found


def _kill_one_running(driver: subprocess.Popen, task_name: str) -> int | None:
    """While ``driver`` runs, SIGKILL the first Ray worker seen executing ``task_name``; its pid, or None."""
    deadline = time.monotonic() + 120
    while driver.poll() is None and time.monotonic() < deadline:
        for pid in _pids_running(task_name):
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.002)
    return None


def test_a_killed_worker_is_retried_and_the_bytes_stay_the_same(ray_cluster, images, local_output, tmp_path):
    dest = tmp_path / "out"
    driver = ray_cluster.popen(
        [sys.executable, "-m", "shardkit", "write", str(images), str(dest), "--engine", "ray",
         "--ray-address", ray_cluster.address, *WRITE_FLAGS]
    )
    killed = _kill_one_running(driver, "shardkit_write_shard")  # the worker dies mid-shard, as on a lost node
    out, err = driver.communicate(timeout=180)
    assert killed is not None, "no shard task was seen running: nothing was killed"
    assert driver.returncode == 0, err
    assert tree_bytes(dest) == local_output


def test_resume_after_the_driver_is_killed_gives_the_same_bytes(ray_cluster, images, local_output, tmp_path):
    dest = tmp_path / "out"
    argv = [sys.executable, "-m", "shardkit", "write", str(images), str(dest), "--engine", "ray",
            "--ray-address", ray_cluster.address, "--max-samples", "6", "--seed", "7"]
    driver = ray_cluster.popen([*argv, "-q"])
    journal = dest / ".shardkit-journal"
    deadline = time.monotonic() + 120
    while driver.poll() is None and time.monotonic() < deadline:
        if journal.is_dir() and len(list(journal.glob("shard-*.json"))) >= 3:
            driver.kill()  # `ip netns exec` execs the driver: this is its pid
            break
        time.sleep(0.002)
    driver.communicate(timeout=60)
    assert driver.returncode == -signal.SIGKILL, "the driver finished before it could be killed"
    assert not (dest / "manifest.json").exists()

    done = ray_cluster.shardkit(*argv[3:], "--resume")
    assert done.returncode == 0, done.stderr
    reused = int(done.stdout.split("written, ")[1].split(" reused")[0])
    assert reused >= 3
    assert tree_bytes(dest) == local_output


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory) -> tuple[Path, Path]:
    """A JSONL of 60,000 small rows and a config cutting it into 8 partitions."""
    root = tmp_path_factory.mktemp("ray-jsonl")
    source = root / "rows.jsonl"
    with open(source, "w") as f:
        for i in range(60_000):
            f.write(json.dumps({"__key__": f"row-{i:06d}", "txt": f"text of row {i}", "json": {"i": i}}) + "\n")
    config = root / "write.yaml"
    config.write_text(f"write:\n  partition_bytes: {source.stat().st_size // 8 + 1}\n")
    return source, config


def test_ray_scans_partitions_in_tasks_with_the_local_bytes_and_a_killed_scan_is_retried(ray_cluster, jsonl, tmp_path):
    """Scanning runs in Ray tasks (one is killed mid-scan, as on a lost node, and run again);
    the bytes equal the local engine's, with 1 worker there and 2 here."""
    source, config = jsonl
    flags = ("--config", str(config), "--max-samples", "5000", "--seed", "3", "-q")
    assert main(["write", str(source), str(tmp_path / "local"), "--workers", "1", *flags]) == 0
    dest = tmp_path / "ray"
    driver = ray_cluster.popen(
        [sys.executable, "-m", "shardkit", "write", str(source), str(dest), "--engine", "ray",
         "--ray-address", ray_cluster.address, "--workers", "2", *flags]
    )
    killed = _kill_one_running(driver, "shardkit_scan_partition")
    out, err = driver.communicate(timeout=180)
    assert killed is not None, "no scan task was seen running: the driver scanned the partitions itself"
    assert driver.returncode == 0, err
    assert tree_bytes(dest) == tree_bytes(tmp_path / "local")


def _text_tar(path: Path, keys: range, *, compress: bool = False) -> None:
    """An input shard of one ``KEY.txt`` member per key (gzipped whole when ``compress``)."""
    with tarfile.open(path, "w:gz" if compress else "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            data = f"text {key}".encode()
            member = tarfile.TarInfo(f"k{key:04d}.txt")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


def test_input_shards_compressed_whole_give_the_local_bytes_under_ray(ray_cluster, tmp_path):
    """Their scans unpack into DEST's work folder, by tasks kept on the driver's node."""
    source = tmp_path / "in"
    source.mkdir()
    for i in range(3):
        _text_tar(source / f"s-{i}.tar.gz", range(i * 40, i * 40 + 40), compress=True)
    flags = ("--max-samples", "25", "--seed", "5", "-q")
    assert main(["write", str(source), str(tmp_path / "local"), *flags]) == 0
    done = ray_cluster.shardkit(
        "write", str(source), str(tmp_path / "ray"), "--engine", "ray", "--ray-address", ray_cluster.address, *flags
    )
    assert done.returncode == 0, done.stderr
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def _last_error_line(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("fault", ["not JSON", "vanished partition"])
def test_bad_input_found_by_a_ray_scan_is_the_local_one_line_error(ray_cluster, tmp_path, capsys, fault):
    if fault == "not JSON":
        source = tmp_path / "rows.jsonl"
        source.write_text("".join(f'{{"__key__": "k{i}", "txt": "x"}}\n' for i in range(40)) + "{not json\n")
        expected = f"shardkit: error: {source}:41: line 41 is not valid JSON"
    else:
        for i in (0, 2):  # shard 1 of the pattern is gone before it is scanned
            _text_tar(tmp_path / f"s-{i}.tar", range(i, i + 1))
        source = tmp_path / "s-{0..2}.tar"
        expected = f"shardkit: error: {tmp_path}/s-1.tar: input shard does not exist"
    local = _last_error_line(capsys, ["write", str(source), str(tmp_path / "local"), "-q"])
    done = ray_cluster.shardkit(
        "write", str(source), str(tmp_path / "ray"), "--engine", "ray", "--ray-address", ray_cluster.address, "-q"
    )
    assert local[0] == done.returncode == 2
    assert local[1].startswith(expected)
    ours = [line for line in done.stderr.splitlines() if line.startswith("shardkit:")]  # not Ray's own log lines
    assert ours == [local[1]]
    assert not (tmp_path / "ray").exists()  # created by nobody: nothing half-written


def test_a_path_only_the_driver_sees_is_refused_before_writing(ray_cluster, images, tmp_path):
    """The driver runs in a mount namespace of its own with a tmpfs the Ray nodes do not have."""
    private = tmp_path / "driver-only"
    private.mkdir()
    script = (
        "import shutil, subprocess, sys\n"
        "from shardkit.cli import main\n"
        f"subprocess.run(['mount', '-t', 'tmpfs', 'tmpfs', {str(private)!r}], check=True)\n"
        f"shutil.copytree({str(images)!r}, {str(private / 'train')!r})\n"
        f"sys.exit(main(['write', {str(private / 'train')!r}, {str(tmp_path / 'out')!r}, '--engine', 'ray',"
        f" '--ray-address', {ray_cluster.address!r}, '-q']))\n"
    )
    done = ray_cluster.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script])
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"shardkit: error: {private}/train/")
    assert "not visible from Ray node 127.0.0.1 (id " in line
    assert line.endswith("the source and DEST must be on a file system every node shares, or URLs (s3://, http(s)://) every node can reach")
    assert not list((tmp_path / "out").glob("shard-*"))


def test_an_input_vanishing_mid_job_stops_it_naming_the_input(ray_cluster, images, tmp_path):
    source = tmp_path / "train"
    subprocess.run(["cp", "-r", str(images), str(source)], check=True)
    victim = sorted(source.rglob("*.jpg"))[-2]  # written late (no shuffle, one sample a shard), checked by no probe
    done = ray_cluster.driver("vanish", str(source), str(tmp_path / "out"), str(victim), "raise")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["error"] == "InputFileError"
    assert result["path"] == str(victim)
    assert str(victim) in result["message"] and "--on-error skip" in result["message"]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_input_vanishing_mid_job_is_skipped_into_the_manifest(ray_cluster, images, tmp_path):
    source = tmp_path / "train"
    subprocess.run(["cp", "-r", str(images), str(source)], check=True)
    victim = sorted(source.rglob("*.jpg"))[-2]
    done = ray_cluster.driver("vanish", str(source), str(tmp_path / "out"), str(victim), "skip")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"skipped": [str(victim)], "num_samples": 119}


def test_an_unreachable_ray_address_is_one_line_exit_2(tmp_path, capsys):
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    assert main(["write", str(tmp_path), str(tmp_path / "out"), "--engine", "ray", "--ray-address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "shardkit: error: cannot reach the Ray cluster at 127.0.0.1:1 (Connection refused); "
        "start one with `ray start --head` or check --ray-address"
    )


def test_without_ray_installed_the_error_names_the_extra(tmp_path):
    blocked = (
        "import sys; sys.modules['ray'] = None\n"  # what a missing package looks like to `import ray`
        "from shardkit.cli import main\n"
        f"sys.exit(main(['write', {str(tmp_path)!r}, {str(tmp_path / 'out')!r}, '--engine', 'ray']))\n"
    )
    done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "shardkit: error: ImportError: the Ray engine needs Ray, which is not installed: pip install 'shardkit[ray]'"
    ]
    library = "import sys; sys.modules['ray'] = None\nimport shardkit.ray\nshardkit.ray.read_shards('x')\n"
    done = subprocess.run([sys.executable, "-c", library], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "pip install 'shardkit[ray]'" in done.stderr.strip().splitlines()[-1]


def test_engine_options_are_validated():
    with pytest.raises(UsageError, match=r"engine must be one of \('local', 'ray'\), got 'spark'"):
        WriteOptions(engine="spark")
    with pytest.raises(UsageError, match="ray_address is only used with engine='ray'"):
        WriteOptions(ray_address="auto")
    with pytest.raises(UsageError, match="ray_max_retries must be a non-negative integer"):
        WriteOptions(engine="ray", ray_max_retries=-1)
    assert "engine" not in WriteOptions(engine="ray").recorded()  # the manifest does not depend on it


# ---------------------------------------------------------------- the map stage on Ray


def test_cli_map_on_ray_writes_the_local_engines_bytes(ray_cluster, images, tmp_path):
    """--map over a path source: the map stage's jobs run as Ray tasks on both nodes, their stages
    streamed back to the driver; the shards are byte for byte the local engine's."""
    mapped = ("--map", "tests.write.map_functions:upper_text")
    assert main(["write", str(images), str(tmp_path / "local"), "--workers", "2", *mapped, *WRITE_FLAGS]) == 0
    done = ray_cluster.shardkit(
        "write", str(images), str(tmp_path / "ray"), "--engine", "ray", "--ray-address", ray_cluster.address,
        *mapped, *WRITE_FLAGS,
    )
    assert done.returncode == 0, done.stderr
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_a_sequence_mapped_on_ray_gives_the_local_bytes(ray_cluster, tmp_path):
    from shardkit.write.parallel import write_dataset
    from tests.write.map_functions import square

    write_dataset(range(200), str(tmp_path / "local"), map=square, options=WriteOptions(max_samples=37, seed=3))
    driver = [sys.executable, str(ROOT / "tests" / "ray" / "driver.py"), ray_cluster.address, "map-sequence",
              str(tmp_path / "ray"), "200"]  # fmt: skip
    done = ray_cluster.run(driver)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"num_items": 200, "num_samples": 200}
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_write_shards_stores_numpy_columns_as_shard_writer_does(ray_cluster, tmp_path):
    """Ray Data rows holding numpy values (what a .map over arrays gives): stored as .npy and numbers,
    not refused after the whole map had run."""
    import numpy as np

    from shardkit.format.manifest import load_manifest

    driver = [sys.executable, str(ROOT / "tests" / "ray" / "driver.py"), ray_cluster.address, "numpy-rows",
              str(tmp_path / "out"), "40"]  # fmt: skip
    done = ray_cluster.run(driver)
    assert done.returncode == 0, done.stderr
    manifest = load_manifest(str(tmp_path / "out"))
    assert manifest.num_samples == 40
    seen = {}
    for entry in manifest.shards:
        with tarfile.open(tmp_path / "out" / entry.path) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                seen.setdefault(key, {})[ext] = tar.extractfile(member).read()
    for i in range(40):
        sample = seen[f"{i:05d}"]
        assert np.array_equal(np.load(io.BytesIO(sample["tokens.npy"])), np.arange(i % 5, dtype=np.int32))
        assert sample["cls"] == str(i * 3).encode()


def test_extend_on_ray_writes_the_bytes_of_the_local_pool(ray_cluster, tmp_path):
    """shardkit.extend(engine="ray") (issue #54): the same extension, byte for byte, as the local process pool."""
    import shardkit
    from tests.conftest import build_dataset
    from tests.revise import derived_maps

    pool = str(tmp_path / "pool")
    build_dataset(pool, (6, 0, 9, 5))
    shardkit.extend(pool, tmp_path / "local", map=derived_maps.embedding, workers=2)
    driver = [sys.executable, str(ROOT / "tests" / "ray" / "driver.py"), ray_cluster.address, "extend", pool,
              str(tmp_path / "ray")]  # fmt: skip
    done = ray_cluster.run(driver)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"num_samples": 20, "num_extended": 4, "fields": ["emb.npy", "score.txt"]}
    made = tree_bytes(tmp_path / "ray")
    assert made == tree_bytes(tmp_path / "local") and "fields/shard-000002.tar" in made  # every file, byte for byte
