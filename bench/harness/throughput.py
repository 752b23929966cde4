"""Images/s and MB/s of the three loaders on each storage profile.

For each profile: set it up, copy the ImageFolder tree, the shards and the
ceiling file onto it (in that order), measure the sequential ceiling with a
cold ``dd``, then for each worker count run every loader ``repeats`` times,
peers interleaved, each run from a cold cache. Figures are medians.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.harness.loaders import EXPERIMENTS, LOADERS
from bench.harness.runner import Runner
from bench.profiles import Profile, mounted

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThroughputPlan:
    """What the throughput part runs.

    Attributes:
        profiles: Profile names, in run order.
        workers: DataLoader worker counts.
        loaders: Loader names.
        repeats: Runs per (profile, loader, workers); the median is reported.
        repeats_by_profile: ``(profile, runs)`` pairs overriding ``repeats``
            (e.g. more runs where a run lasts two seconds and noise is large).
        imagefolder_limit: Images per ImageFolder run (random subset).
        buffer_size: Shuffle buffer of the streaming loaders, per worker.
        ceiling_repeats: Cold ``dd`` runs for the sequential ceiling.
        seed: Seed of shard order, subsets and buffers.
        experiments: Extra loader variants (see ``loaders.EXPERIMENTS``) run
            after the peers on the profiles in ``experiment_profiles``.
        experiment_profiles: Profiles the experiments run on.
        trace_dir: If set, on ``hdd-seek`` every request of every run is
            logged to ``trace_dir/PROFILE-LOADER-wN-rR.txt`` (see seekfs).
    """

    profiles: tuple[str, ...] = ("hdd", "hdd-seek", "ssd", "raw")
    workers: tuple[int, ...] = (1, 2, 4, 8)
    loaders: tuple[str, ...] = LOADERS
    repeats: int = 3
    repeats_by_profile: tuple[tuple[str, int], ...] = ()
    imagefolder_limit: int = 600
    buffer_size: int = 500
    ceiling_repeats: int = 3
    seed: int = 0
    experiments: tuple[str, ...] = ()
    experiment_profiles: tuple[str, ...] = ("hdd", "hdd-seek")
    trace_dir: str | None = None


    def repeats_for(self, profile: str) -> int:
        """Runs per (loader, workers) on ``profile``."""
        return dict(self.repeats_by_profile).get(profile, self.repeats)


_DD_RATE = re.compile(r"^(\d+) bytes .* copied, ([0-9.]+) s", re.MULTILINE)


def parse_dd(stderr: str) -> tuple[int, float]:
    """``(bytes, seconds)`` from dd's closing line."""
    match = _DD_RATE.search(stderr)
    if match is None:
        raise ValueError(f"no transfer summary in dd output: {stderr!r}")
    return int(match.group(1)), float(match.group(2))


def measure_ceiling(profile: Profile, path: str, repeats: int) -> dict[str, Any]:
    """Cold sequential read of one large file with dd, in the profile's cgroup."""
    rates = []
    for _ in range(repeats):
        profile.cold()
        result = subprocess.run(
            ["dd", f"if={path}", "of=/dev/null", "bs=4M"],
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=profile.join,
        )
        num_bytes, seconds = parse_dd(result.stderr)
        rates.append(num_bytes / seconds / 1e6)
    return {"mb_per_s": statistics.median(rates), "runs_mb_per_s": rates, "command": f"dd if={path} of=/dev/null bs=4M"}


