"""The hostile-data harness: each case runs one entry point in a child
process (see :mod:`tests.hostile.entry`) with a memory cap and a timeout.

The readers' children (``stream``, ``loader``, ``indexed``) are forked from
a ``forkserver`` that imported torch and shardkit once, as DataLoader workers
started that way are: a new interpreter importing torch takes ~2.5 s, most of
these tests' time. The server is a new interpreter, not a fork of the test
process, so each child starts from the same clean state. The writer,
``verify`` and ``info`` run in a new interpreter without torch, as users run
them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from tests.hostile import entry as entry_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PRELOADED = multiprocessing.get_context("forkserver")
# Takes effect when the server starts, at the first reader case (a server
# another test started earlier would import these in each child instead).
_PRELOADED.set_forkserver_preload(["torch", "shardkit", "tests.hostile.entry"])


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
    argv = [entry, str(target), "--on-error", on_error, "--mem-mb", str(mem_mb), "--options", json.dumps(options or {})]
    if entry in entry_module.READERS and env is None:
        return _run_forked(argv, timeout_s)
    cmd = [sys.executable, "-m", "tests.hostile.entry", *argv]
    child_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=child_env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Outcome("hang", child_output=out)
    return _outcome(done.stdout + done.stderr, done.stdout, f"exit {done.returncode}")


def _run_forked(argv: list[str], timeout_s: float) -> Outcome:
    """:func:`run_entry` for a reader: a child of the preloaded forkserver."""
    with tempfile.TemporaryDirectory(prefix="shardkit-hostile-") as folder:
        output = os.path.join(folder, "output")
        child = _PRELOADED.Process(target=entry_module.run_forked, args=(argv, output))
        child.start()
        child.join(timeout_s)
        hung = child.is_alive()
        if hung:
            child.kill()
            child.join()
        with open(output, errors="replace") if os.path.exists(output) else open(os.devnull) as f:
            printed = f.read()
    if hung:
        return Outcome("hang", child_output=printed)
    return _outcome(printed, printed, f"exit {child.exitcode}")


def _outcome(printed: str, stdout: str, status: str) -> Outcome:
    """The child's report: the last line of ``stdout`` that is a JSON object
    (a forked child's stdout has its stderr in it), or a crash."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return Outcome(**json.loads(line), child_output=printed)
            except (json.JSONDecodeError, TypeError):  # not the report
                break
    return Outcome("crash", message=status, child_output=printed)


def run_entries(runs: list[tuple[tuple, dict]]) -> list[Outcome]:
    """:func:`run_entry` for each ``(args, kwargs)`` of ``runs``, two children
    at a time (each is mostly an interpreter starting), in order."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda run: run_entry(*run[0], **run[1]), runs))


@pytest.fixture
def hostile():
    """The runner, as a fixture: ``hostile("stream", path, on_error="skip")``."""
    return run_entry


def _fuzz_in_child(fuzz: Callable[..., dict], args: tuple, mem_mb: int, output: str) -> None:
    """``fuzz(*args)`` (a seeded fuzz's report: ``{"outcomes", "failures"}``)
    under the memory cap, written to ``output``; a crash is a failure of its own."""
    import logging
    import traceback

    logging.getLogger("shardkit").setLevel(logging.ERROR)  # each skip logs a line
    entry_module._cap_memory(mem_mb)
    try:
        report = fuzz(*args)
    except BaseException:  # noqa: BLE001 - the parent fails on it
        report = {"outcomes": {}, "failures": [f"the fuzz stopped:\n{traceback.format_exc()}"]}
    with open(output, "w") as f:
        json.dump(report, f)


def run_fuzz(fuzz: Callable[..., dict], args: tuple, *, output: str, mem_mb: int, timeout_s: float) -> dict:
    """Run a seeded fuzz in a child of the preloaded forkserver, under a
    memory cap and a timeout, and return its report (failing the test if the
    child ran past the timeout or died)."""
    child = _PRELOADED.Process(target=_fuzz_in_child, args=(fuzz, args, mem_mb, output))
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the fuzz ran past {timeout_s} s")
    assert os.path.exists(output), f"the fuzzing child died (exit {child.exitcode}): out of memory past {mem_mb} MB?"
    with open(output) as f:
        return json.load(f)


def print_outcomes(capsys: pytest.CaptureFixture, title: str, report: dict) -> None:
    """A fuzz report's outcomes, counted, past the capture."""
    with capsys.disabled():
        print(f"\n{title}")
        for outcome, n in sorted(report["outcomes"].items()):
            print(f"  {n:6d}  {outcome}")
