"""Fixtures shared by every test area: tiny real datasets in tmp_path."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
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
