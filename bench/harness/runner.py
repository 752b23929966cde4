"""A long-lived child process that runs loaders on request.

Importing torch from a cold page cache takes seconds here, and every run
starts cold, so each profile gets one runner process: it imports torch once,
sits in the profile's cgroup (its DataLoader workers inherit that), and runs
one loader pass per JSON line it reads on stdin, answering with one JSON line
on stdout. The parent empties the caches between requests.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Prefix of answer lines (anything else on stdout is the loaders' chatter).
ANSWER = "@@bench-runner "


class Runner:
    """The parent's handle on a runner process."""

    def __init__(self, *, preexec: Callable[[], None] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.harness.runner"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=preexec,
        )
        self.request({"op": "ping"})

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(ANSWER):
                answer = json.loads(line[len(ANSWER) :])
                if "error" in answer:
                    raise RuntimeError(f"runner failed on {message}: {answer['error']}")
                return answer
        raise RuntimeError(f"runner exited (code {self.proc.wait()}) during {message}")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_cold(seekfs_control: str | None) -> None:
    """Empty the caches between building a loader and timing it, so what the
    loader reads at its start (inodes, directory blocks, indexes) comes from
    the device too, as it does on a dataset too big to stay cached."""
    from bench.profiles import drop_caches

    drop_caches()
    if seekfs_control is not None:
        from bench.profiles.seekfs import control

        control(seekfs_control, "drop")


def serve() -> None:
    import warnings

    # Imported once, before any timed run, so no loader's first run pays
    # for loading modules the others find loaded.
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torchvision.datasets  # noqa: F401
    import webdataset  # noqa: F401

    with contextlib.suppress(ImportError):  # reported per run by loaders.build
        import shardkit  # noqa: F401

    # More workers than cores is the point of the worker sweep.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    from bench.harness import loaders

    for line in sys.stdin:
        message = json.loads(line)
        try:
            if message["op"] == "ping":
                answer: dict[str, Any] = {"pid": os.getpid()}
            elif message["op"] == "run":
                options = {k: v for k, v in message.items() if k not in ("op", "loader", "root", "cold")}
                cold = message.get("cold")
                answer = loaders.run(
                    message["loader"],
                    message["root"],
                    before_timing=None if cold is None else functools.partial(make_cold, cold.get("seekfs_control")),
                    **options,
                )
            else:
                answer = {"error": f"unknown op {message['op']!r}"}
        except loaders.LoaderUnavailable as exc:
            answer = {"unavailable": str(exc)}
        except Exception:  # reported to the parent, which decides
            answer = {"error": traceback.format_exc()}
        sys.stdout.write(ANSWER + json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
