"""``shardkit bench DATASET``: the storage's ceiling beside the loader's
throughput on the user's own shards, per worker count, and which one binds.

For each worker count ``w`` (see :func:`bench_dataset`):

1. **ceiling**: the shards read raw, ``max(w, 1)`` at a time
   (:mod:`.ceiling`), cold where the page cache can be dropped;
2. **loader, raw**: ``make_loader(ShardDataset(...), num_workers=w,
   stats=True)`` with the samples' bytes as stored, local shards dropped
   from the page cache first;
3. **loader, with the options** (``decode``, ``map``), when any is given:
   the difference from 2 is what they cost.

Each run stops after ``seconds`` or at the end of the epoch. The verdict
for a worker count (:func:`verdict`) reads the figures and the loader's
statistics: *storage-bound* when the loader reaches 90% of the ceiling;
else *CPU-bound* when the workers were busy (their CPU time, or the stages
they timed, near ``w`` cores' worth), naming the stage that took most; else
*hand-off-bound*: storage and workers had room, the batches' trip to the
training process did not. Nothing is written into the dataset.
"""

from __future__ import annotations

import itertools
import os
import random
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shardkit.probe.ceiling import MAX_DROPPED_FILES, Ceiling, Shard, drop_local, read_ceiling
from shardkit.read.dataset import ShardDataset
from shardkit.read.loader import make_loader
from shardkit.read.loader_stats import LoaderStats
from shardkit.read.worker_start import cpu_ticks

#: The loader counts as storage-bound at this fraction of the ceiling.
STORAGE_BOUND = 0.9

#: Workers count as busy at this fraction of their cores' time.
BUSY = 0.8

#: The recommended worker count reaches this fraction of the best throughput.
GOOD_ENOUGH = 0.95

#: Shards the ceiling reads at most.
CEILING_SHARDS = 64


@dataclass
class LoaderRun:
    """One loader run's figures (see :func:`run_loader`)."""

    workers: int
    samples: int
    nbytes: int
    seconds: float
    first_batch_s: float
    worker_mb: float
    cpu_s: float
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_s_per_gb(self) -> float:
        return self.cpu_s / (self.nbytes / 1e9) if self.nbytes else 0.0


def dataset_shards(dataset: ShardDataset, *, most: int, seed: int = 0) -> list[Shard]:
    """Shards ``dataset`` reads, with their sizes where the manifest says
    them: all of them, or ``most`` drawn at random where it has more (a
    dataset of 10^6 shards is not listed whole)."""
    slots = dataset._slots  # this package's companion
    inners = [getattr(catalog, "catalog", catalog) for catalog in slots.catalogs]  # token and batch catalogs wrap theirs
    firsts = np.cumsum([0] + [inner.num_shards for inner in inners])  # each catalog's first shard, overall
    total = int(firsts[-1])
    chosen = range(total) if total <= most else sorted(random.Random(seed).sample(range(total), most))
    out = []
    for number in chosen:
        which = int(np.searchsorted(firsts, number, side="right")) - 1
        inner, shard = inners[which], number - int(firsts[which])
        entry = inner.entry(shard)
        out.append(Shard(inner.url(shard), None if entry is None else int(entry.num_bytes), slots.source_options[which]))
    return out


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_seconds(pid: int) -> float:
    """A process's user and system CPU seconds so far (0 if gone)."""
    return (cpu_ticks(pid) or 0) / os.sysconf("SC_CLK_TCK")


