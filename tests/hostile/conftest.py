"""The hostile-data harness: each case runs one entry point in a child
process (see :mod:`tests.hostile.entry`) with a memory cap and a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Outcome:
    """What one entry point did with one hostile input."""

    outcome: str  # "ok", "error" (a shardkit error), "foreign" (any other exception), "hang"
    error_type: str | None = None
    message: str = ""
    samples: list = field(default_factory=list)
    skipped: int = 0
    peak_rss_mb: float = 0.0
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    child_output: str = ""  # everything the child printed (logs included)

    @property
    def keys(self) -> list[str]:
        return [s[0] for s in self.samples]


def run_entry(
    entry: str,
    target: str,
    *,
    on_error: str = "raise",
    mem_mb: int = 1024,
    timeout_s: float = 60,
    options: dict | None = None,
    env: dict | None = None,
) -> Outcome:
    """Run ``entry`` on ``target`` in a child process; a child that runs past
    ``timeout_s`` is killed and reported as ``outcome="hang"``."""
    cmd = [
        sys.executable, "-m", "tests.hostile.entry", entry, str(target),
        "--on-error", on_error, "--mem-mb", str(mem_mb), "--options", json.dumps(options or {}),
    ]
    child_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=child_env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Outcome("hang", child_output=out)
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return Outcome("crash", message=f"exit {done.returncode}", child_output=done.stdout + done.stderr)
    return Outcome(**report, child_output=done.stdout + done.stderr)


def run_entries(runs: list[tuple[tuple, dict]]) -> list[Outcome]:
    """:func:`run_entry` for each ``(args, kwargs)`` of ``runs``, two children
    at a time (each is mostly an interpreter starting), in order."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda run: run_entry(*run[0], **run[1]), runs))


@pytest.fixture
def hostile():
    """The runner, as a fixture: ``hostile("stream", path, on_error="skip")``."""
    return run_entry
