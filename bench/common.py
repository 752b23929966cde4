"""What the standalone benchmark scripts (bench_*.py) share: a description
of the machine a run took place on, and where a run's record goes (JSON, with
its Markdown table and plot beside it)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Mapping
from typing import Any


def machine() -> dict[str, Any]:
    """The operating system, CPU count and Python version of this machine."""
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}


def peak_rss_mb() -> float:
    """This process's peak resident set in MB (VmHWM; ru_maxrss would carry the parent's over fork + exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def git_commit() -> str:
    """The short commit of the checkout the benchmark runs in, or "unknown"."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown_path(json_path: str) -> str:
    """The Markdown file that goes with a JSON record: the same name, ending ``.md``."""
    return os.path.splitext(json_path)[0] + ".md"


def plot_path(json_path: str) -> str:
    """The PNG plot that goes with a JSON record: the same name, ending ``.png``."""
    return os.path.splitext(json_path)[0] + ".png"


def save_record(json_path: str, record: Mapping[str, Any], table: str) -> None:
    """Write ``record`` to ``json_path`` as indented JSON and ``table`` as it is
    to :func:`markdown_path`, creating their folder if need be."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(record, f, indent=1)
    with open(markdown_path(json_path), "w") as f:
        f.write(table)
