"""A real two-node Ray cluster for the Ray tests, in a network namespace of its own.

Outside a namespace Ray binds to the machine's network address; inside one
with only loopback up it uses 127.0.0.1, so test traffic stays on this
machine. The cluster (a head and a second node, one CPU each, separate
raylets) is started once per session; drivers and the CLI run in it through
``ip netns exec`` subprocesses, while the test process itself stays outside.
Teardown stops every process in the namespace (all of them started here)
and deletes it, also when a test failed.

Creating a namespace needs root; without it these tests fail and say so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HEAD_PORT = 6379


@dataclass(frozen=True)
class RayCluster:
    """A running cluster: its namespace and its head's address."""

    namespace: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(self, argv: Sequence[str], *, timeout_s: float = 180) -> subprocess.CompletedProcess:
        """Run ``argv`` in the namespace from the repository root; capture its output."""
        return subprocess.run(
            self.command(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=_env()
        )

    def popen(self, argv: Sequence[str]) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )

    def shardkit(self, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
        """``shardkit ARGS`` (the installed CLI) in the namespace."""
        return self.run([sys.executable, "-m", "shardkit", *args], timeout_s=timeout_s)

    def driver(self, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
        """``tests/ray/driver.py ARGS`` (Ray Data drivers) in the namespace, connected to this cluster."""
        return self.run([sys.executable, str(ROOT / "tests" / "ray" / "driver.py"), self.address, *args], timeout_s=timeout_s)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONPATH"] = str(ROOT)
    env.pop("RAY_ADDRESS", None)
    return env


def _check(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env())
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def _stop_namespace(name: str) -> None:
    """Stop every process in namespace ``name`` (TERM, then KILL) and delete it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), sig)
            except (ProcessLookupError, ValueError):
                pass
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            time.sleep(0.2)
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> Iterator[RayCluster]:
    pytest.importorskip("ray", reason="the Ray tests need `pip install 'shardkit[ray]'` (make test installs it)")
    if os.geteuid() != 0:
        pytest.fail(
            "the Ray tests need root to create a network namespace (ip netns add) so Ray stays on loopback; "
            "run them as root"
        )
    name = f"skt-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    temp_dir = f"/tmp/rskt-{uuid.uuid4().hex[:6]}"  # short: Ray puts Unix sockets under it
    created = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if created.returncode != 0:
        pytest.fail(f"cannot create network namespace {name} for the Ray tests: {created.stderr.strip()}")
    cluster = RayCluster(namespace=name, address=f"127.0.0.1:{HEAD_PORT}")
    try:
        _check(cluster.command(["ip", "link", "set", "lo", "up"]), "bringing up loopback")
        common = ["--num-cpus=1", "--disable-usage-stats"]
        _check(
            cluster.command([
                str(BIN / "ray"), "start", "--head", f"--port={HEAD_PORT}", f"--temp-dir={temp_dir}",
                "--include-dashboard=false", *common,
            ]),
            "ray start --head",
        )
        _check(cluster.command([str(BIN / "ray"), "start", f"--address={cluster.address}", *common]), "ray start (node 2)")
        waited = cluster.run([sys.executable, str(ROOT / "tests" / "ray" / "driver.py"), cluster.address, "wait-nodes", "2"])
        if waited.returncode != 0:
            raise RuntimeError(f"the second Ray node did not join: {waited.stderr.strip()[-2000:]}")
        yield cluster
    finally:
        _stop_namespace(name)
        subprocess.run(["rm", "-rf", temp_dir], capture_output=True)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too), by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
