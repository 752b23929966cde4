"""Scan + plan rate: rows/s of ``shardkit write --dry-run`` on a synthetic JSONL of text rows.

    PYTHONPATH=. python tools/plan_rate.py [--rows 200000] [--workers 1] [--repeat 3]

Rows look like the issue's (``{"__key__", "txt", "json"}``); prints the best
of ``--repeat`` runs, by wall time and by CPU time of this process and its
scanning processes (the rate per busy core, whatever else runs on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

from shardkit.write.dry_run import plan_dataset
from shardkit.write.parallel import WriteOptions


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.jsonl")
        with open(path, "w") as f:
            for i in range(args.rows):
                row = {"__key__": f"row{i:09d}", "txt": f"caption number {i} " * 3, "json": {"i": i, "w": 640}}
                f.write(json.dumps(row) + "\n")
        best_wall = best_cpu = float("inf")
        for _ in range(args.repeat):
            wall, cpu = time.perf_counter(), cpu_seconds()
            plan = plan_dataset(path, options=WriteOptions(workers=args.workers, partition_bytes=8 << 20))
            best_wall, best_cpu = min(best_wall, time.perf_counter() - wall), min(best_cpu, cpu_seconds() - cpu)
    print(f"scan+plan: {args.rows / best_wall:,.0f} rows/s wall with {args.workers} worker(s), "
          f"{args.rows / best_cpu:,.0f} rows/s per CPU second ({plan.num_shards} shards)")


if __name__ == "__main__":
    main()