def summarize(runs: list[dict[str, Any]], ceiling_mb_s: float) -> list[dict[str, Any]]:
    """Median figures per (loader, workers), with the fraction of the
    ceiling and the time from ``iter(loader)`` to the first batch."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        if "images_per_s" in run:
            groups.setdefault((run["loader"], run["workers"]), []).append(run)
    rows = []
    for (loader, workers), group in sorted(groups.items(), key=lambda kv: ((LOADERS + EXPERIMENTS).index(kv[0][0]), kv[0][1])):
        mb_s = statistics.median(r["mb_per_s"] for r in group)
        firsts = [r["first_batch_s"] for r in group if r.get("first_batch_s") is not None]
        rows.append(
            {
                "loader": loader,
                "workers": workers,
                "images_per_s": statistics.median(r["images_per_s"] for r in group),
                "mb_per_s": mb_s,
                "fraction_of_ceiling": mb_s / ceiling_mb_s if ceiling_mb_s > 0 else None,
                "first_batch_s": statistics.median(firsts) if firsts else None,
                "runs": len(group),
            }
        )
    return rows


def _io_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], (int, float))}


def measure_profile(name: str, data: dict[str, str], plan: ThroughputPlan, workdir: str, image_bytes: int) -> dict[str, Any]:
    """Every loader at every worker count on one profile."""
    started = time.time()
    with mounted(name, workdir, image_bytes=image_bytes) as profile:
        roots = {
            "imagefolder": profile.place("imagefolder", data["imagefolder"]),
            "shards": profile.place("shards", data["shards"]),
        }
        ceiling_path = profile.place("ceiling.bin", data["ceiling"])
        profile.start()
        ceiling = measure_ceiling(profile, ceiling_path, plan.ceiling_repeats)
        model = profile.seekfs("stats")["params"] if profile.spec.kind == "seekfs" else None
        logger.info("%s: sequential ceiling %.0f MB/s", name, ceiling["mb_per_s"])
        runs: list[dict[str, Any]] = []
        unavailable: dict[str, str] = {}
        with Runner(preexec=profile.join) as runner:
            loaders = plan.loaders + (plan.experiments if name in plan.experiment_profiles else ())
            for workers in plan.workers:
                for repeat in range(plan.repeats_for(name)):
                    for loader in loaders:
                        if loader in unavailable:
                            continue
                        root = roots["imagefolder" if loader == "imagefolder" else "shards"]
                        profile.cold()
                        before = profile.io_stats()
                        tracing = plan.trace_dir is not None and profile.spec.kind == "seekfs"
                        if tracing:
                            os.makedirs(plan.trace_dir, exist_ok=True)
                            trace = os.path.join(plan.trace_dir, f"{name}-{loader}-w{workers}-r{repeat}.txt")
                            if os.path.exists(trace):
                                os.unlink(trace)
                            profile.seekfs(f"trace {trace}")
                        answer = runner.request(
                            {
                                "op": "run",
                                "loader": loader,
                                "root": root,
                                "workers": workers,
                                "buffer_size": plan.buffer_size,
                                "limit": plan.imagefolder_limit,
                                "seed": plan.seed + repeat,
                                # No block device behind FUSE: say it is a disk.
                                "device_lock": True if profile.spec.kind == "seekfs" and profile.spec.rotational else "auto",
                                # Cold again once the loader is built (see runner.make_cold).
                                "cold": {"seekfs_control": profile.state.get("control")},
                            }
                        )
                        if tracing:
                            profile.seekfs("trace")
                        if "unavailable" in answer:
                            unavailable[loader] = answer["unavailable"]
                            logger.warning("%s: %s", loader, answer["unavailable"])
                            continue
                        answer.update(loader=loader, workers=workers, repeat=repeat, io=_io_delta(before, profile.io_stats()))
                        runs.append(answer)
                        logger.info(
                            "%s %-11s w=%d: %7.1f img/s %6.1f MB/s",
                            name, loader, workers, answer["images_per_s"], answer["mb_per_s"],
                        )
    return {
        "profile": name,
        "description": profile.spec.description,
        "ceiling": ceiling,
        "seek_model": model,
        "table": summarize(runs, ceiling["mb_per_s"]),
        "runs": runs,
        "unavailable": unavailable,
        "plan": asdict(plan),
        "seconds": time.time() - started,
    }
