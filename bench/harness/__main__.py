"""Run the benchmark suite: ``python -m bench.harness [--quick]`` (as root).

Parts: ``throughput`` (the loader table on every storage profile),
``memory`` (worker RSS vs dataset size) and ``shuffle`` (quality vs buffer
size). Each part writes ``RESULTS_DIR/<part>.json`` when it finishes; then
``RESULTS.md`` and the plots are regenerated from whatever JSON is there.
``python -m bench.harness report`` only regenerates them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

from bench.harness import report
from bench.harness.data import DataSpec, ensure_data
from bench.harness.throughput import ThroughputPlan, measure_profile
from bench.profiles import PROFILES, ProfileError, require_root

logger = logging.getLogger("bench.harness")
BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(BENCH_DIR)
PARTS = ("throughput", "memory", "shuffle")


@dataclass(frozen=True)
class Suite:
    """Sizes of one suite (full or quick)."""

    data: DataSpec
    plan: ThroughputPlan
    memory_sizes: tuple[int, ...]
    memory_samples_per_worker: int
    shuffle_buffers: tuple[int, ...]
    shuffle_seeds: tuple[int, ...]
    results_dir: str
    markdown: str


FULL = Suite(
    # 1000 images (~114 MB) per shard: the 100 MB+ shards packing guides advise.
    data=DataSpec(num_images=8000, num_shards=8, ceiling_bytes=512 << 20),
    plan=ThroughputPlan(
        repeats=3,
        # Runs on the fast profiles last about two seconds, where this
        # machine's noise is largest; more of them cost little. On hdd-seek
        # worker start-up varies by 30-100 ms (about 1% of a run) and the
        # targets there sit within 1% of the measured rates.
        repeats_by_profile=(("hdd-seek", 5), ("ssd", 5), ("raw", 5)),
        imagefolder_limit=600,
        ceiling_repeats=3,
        experiments=("shardkit-nolock",),
        # On `hdd` the throttle charges every request alike, so the lock
        # changes nothing there (0.98-1.02x in earlier runs).
        experiment_profiles=("hdd-seek",),
    ),
    memory_sizes=(10_000, 1_000_000, 10_000_000),
    memory_samples_per_worker=2000,
    shuffle_buffers=(1, 10, 100, 1000, 5000),
    shuffle_seeds=(0, 1, 2),
    results_dir=os.path.join(BENCH_DIR, "results"),
    markdown=os.path.join(BENCH_DIR, "RESULTS.md"),
)
QUICK = Suite(
    data=DataSpec(num_images=1200, num_shards=12, ceiling_bytes=256 << 20),
    plan=ThroughputPlan(repeats=1, imagefolder_limit=200, ceiling_repeats=1),
    memory_sizes=(10_000, 1_000_000),
    memory_samples_per_worker=1000,
    shuffle_buffers=(10, 100, 1000),
    shuffle_seeds=(0,),
    results_dir=os.path.join(BENCH_DIR, "work", "results-quick"),
    markdown=os.path.join(BENCH_DIR, "work", "results-quick", "RESULTS.md"),
)


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def machine_meta(command: str, mode: str) -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    try:
        with open("/proc/meminfo") as f:
            mem_gb = int(f.readline().split()[1]) / 1e6
    except OSError:
        mem_gb = 0.0
    return {
        "command": command,
        "mode": mode,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": commit,
        "machine": f"{platform.machine()}, {mem_gb:.0f} GB RAM",
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "torchvision": _version("torchvision"),
        "webdataset": _version("webdataset"),
        "shardkit": _version("shardkit"),
    }


def _write_json(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def run_throughput(suite: Suite, profiles: tuple[str, ...], workdir: str) -> dict[str, Any]:
    require_root()
    data_root = os.path.join(workdir, f"data-{suite.data.num_images}")
    logger.info("data: %d images, %d shards under %s", suite.data.num_images, suite.data.num_shards, data_root)
    paths = ensure_data(data_root, suite.data)
    image_sizes = []
    for dirpath, _dirs, files in os.walk(paths["imagefolder"]):
        image_sizes.extend(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    data_bytes = sum(image_sizes)
    image_bytes = 2 * data_bytes + suite.data.ceiling_bytes + (768 << 20)
    plan = replace(suite.plan, profiles=profiles)
    results = []
    for name in profiles:
        results.append(measure_profile(name, paths, plan, workdir, image_bytes))
    data = asdict(suite.data)
    data["mean_image_kb"] = data_bytes / len(image_sizes) / 1e3
    return {"data": data, "plan": asdict(plan), "profiles": results}


def load_results(results_dir: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for part in PARTS:
        try:
            with open(os.path.join(results_dir, f"{part}.json")) as f:
                payload = json.load(f)
        except FileNotFoundError:
            continue
        results[part] = payload["result"]
        results.setdefault("meta", payload["meta"])
    return results


def regenerate(suite: Suite) -> None:
    results = load_results(suite.results_dir)
    if not results:
        logger.warning("no results under %s to report", suite.results_dir)
        return
    report.plot_all(results, suite.results_dir)
    prefix = os.path.relpath(suite.results_dir, os.path.dirname(suite.markdown))
    prefix = "" if prefix == "." else prefix + "/"
    with open(suite.markdown, "w") as f:
        f.write(report.render_markdown(results, plot_prefix=prefix))
    logger.info("wrote %s and plots in %s", suite.markdown, suite.results_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", default="run", choices=("run", "report"))
    parser.add_argument("--quick", action="store_true", help="reduced suite (< 5 min), results in bench/work/results-quick")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--profiles", default=",".join(PROFILES), help=f"comma list of {', '.join(PROFILES)}")
    parser.add_argument("--workdir", default=os.path.join(BENCH_DIR, "work"), help="scratch space (git-ignored)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    # Turn SIGTERM into an exception so that profiles are torn down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    suite = QUICK if args.quick else FULL
    if args.action == "report":
        regenerate(suite)
        return 0
    parts = tuple(p for p in args.parts.split(",") if p)
    profiles = tuple(p for p in args.profiles.split(",") if p)
    unknown = [p for p in parts if p not in PARTS] + [p for p in profiles if p not in PROFILES]
    if unknown:
        parser.error(f"unknown part or profile: {', '.join(unknown)}")
    command = "python -m bench.harness " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = machine_meta(command.strip(), "quick" if args.quick else "full")
    os.makedirs(args.workdir, exist_ok=True)
    status = 0
    for part in parts:
        logger.info("== %s", part)
        try:
            if part == "throughput":
                result = run_throughput(suite, profiles, args.workdir)
            elif part == "memory":
                from bench.harness import memory

                result = memory.measure(os.path.join(args.workdir, "memory"), suite.memory_sizes,
                                        samples_per_worker=suite.memory_samples_per_worker)
            else:
                from bench.harness import shuffle

                result = shuffle.measure(os.path.join(args.workdir, "shuffle"), suite.shuffle_buffers,
                                         seeds=suite.shuffle_seeds)
        except ProfileError as exc:
            logger.error("%s: %s", part, exc)
            status = 2
            continue
        _write_json(os.path.join(suite.results_dir, f"{part}.json"), {"meta": meta, "result": result})
    regenerate(suite)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
