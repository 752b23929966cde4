"""Emulated storage profiles for the benchmarks (root only).

=========  ==============================================================
profile    what it is
=========  ==============================================================
hdd        ext4 on a loop device, reads throttled by the blkio cgroup (v1)
           to about 170 MB/s and 170 requests/s
hdd-seek   a FUSE passthrough whose one virtual head pays a seek for every
           read that does not continue the previous one (seekmodel.py)
ssd        ext4 on a loop device throttled like a SATA SSD (500 MB/s,
           40k requests/s)
raw        a folder on this machine's own disk, unthrottled
=========  ==============================================================

A profile is used in three steps: :meth:`Profile.setup`, then
:meth:`Profile.place` for each data tree (copied in call order, which is the
on-disk creation order), then :meth:`Profile.start`; readers run with
:meth:`Profile.join` as ``preexec_fn`` so they and their DataLoader workers
land in the throttled cgroup, and :meth:`Profile.cold` before every run.
:meth:`Profile.teardown` (also called on errors by :func:`mounted`) removes
only what this profile created, as recorded in its state file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

BLKIO_ROOT = "/sys/fs/cgroup/blkio"
CGROUP_PREFIX = "shardkit-bench-"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ProfileError(RuntimeError):
    """A profile cannot be set up here; the message says what to do."""


@dataclass(frozen=True)
class ProfileSpec:
    """What a profile emulates.

    Attributes:
        name: Profile name.
        kind: ``"loop"``, ``"seekfs"`` or ``"raw"``.
        read_bps: blkio read bytes/s limit (loop only).
        read_iops: blkio read requests/s limit (loop only).
        description: One line for the results.
        rotational: Whether the profile emulates a spinning disk. Loop
            devices report it in sysfs (``queue/rotational``), where readers
            that adapt to disks find it; a FUSE file system has no block
            device, so the harness tells shardkit (``device_lock=True``).
    """

    name: str
    kind: str
    read_bps: int = 0
    read_iops: int = 0
    description: str = ""
    rotational: bool | None = None


PROFILES: dict[str, ProfileSpec] = {
    spec.name: spec
    for spec in (
        ProfileSpec("hdd", "loop", 170_000_000, 170, "ext4 on loop, blkio 170 MB/s + 170 IOPS", rotational=True),
        ProfileSpec(
            "hdd-seek",
            "seekfs",
            description="FUSE seek model: 8 ms per non-continuing read, 170 MB/s",
            rotational=True,
        ),
        ProfileSpec("ssd", "loop", 500_000_000, 40_000, "ext4 on loop, blkio 500 MB/s + 40k IOPS", rotational=False),
        ProfileSpec("raw", "raw", description="this machine's disk, unthrottled"),
    )
}


def require_root() -> None:
    if os.geteuid() != 0:
        raise ProfileError(
            "storage profiles need root (loop devices, blkio cgroups, FUSE mounts, drop_caches); "
            "run the benchmark as root, e.g. `sudo make bench`"
        )


def drop_caches() -> None:
    """Write back dirty pages, then drop the page cache, dentries and inodes."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _run(*cmd: str) -> str:
    try:
        result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise ProfileError(f"{cmd[0]} not found; install it (Debian: util-linux, e2fsprogs, fuse)") from None
    except subprocess.CalledProcessError as exc:
        raise ProfileError(f"`{' '.join(cmd)}` failed: {exc.stderr.strip()}") from None
    return result.stdout.strip()