def _private_mb(pid: int) -> float:
    """A process's private memory (USS) in MB, from ``smaps_rollup`` (0 if unknown)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            kb = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))
        return kb / 1024
    except (OSError, ValueError, IndexError):
        return 0.0


def run_loader(
    make: Callable[[], ShardDataset], workers: int, *, batch_size: int, seconds: float, cold: Callable[[], Any]
) -> LoaderRun:
    """Read ``make()``'s samples through ``make_loader`` with ``workers``
    workers and statistics on, epoch after epoch (``cold()`` before each),
    for ``seconds``. Batches are lists of samples: the run measures
    reading, not stacking."""
    dataset = make()
    loader = make_loader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=list, stats=True)
    own = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    first = 0.0
    for epoch in itertools.count():
        dataset.set_epoch(epoch)
        cold()
        for _ in loader:
            if not first:
                first = time.monotonic() - started
            if time.monotonic() - started >= seconds:
                break
        if time.monotonic() - started >= seconds:
            break
    stats: LoaderStats = loader.stats()
    pids = {w.pid for w in stats.workers.values()} - {os.getpid()}
    cpu = sum(_cpu_seconds(pid) for pid in pids)
    memory = max([_private_mb(pid) for pid in pids], default=0.0)
    del loader  # stops the workers
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu += after.ru_utime - own.ru_utime + after.ru_stime - own.ru_stime
    elapsed = max(stats.elapsed_s, 1e-9)
    return LoaderRun(workers, stats.samples, stats.nbytes, elapsed, first, memory, cpu, stats.to_dict())


def verdict(workers: int, ceiling: Ceiling, run: LoaderRun, cores: int) -> str:
    """What binds ``run`` (see the module docstring)."""
    if ceiling.mb_per_s > 0 and run.mb_per_s >= STORAGE_BOUND * ceiling.mb_per_s:
        return f"storage-bound: the loader reads at {run.mb_per_s / ceiling.mb_per_s:.0%} of the storage's ceiling"
    stages = dict(run.stats.get("stages_s", {}))
    handoff = stages.pop("handoff", 0.0)
    lanes = max(min(workers, cores), 1)
    timed = sum(stages.values()) / (lanes * run.seconds)
    used = run.cpu_s / (max(min(workers + 1, cores), 1) * run.seconds)
    top = max(stages, key=lambda k: stages[k]) if stages else "?"
    share = stages.get(top, 0.0) / max(sum(stages.values()), 1e-9)
    if top == "read" and share > 0.5:
        return (f"storage-bound: the workers spent {share:.0%} of their time waiting for bytes, reading at "
                f"{run.mb_per_s / max(ceiling.mb_per_s, 1e-9):.0%} of the ceiling (more workers, or a larger "
                "read_ahead_bytes or SourceOptions.chunk_bytes, ask more of the storage at once)")  # fmt: skip
    if timed >= BUSY or used >= BUSY:
        return f"CPU-bound: the workers were busy ({max(timed, used):.0%} of {lanes} core(s)), {top} {share:.0%} of it"
    return (f"hand-off-bound: workers busy {timed:.0%}, storage at {run.mb_per_s / max(ceiling.mb_per_s, 1e-9):.0%} "
            f"of its ceiling; the batches' trip to the training loop took {handoff:.1f} s of {run.seconds:.1f}")  # fmt: skip


@dataclass
class Row:
    """One worker count's figures."""

    workers: int
    ceiling: Ceiling
    raw: LoaderRun
    options: LoaderRun | None
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        out = {"workers": self.workers, "verdict": self.verdict, "ceiling": asdict(self.ceiling),
               "ceiling_mb_per_s": self.ceiling.mb_per_s}  # fmt: skip
        for name, run in (("raw", self.raw), ("options", self.options)):
            if run is not None:
                out[name] = {**asdict(run), "samples_per_s": run.samples_per_s, "mb_per_s": run.mb_per_s,
                             "cpu_s_per_gb": run.cpu_s_per_gb}  # fmt: skip
        return out


def best_workers(rows: list[Row]) -> int:
    """The fewest workers whose throughput is within :data:`GOOD_ENOUGH` of the best."""
    rate = {r.workers: (r.options or r.raw).samples_per_s for r in rows}
    best = max(rate.values())
    return min(w for w, v in rate.items() if v >= GOOD_ENOUGH * best)


def bench_dataset(
    source: Any,
    *,
    workers: list[int],
    seconds: float = 3.0,
    batch_size: int = 32,
    options: dict[str, Any] | None = None,
    dataset_kwargs: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Measure ``source`` (what :class:`~shardkit.ShardDataset` takes) for
    each of ``workers`` (see the module docstring); ``options`` are the
    dataset's ``decode``/``map`` for the third run, ``dataset_kwargs`` the
    rest (storage options, mode); ``progress`` is told each step."""
    kwargs = {"seed": 0, **(dataset_kwargs or {})}
    extra = {k: v for k, v in (options or {}).items() if v is not None}
    # Dropped from the page cache before each loader epoch: every local shard, up to MAX_DROPPED_FILES
    # of them, the ceiling's among them; a larger dataset is mostly read where nothing warmed it.
    shards = dataset_shards(ShardDataset(source, **kwargs), most=MAX_DROPPED_FILES)
    sample = random.Random(0).sample(shards, min(len(shards), CEILING_SHARDS))
    cores = usable_cores()
    rows = []

    def cold() -> None:
        drop_local(shards)

    for w in workers:
        if progress:
            progress(f"{w} workers: storage ceiling")
        ceiling = read_ceiling(sample, streams=max(w, 1), seconds=seconds)
        if progress:
            progress(f"{w} workers: loader, raw")
        raw = run_loader(lambda: ShardDataset(source, **kwargs), w, batch_size=batch_size, seconds=seconds, cold=cold)
        run = None
        if extra:
            if progress:
                progress(f"{w} workers: loader, {', '.join(extra)}")
            run = run_loader(lambda: ShardDataset(source, **kwargs, **extra), w, batch_size=batch_size,
                             seconds=seconds, cold=cold)  # fmt: skip
        rows.append(Row(w, ceiling, raw, run, verdict(w, ceiling, run or raw, cores)))
    return rows
