"""What the standalone benchmark scripts (bench_*.py) share: a description
of the machine a run took place on, and where a run's record goes (JSON, with
its Markdown table and plot beside it)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

#: The repository's root (cells run with it on their PYTHONPATH).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def run_cell(
    script: str,
    spec: Mapping[str, Any],
    *,
    answer: str,
    python: str,
    timeout_s: float,
    prefix: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``script --cell SPEC`` in a fresh interpreter ``python`` (inside
    ``prefix``, e.g. ``ip netns exec``) and return the JSON it printed after
    ``answer`` on a line, or ``{"error": ...}`` with the tail of its stderr.
    The cell runs in a session of its own, killed whole (its workers too)
    when it runs past ``timeout_s``."""
    command = [*(prefix or []), python, os.path.abspath(script), "--cell", json.dumps(spec)]
    child_env = {**(env or os.environ), "PYTHONPATH": REPO_ROOT}
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout_s:.0f} s"}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for line in stdout.splitlines():
        if line.startswith(answer):
            return json.loads(line[len(answer) :])
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return {"error": lines[-1][:500] if lines else f"exit code {proc.returncode}", "stderr_tail": stderr[-2000:]}


def bench_parser(doc: str | None, name: str, *, quick_help: str, timeout_s: float) -> argparse.ArgumentParser:
    """The options every ``bench_NAME.py`` takes: ``--quick``, ``--workdir``
    (``bench/work/NAME``), ``--timeout-s`` of a cell, ``--out``, and the
    hidden ``--cell`` a cell's process is started with."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--workdir", default=os.path.join("bench", "work", name))
    parser.add_argument("--timeout-s", type=float, default=timeout_s)
    parser.add_argument("--out", help=f"JSON record (default bench/results/{name}.json; --quick: under --workdir)")
    return parser


def answer_cell(args: argparse.Namespace, answer: str, run: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """In a cell's process (``--cell SPEC``): print ``run(SPEC)`` after
    ``answer`` for :func:`run_cell` and say so; else False."""
    if not args.cell:
        return False
    print(answer + json.dumps(run(json.loads(args.cell))), flush=True)
    return True


def publish_run(
    args: argparse.Namespace,
    name: str,
    record: Mapping[str, Any],
    markdown: Callable[[Mapping[str, Any]], str],
    plot: Callable[[Mapping[str, Any], str], None],
) -> int:
    """Write a run's record, table and plot (``bench/results/NAME.*``, or
    ``--workdir/NAME-quick.*`` for ``--quick``, or ``--out``) and print the table."""
    out = args.out or (
        os.path.join(args.workdir, f"{name}-quick.json") if args.quick else os.path.join("bench", "results", f"{name}.json")
    )
    table = markdown(record)
    save_record(out, record, table)
    plot(record, plot_path(out))
    print(table)
    return 0


def bench_main(
    argv: list[str] | None,
    doc: str | None,
    name: str,
    *,
    answer: str,
    cells: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]],
    measure: Callable[[argparse.Namespace, dict[str, Any]], Mapping[str, Any]],
    presets: tuple[Mapping[str, Any], Mapping[str, Any]],
    markdown: Callable[[Mapping[str, Any]], str],
    plot: Callable[[Mapping[str, Any], str], None],
    timeout_s: float = 900,
) -> int:
    """The ``main`` of a ``bench_NAME.py`` whose cells run in fresh processes:
    answer a cell (``--cell SPEC``, one of ``cells`` by its ``"cell"``), or
    measure with the full preset (the quick one with ``--quick``, the first
    of ``presets`` is the full one) and publish the record."""
    parser = bench_parser(doc, name, quick_help="small sizes, one repeat", timeout_s=timeout_s)
    args = parser.parse_args(argv)
    if answer_cell(args, answer, lambda spec: cells[spec["cell"]](spec)):
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    full, quick = presets
    return publish_run(args, name, measure(args, dict(quick if args.quick else full)), markdown, plot)

