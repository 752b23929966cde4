"""Fixtures shared by every test area: tiny real datasets in tmp_path."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import settings

from shardkit.format.manifest import Manifest
from shardkit.write.publish import publish_manifest
from shardkit.write.destination import shard_name
from shardkit.write.shard import ShardFile
from tests.remote.remote_servers import FaultyHTTPServer

# The property tests draw the same examples on every run (profile "ci", the
# default), so a run's verdict depends on the code alone; `pytest
# --hypothesis-profile explore` draws new ones each run to look for
# counterexamples (keep any it finds as an @example).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("ci")


def sample_payload(key: str, size: int) -> bytes:
    """Deterministic bytes for a sample, so tests can check content exactly."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def build_dataset(
    dest: str,
    sizes: Sequence[int],
    *,
    payload_bytes: int = 100,
    num_classes: int = 10,
    with_manifest: bool = True,
) -> Manifest:
    """Write shards of the given sample counts (zero allowed) with keys
    ``s{shard:03d}_{i:05d}``; each sample has ``bin`` (payload), ``cls`` (label)
    and ``json`` (its coordinates). Returns the manifest."""
    os.makedirs(dest, exist_ok=True)
    entries = []
    for shard_index, count in enumerate(sizes):
        path = os.path.join(dest, shard_name(shard_index))
        with ShardFile(path) as shard:
            for i in range(count):
                key = f"s{shard_index:03d}_{i:05d}"
                label = (shard_index * 7 + i) % num_classes
                meta = json.dumps({"shard": shard_index, "i": i}).encode()
                shard.add(key, [("bin", sample_payload(key, payload_bytes)), ("cls", str(label).encode()), ("json", meta)])
            written = shard.commit()
        entries.append(written.entry())
    manifest = Manifest(
        shards=tuple(entries),
        extensions=("bin", "cls", "json"),
        source={"format": "python"},
        location=os.path.abspath(dest),
    )
    if with_manifest:
        publish_manifest(dest, manifest)
    return manifest


@pytest.fixture
def make_shards(tmp_path) -> Callable[..., Manifest]:
    """``make_shards(sizes=[5, 0, 3], name="ds", payload_bytes=100)`` -> Manifest."""

    def make(sizes: Sequence[int] = (5, 5, 5), *, name: str = "ds", **kwargs) -> Manifest:
        return build_dataset(str(tmp_path / name), sizes, **kwargs)

    return make


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--fuzz-mutations",
        type=int,
        default=300,
        help="mutations tests/hostile/test_fuzz.py tries per run (1000 for the acceptance run by hand)",
    )


#: ``make test`` runs the suite on two pytest-xdist workers with ``--dist
#: loadscope``: each test module is one unit of work, run whole on one worker,
#: so a module fixture is built once (not once per worker). The tests matched
#: here each start several processes of their own (torchrun ranks and their
#: DataLoader workers, a Ray cluster, Chromium, loop devices and FUSE): they
#: form one unit, "heavy", so one worker runs them one after another while
#: the other runs the rest, never two such launches at once on two cores.
#: Patterns over node ids (``fnmatch``, whose ``*`` crosses folders).
HEAVY_TESTS = (
    "tests/ray/*",  # a two-node Ray cluster in a network namespace (a package fixture)
    "tests/*/test_torchrun*.py::*",  # torchrun, 2 to 4 ranks with their workers
    "tests/read/test_boundaries.py::test_torchrun*",  # torchrun, 3 ranks then 2
    "tests/read/test_budget.py::test_torchrun*",  # torchrun, 3 ranks then 2
    "tests/read/test_packed.py::test_torchrun*",  # torchrun, 3 ranks then 2
    "tests/read/test_per_stream.py::*",  # one torchrun run, shared by its module
    "tests/read/test_frameworks.py::*",  # accelerate, Lightning and the HF Trainer under torchrun
    "tests/preview/test_browser.py::*",  # headless Chromium
    "tests/bench/test_profiles.py::*",  # loop devices, blkio throttling, the seekfs FUSE file system
    "tests/probe/test_bench_command.py::test_a_throttled_disk*",  # a loop device throttled by blkio
)
HEAVY_SCOPE = "heavy"
#: Tests sharing a package fixture (the Ray cluster): kept together in any
#: order (``-p randomly``), so the fixture is started once.
PACKAGE_FIXTURE_TESTS = "tests/ray/"


