"""A real two-node Ray cluster for the Ray tests, in a network namespace of its own.

Outside a namespace Ray binds to the machine's network address; inside one
with only loopback up it uses 127.0.0.1, so test traffic stays on this
machine. The cluster (a head and a second node, one CPU each, separate
raylets) is started once per session; drivers and the CLI run in it through
``ip netns exec`` subprocesses, while the test process itself stays outside.
Teardown stops every process in the namespace (all of them started here)
and deletes it, also when a test failed.

Hermetic: every process of the cluster (raylets, workers, the drivers and
the CLI run through it) gets a HOME, TMPDIR and Ray temp dir of its own under
one temporary folder, and no ``RAY_*`` setting of the caller's environment. A
``ray.init()`` run on this machine before leaves ``~/.ray/auth_token``; a
head that sees it turns on token authentication and refuses the second node
(``InvalidAuthToken``). The session cluster therefore starts on behalf of a
fake user whose home holds such a token, so every run checks that it does not
matter, and nothing is read from or written to the real home.

Creating a namespace needs root; without it these tests fail and say so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HEAD_PORT = 6379


@dataclass(frozen=True)
class RayCluster:
    """A running cluster: its namespace, its head's address and the environment of its processes."""

    namespace: str
    address: str
    env: dict[str, str]

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(self, argv: Sequence[str], *, timeout_s: float = 180) -> subprocess.CompletedProcess:
        """Run ``argv`` in the namespace from the repository root; capture its output."""
        return subprocess.run(
            self.command(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=self.env
        )

    def popen(self, argv: Sequence[str]) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )

    def shardkit(self, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
        """``shardkit ARGS`` (the installed CLI) in the namespace."""
        return self.run([sys.executable, "-m", "shardkit", *args], timeout_s=timeout_s)

    def driver(self, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
        """``tests/ray/driver.py ARGS`` (Ray Data drivers) in the namespace, connected to this cluster."""
        return self.run([sys.executable, str(ROOT / "tests" / "ray" / "driver.py"), self.address, *args], timeout_s=timeout_s)


def cluster_env(base: dict[str, str], root: Path) -> dict[str, str]:
    """The environment of every process in a cluster kept under ``root``.

    ``base`` (the caller's environment) minus its ``RAY_*`` settings (an
    address, an auth mode or token path, a temp dir), with HOME and TMPDIR
    inside ``root``: Ray reads ``~/.ray/auth_token`` and writes its files
    there, and so does anything a Ray worker starts.
    """
    env = {k: v for k, v in base.items() if not k.startswith("RAY_")}
    env["HOME"] = str(root / "home")
    env["TMPDIR"] = str(root / "tmp")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONPATH"] = str(ROOT)
    return env


def _check(argv: list[str], what: str, env: dict[str, str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def _stop_namespace(name: str) -> None:
    """Stop every process in namespace ``name`` (TERM, then KILL) and delete it.
    Ray's processes get 3 s to end on TERM: nothing of theirs is kept."""
    for sig, grace_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), sig)
            except (ProcessLookupError, ValueError):
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            time.sleep(0.2)
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)


#: What ``ray.init()`` leaves in a home: the token of some other cluster.
UNRELATED_TOKEN = "f" * 64


@contextmanager
def running_cluster(base_env: dict[str, str]) -> Iterator[RayCluster]:
    """A two-node cluster in a new network namespace, its files under a new temporary folder.

    The folder is short (``/tmp/rskt-XXXXXX``: Ray puts Unix sockets under
    it, whose paths may not exceed 107 bytes) and holds the cluster's HOME,
    TMPDIR and Ray temp dir; teardown stops the namespace's processes and
    deletes both, also when a test failed.
    """
    name = f"skt-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    root = Path(tempfile.mkdtemp(prefix="rskt-", dir="/tmp"))
    for sub in ("home", "tmp", "ray"):
        (root / sub).mkdir()
    env = cluster_env(base_env, root)
    created = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if created.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"cannot create network namespace {name} for the Ray tests: {created.stderr.strip()}")
    cluster = RayCluster(namespace=name, address=f"127.0.0.1:{HEAD_PORT}", env=env)
    try:
        _check(cluster.command(["ip", "link", "set", "lo", "up"]), "bringing up loopback", env)
        common = ["--num-cpus=1", "--disable-usage-stats", f"--temp-dir={root / 'ray'}"]
        _check(
            cluster.command([
                str(BIN / "ray"), "start", "--head", f"--port={HEAD_PORT}", "--include-dashboard=false", *common,
            ]),
            "ray start --head",
            env,
        )
        _check(
            cluster.command([str(BIN / "ray"), "start", f"--address={cluster.address}", *common]),
            "ray start (node 2)",
            env,
        )
        waited = cluster.driver("wait-nodes", "2")
        if waited.returncode != 0:
            raise RuntimeError(f"the second Ray node did not join: {waited.stderr.strip()[-2000:]}")
        yield cluster
    finally:
        _stop_namespace(name)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def user_home(tmp_path_factory) -> Path:
    """The home of the user starting the test cluster: it holds an unrelated cluster's auth token."""
    home = tmp_path_factory.mktemp("user-home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(UNRELATED_TOKEN)
    return home


@pytest.fixture(scope="package")  # stopped after tests/ray: its idle processes would share the cores with the rest
def ray_cluster(user_home) -> Iterator[RayCluster]:
    pytest.importorskip("ray", reason="the Ray tests need `pip install 'shardkit[ray]'` (make test installs it)")
    if os.geteuid() != 0:
        pytest.fail(
            "the Ray tests need root to create a network namespace (ip netns add) so Ray stays on loopback; "
            "run them as root"
        )
    with running_cluster({**os.environ, "HOME": str(user_home)}) as cluster:
        yield cluster


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too), by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
