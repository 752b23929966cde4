"""Storage profiles: the parts that need no root, and (as root, which CI is)
a real loop+blkio profile and a real seekfs mount that clean up after
themselves."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from bench.profiles import PROFILES, Profile, ProfileError, mounted, require_root
from bench.profiles.seekfs import parse_params, platter_layout

IS_ROOT = os.geteuid() == 0


def test_platter_layout_follows_creation_order(tmp_path):
    for i, name in enumerate(["b.bin", "a.bin", "sub/c.bin"]):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x" * 5000)
        os.utime(path, ns=(1_000_000_000 * (i + 1), 1_000_000_000 * (i + 1)))
    layout = platter_layout(str(tmp_path))
    order = sorted(layout, key=lambda p: layout[p][0])
    assert order == ["/b.bin", "/a.bin", "/sub/c.bin"]
    assert layout["/b.bin"] == (0, 5000)
    assert layout["/a.bin"][0] >= 8192  # 4 KiB aligned, with a gap


def test_parse_params_knows_the_fields():
    params = parse_params(["seek_s=0.01", "readahead_budget_bytes=1048576"])
    assert params.seek_s == 0.01 and params.readahead_budget_bytes == 1 << 20
    with pytest.raises(SystemExit, match="unknown parameter 'seek'"):
        parse_params(["seek=1"])


@pytest.mark.skipif(IS_ROOT, reason="checks the message for non-root users")
def test_not_root_gets_a_clear_message():
    with pytest.raises(ProfileError, match="need root"):
        require_root()


def _loop_devices() -> str:
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout


@pytest.mark.skipif(not IS_ROOT or not os.path.exists("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device"),
                    reason="needs root and cgroup v1 blkio")
def test_loop_profile_throttles_and_tears_down(tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(128 << 20))
    with mounted("hdd", str(tmp_path / "work"), image_bytes=192 << 20) as profile:
        loop, cgroup = profile.state["loop"], profile.state["cgroup"]
        path = profile.place("big.bin", str(src))
        profile.start()
        profile.cold()
        start = time.monotonic()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True,
                       preexec_fn=profile.join)
        elapsed = time.monotonic() - start
        # Throttled, so not instant: ~0.8 s at 170 MB/s, where the loop device
        # alone reads it in ~0.1 s. (blkio lets a short burst through at the
        # start of a run, so the bound has slack and the file is not tiny.)
        assert elapsed > (128 << 20) / 170e6 * 0.5
        assert profile.io_stats()["read_io_service_bytes"] >= 128 << 20
    assert loop not in _loop_devices()
    assert not os.path.exists(cgroup)
    assert not os.path.ismount(profile.mount)


@pytest.mark.skipif(not IS_ROOT or not os.path.exists("/dev/fuse") or shutil.which("fusermount") is None,
                    reason="needs root and FUSE")
def test_seekfs_profile_charges_seeks_and_tears_down(tmp_path):
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: no libfuse on this machine
        pytest.skip(f"mfusepy unusable here: {exc}")
    src = tmp_path / "files"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.bin").write_bytes(os.urandom(100_000))
    with mounted("hdd-seek", str(tmp_path / "work")) as profile:
        root = profile.place("files", str(src))
        profile.start()
        profile.cold()
        profile.seekfs("reset")
        trace = tmp_path / "trace.txt"
        profile.seekfs(f"trace {trace}")
        for i in (3, 0, 4):
            with open(os.path.join(root, f"f{i}.bin"), "rb") as f:
                assert len(f.read()) == 100_000
        profile.seekfs("trace")
        stats = profile.io_stats()
        assert stats["seeks"] == 3
        assert stats["request_bytes"] == 300_000
        assert stats["file_switches"] == 3
        lines = trace.read_text().splitlines()
        assert [line.split()[2] for line in lines] == ["/files/f3.bin", "/files/f0.bin", "/files/f4.bin"]
        assert all(line.split()[1] == str(os.getpid()) for line in lines)
        pid = profile.state["seekfs_pid"]
    assert not os.path.ismount(profile.mount)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_every_profile_has_a_known_kind():
    assert set(PROFILES) == {"hdd", "hdd-seek", "ssd", "raw"}
    assert {spec.kind for spec in PROFILES.values()} == {"loop", "seekfs", "raw"}
    assert Profile(PROFILES["raw"], "/nonexistent").mount.endswith("profiles/raw/mnt")