class Profile:
    """One storage profile living under ``workdir/profiles/NAME``."""

    def __init__(self, spec: ProfileSpec, workdir: str, *, image_bytes: int = 4 << 30):
        self.spec = spec
        self.base = os.path.join(os.path.abspath(workdir), "profiles", spec.name)
        self.image_bytes = image_bytes
        self.state_path = os.path.join(self.base, "state.json")
        self.state: dict = {}
        self.mount = os.path.join(self.base, "mnt")
        self.backing = os.path.join(self.base, "backing")

    # -- lifecycle --------------------------------------------------------

    def setup(self) -> None:
        """Create the storage (empty) and record what was created."""
        require_root()
        self.teardown()  # whatever a crashed earlier run left
        shutil.rmtree(self.base, ignore_errors=True)
        os.makedirs(self.base)
        kind = self.spec.kind
        if kind == "raw":
            os.makedirs(self.mount)
        elif kind == "loop":
            self._setup_loop()
        elif kind == "seekfs":
            _check_fuse()
            os.makedirs(self.backing)
            os.makedirs(self.mount)
        else:
            raise AssertionError(kind)

    def place(self, name: str, src: str) -> str:
        """Copy the file or tree ``src`` to ``NAME`` on the profile, files in
        sorted order (so creation order is the natural order). Returns the
        path readers use once :meth:`start` has run."""
        dest_root = self.backing if self.spec.kind == "seekfs" else self.mount
        dest = os.path.join(dest_root, name)
        if os.path.isdir(src):
            for dirpath, dirs, files in os.walk(src):
                dirs.sort()
                rel = os.path.relpath(dirpath, src)
                os.makedirs(os.path.join(dest, rel), exist_ok=True)
                for file in sorted(files):
                    shutil.copyfile(os.path.join(dirpath, file), os.path.join(dest, rel, file))
        else:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(src, dest)
        return os.path.join(self.mount, name)

    def start(self) -> None:
        """Make placed data readable through the profile."""
        os.sync()
        if self.spec.kind == "seekfs":
            self._start_seekfs()
        drop_caches()

    def teardown(self) -> None:
        """Undo everything the state file records; safe to call twice."""
        state = self.load_state()
        if not state:
            return
        if state.get("seekfs_pid"):
            self._stop_seekfs(state)
        if state.get("control"):
            shutil.rmtree(os.path.dirname(state["control"]), ignore_errors=True)
        if state.get("mounted"):
            subprocess.run(["umount", state["mounted"]], capture_output=True)
        if state.get("loop"):
            subprocess.run(["losetup", "-d", state["loop"]], capture_output=True)
        if state.get("cgroup") and os.path.isdir(state["cgroup"]):
            _empty_cgroup(state["cgroup"])
            with contextlib.suppress(OSError):
                os.rmdir(state["cgroup"])
        if state.get("image"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state["image"])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.state_path)
        self.state = {}

    # -- using it ---------------------------------------------------------

    def join(self) -> None:
        """Move the calling process into the profile's cgroup (use as a
        ``preexec_fn``: children, such as DataLoader workers, follow)."""
        cgroup = self.state.get("cgroup")
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def cold(self) -> None:
        """Empty every cache in front of the data: the page cache and, on
        ``hdd-seek``, the virtual disk's own cache and head position."""
        drop_caches()
        if self.spec.kind == "seekfs":
            self.seekfs("drop")

    def seekfs(self, command: str) -> dict:
        """Send ``stats``/``reset``/``drop`` to the running seek model."""
        from bench.profiles.seekfs import control

        return control(self.state["control"], command)

    def io_stats(self) -> dict:
        """Bytes and requests served to the cgroup / by the seek model."""
        if self.spec.kind == "seekfs":
            return self.seekfs("stats")["stats"]
        cgroup = self.state.get("cgroup")
        if not cgroup:
            return {}
        out = {}
        for name in ("io_service_bytes", "io_serviced"):
            with open(os.path.join(cgroup, f"blkio.throttle.{name}")) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 3 and parts[0] == self.state.get("majmin") and parts[1] == "Read":
                        out[f"read_{name}"] = int(parts[2])
        return out

    # -- internals --------------------------------------------------------

    def _save_state(self) -> None:
        with open(self.state_path, "w") as f:
            json.dump(self.state, f)

    def load_state(self) -> dict:
        """What :meth:`setup` recorded (empty when not set up)."""
        if self.state:
            return self.state
        try:
            with open(self.state_path) as f:
                self.state = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            self.state = {}
        return self.state

    def _setup_loop(self) -> None:
        if not os.path.isdir(BLKIO_ROOT) or not os.path.exists(
            os.path.join(BLKIO_ROOT, "blkio.throttle.read_bps_device")
        ):
            raise ProfileError(
                f"{BLKIO_ROOT} with blkio.throttle.* is missing: the hdd/ssd profiles need cgroup v1 blkio throttling"
            )
        image = os.path.join(self.base, "disk.img")
        with open(image, "wb") as f:
            f.truncate(self.image_bytes)
        self.state["image"] = image
        self._save_state()
        loop = _run("losetup", "--find", "--show", image)
        self.state["loop"] = loop
        self._save_state()
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop)
        os.makedirs(self.mount)
        _run("mount", "-o", "noatime", loop, self.mount)
        self.state["mounted"] = self.mount
        self._save_state()
        majmin = _run("lsblk", "-dno", "MAJ:MIN", loop).replace(" ", "")
        self.state["majmin"] = majmin
        if self.spec.rotational is not None:
            # A loop device inherits the flag of the disk under its image;
            # say what kind of disk it stands for instead.
            with open(f"/sys/block/{os.path.basename(loop)}/queue/rotational", "w") as f:
                f.write("1\n" if self.spec.rotational else "0\n")
        # One cgroup per setup (pid in the name), so that concurrent runs never
        # share, and teardown never empties, a group it did not make.
        cgroup = os.path.join(BLKIO_ROOT, f"{CGROUP_PREFIX}{self.spec.name}-{os.getpid()}")
        os.makedirs(cgroup)
        self.state["cgroup"] = cgroup
        self._save_state()
        for name, value in (("read_bps_device", self.spec.read_bps), ("read_iops_device", self.spec.read_iops)):
            with open(os.path.join(cgroup, f"blkio.throttle.{name}"), "w") as f:
                f.write(f"{majmin} {value}\n")
        logger.info("%s: %s (%s) on %s, cgroup %s", self.spec.name, loop, majmin, self.mount, cgroup)

    def _start_seekfs(self) -> None:
        # A Unix socket's path holds at most 107 bytes, which a work folder
        # deep in pytest's temporaries (one per xdist worker) can pass alone:
        # the socket gets a short folder of its own, removed on teardown.
        control = os.path.join(tempfile.mkdtemp(prefix="seekfs-", dir="/tmp"), "control.sock")
        log = open(os.path.join(self.base, "seekfs.log"), "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.profiles.seekfs", self.backing, self.mount, "--control", control],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.state.update(seekfs_pid=proc.pid, control=control, fuse_mount=self.mount)
        self._save_state()
        deadline = time.monotonic() + 30
        while not (os.path.ismount(self.mount) and os.path.exists(control)):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.base, "seekfs.log")) as f:
                    tail = f.read()[-2000:]
                raise ProfileError(f"seekfs did not mount {self.mount}:\n{tail}")
            time.sleep(0.1)

    def _stop_seekfs(self, state: dict) -> None:
        pid = state["seekfs_pid"]
        mount = state.get("fuse_mount", self.mount)
        if os.path.ismount(mount):
            subprocess.run(["fusermount", "-u", mount], capture_output=True)
            if os.path.ismount(mount):
                subprocess.run(["umount", "-l", mount], capture_output=True)
        for _ in range(50):
            if not _alive(pid):
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _empty_cgroup(cgroup: str) -> None:
    """Move any process still in ``cgroup`` back to the root blkio group."""
    with contextlib.suppress(OSError):
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            pids = f.read().split()
        for pid in pids:
            with contextlib.suppress(OSError):
                with open(os.path.join(BLKIO_ROOT, "cgroup.procs"), "w") as f:
                    f.write(pid)


def _check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise ProfileError("/dev/fuse is missing: the hdd-seek profile needs FUSE")
    if shutil.which("fusermount") is None:
        raise ProfileError("fusermount not found: run `apt-get install -y fuse libfuse2`")
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        raise ProfileError(
            f"hdd-seek needs mfusepy and libfuse ({exc}): run `pip install mfusepy` and "
            "`apt-get install -y fuse libfuse2` (bench/profiles/install_deps.sh does both)"
        ) from None


@contextlib.contextmanager
def mounted(name: str, workdir: str, **kwargs) -> Iterator[Profile]:
    """Set up profile ``name`` and always tear it down afterwards."""
    profile = Profile(PROFILES[name], workdir, **kwargs)
    try:
        profile.setup()
        yield profile
    finally:
        profile.teardown()
        if not os.path.ismount(profile.mount):  # the copied data goes too
            shutil.rmtree(profile.base, ignore_errors=True)
