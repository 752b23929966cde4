"""Planning rate: rows/s of plan_shards (and of scanning) on a synthetic JSONL of text rows.

    PYTHONPATH=. python tools/plan_rate.py [--rows 200000] [--repeat 3]

Rows look like the issue's (``{"__key__", "txt", "json"}``); prints one line
per stage with the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from shardkit.write.inputs import scan_source
from shardkit.write.limits import ShardLimits
from shardkit.write.plan import plan_shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.jsonl")
        with open(path, "w") as f:
            for i in range(args.rows):
                row = {"__key__": f"row{i:09d}", "txt": f"caption number {i} " * 3, "json": {"i": i, "w": 640}}
                f.write(json.dumps(row) + "\n")
        started = time.perf_counter()
        samples = scan_source(path).samples
        scan_s = time.perf_counter() - started
        limits = ShardLimits(max_samples=None, max_bytes=256 << 20)
        plan_s = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            tasks, _ = plan_shards(samples, limits=limits, seed=0, shuffle=True)
            plan_s = min(plan_s, time.perf_counter() - started)
    print(f"scan: {args.rows / scan_s:,.0f} rows/s ({scan_s:.2f} s)")
    print(f"plan: {args.rows / plan_s:,.0f} rows/s ({plan_s:.2f} s, {len(tasks)} shards)")


if __name__ == "__main__":
    main()