def is_heavy(nodeid: str) -> bool:
    return any(fnmatch.fnmatchcase(nodeid, pattern) for pattern in HEAVY_TESTS)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with the heavy tests as one scope (see :data:`HEAVY_TESTS`).
    The other ``--dist`` modes are xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HeavyTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return HEAVY_SCOPE if is_heavy(nodeid) else super()._split_scope(nodeid)

    return HeavyTogether(config, log)


def pytest_collection_modifyitems(items) -> None:
    """Keep the tests of :data:`PACKAGE_FIXTURE_TESTS` together, where the
    first of them stands: pytest-randomly shuffles modules before this hook
    runs, and each module between two of them would stop and restart their
    package fixture. In the collection order nothing moves."""
    together = [item for item in items if item.nodeid.startswith(PACKAGE_FIXTURE_TESTS)]
    if together:
        at = items.index(together[0])
        rest = [item for item in items if not item.nodeid.startswith(PACKAGE_FIXTURE_TESTS)]
        items[:] = rest[:at] + together + rest[at:]


#: What programs take for a user's home and its parts: each test process, and
#: every process a test starts, gets a new empty home instead (removed at the
#: end), so no test reads a user's settings or caches (~/.aws, ~/.ray,
#: ~/.cache/huggingface, ~/.config/matplotlib) or leaves files there.
#: Hypothesis keeps its files there too, not in the checkout.
HOME_VARIABLES = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
                  "HYPOTHESIS_STORAGE_DIRECTORY")  # fmt: skip
_SAVED_HOME = pytest.StashKey[tuple[str, dict[str, "str | None"]]]()


def pytest_configure(config) -> None:
    home = tempfile.mkdtemp(prefix="shardkit-tests-home-")
    config.stash[_SAVED_HOME] = (home, {name: os.environ.get(name) for name in HOME_VARIABLES})
    for name in HOME_VARIABLES:
        os.environ.pop(name, None)
    os.environ["HOME"] = home
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = os.path.join(home, ".hypothesis")


def pytest_unconfigure(config) -> None:
    home, saved = config.stash[_SAVED_HOME]
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def http_server():
    """A fault-injecting HTTP server on 127.0.0.1 (see tests/remote/remote_servers.py)."""
    from shardkit.io import http

    server = FaultyHTTPServer().start()
    try:
        yield server
    finally:
        server.close()
        # What a process learnt of a server that ignores ranges goes with it: a later
        # test's server may be given the same port.
        http._WHOLE_OBJECT_ORIGINS.clear()


@pytest.fixture(scope="session")
def moto_s3_server() -> Iterator[tuple[str, int]]:
    """moto's S3 server on 127.0.0.1, one per test process: ``(host, port)``.
    Tests take it through ``s3_server`` (tests/remote/conftest.py), which
    also puts its credentials in the environment for the test's duration."""
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield server.get_host_and_port()
    finally:
        server.stop()


#: Put before a :func:`paused_run` script: ``pause()`` says the run has
#: reached its pause, then waits for the go file (the last argument).
_PAUSE = """
import os, sys, time
def pause(*_):
    open(sys.argv[-1] + ".started", "w").close()
    while not os.path.exists(sys.argv[-1]):
        time.sleep(0.02)
"""


@contextlib.contextmanager
def paused_run(script: str, *args: str, go: Path) -> Iterator[None]:
    """Run ``python -c SCRIPT ARGS GO`` in a subprocess until it calls
    ``pause()`` (a progress callback, say); the block runs while it waits
    there. On leaving the block the run goes on and must end well; it is
    killed if the block raised."""
    run = subprocess.Popen([sys.executable, "-c", _PAUSE + script, *args, str(go)])
    started = Path(f"{go}.started")
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert started.exists(), "the run never reached its pause"
        yield
        go.touch()
        assert run.wait(timeout=60) == 0
    finally:
        run.kill()
        run.wait()
