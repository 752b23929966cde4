#!/usr/bin/env python3
"""Resume cost of the reader: restoring a mid-epoch state vs replaying the epoch.

Writes a dataset (default 60 shards x 1,000 samples of ~1 KB), then for one
slot with a 10,000-sample shuffle buffer measures, after ``--stop`` samples:

* *resume*: a new ShardDataset, ``load_state_dict``, and the first batch
  (replays positions only, re-reads the buffered samples through the index);
* *replay*: a new ShardDataset reading from the epoch start, discarding
  ``--stop`` samples, and the first batch after them.

Both runs check that they hand out the same batch. Files are in the page
cache (warm) for both. Writes ``bench/results/resume.json``.

    .venv/bin/python bench/bench_resume.py
    .venv/bin/python bench/bench_resume.py --shards 240 --stops 51200 230400 --repeats 2 \
        --out bench/results/resume_large.json   # 240,000 samples
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from shardkit import ShardDataset, ShardWriter  # noqa: E402

log = logging.getLogger("bench_resume")


def write_data(dest: str, *, num_shards: int, per_shard: int, payload_bytes: int) -> None:
    """Write ``num_shards`` shards of ``per_shard`` samples each."""
    with ShardWriter(dest, max_samples=per_shard, max_bytes=None) as writer:
        for i in range(num_shards * per_shard):
            writer.write({"__key__": f"k{i:08d}", "bin": os.urandom(payload_bytes), "cls": str(i % 10)})


def first_keys(batch: dict) -> list[str]:
    return list(batch["__key__"])


def measure(data: str, options: dict, *, stop: int, batch: int, repeats: int) -> dict:
    """Time resume and replay to ``stop`` samples (best of ``repeats``)."""
    ds = ShardDataset(data, **options)
    it = iter(ds)
    for _ in range(stop // batch):
        next(it)
    state = json.loads(json.dumps(ds.state_dict()))
    expected = first_keys(next(it))
    del it
    resume_s, replay_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        again = ShardDataset(data, **options)
        again.load_state_dict(state)
        got = first_keys(next(iter(again)))
        resume_s.append(time.perf_counter() - t0)
        assert got == expected, "resumed batch differs"

        t0 = time.perf_counter()
        stream = iter(ShardDataset(data, **options))
        for _ in range(stop // batch):
            next(stream)
        got = first_keys(next(stream))
        replay_s.append(time.perf_counter() - t0)
        assert got == expected, "replayed batch differs"
        del stream
    return {
        "stop_samples": stop,
        "state_bytes": len(json.dumps(state)),
        "resume_s": round(min(resume_s), 4),
        "replay_s": round(min(replay_s), 4),
        "resume_all_s": [round(t, 4) for t in resume_s],
        "replay_all_s": [round(t, 4) for t in replay_s],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=60)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--payload-bytes", type=int, default=1000)
    parser.add_argument("--buffer", type=int, default=10_000)
    parser.add_argument(
        "--stops",
        type=int,
        nargs="+",
        default=[20_480, 40_960, 56_320],
        help="samples delivered before the checkpoint (multiples of --batch)",
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "resume.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if any(stop % args.batch for stop in args.stops):
        parser.error("--stops must be multiples of --batch")

    with tempfile.TemporaryDirectory(prefix="bench_resume") as tmp:
        data = os.path.join(tmp, "data")
        started = time.perf_counter()
        write_data(data, num_shards=args.shards, per_shard=args.per_shard, payload_bytes=args.payload_bytes)
        log.info("wrote %d samples in %.1f s", args.shards * args.per_shard, time.perf_counter() - started)
        options = dict(mode="exact", seed=0, buffer_size=args.buffer, batch_size=args.batch)

        points = [measure(data, options, stop=stop, batch=args.batch, repeats=args.repeats) for stop in args.stops]

    result = {
        "samples": args.shards * args.per_shard,
        "shards": args.shards,
        "payload_bytes": args.payload_bytes,
        "buffer_size": args.buffer,
        "batch_size": args.batch,
        "page_cache": "warm",
        "points": points,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    sys.stdout.write(
        f"buffer {args.buffer} samples, batch {args.batch}, {result['samples']} samples of ~{args.payload_bytes} B\n"
    )
    for point in points:
        sys.stdout.write(
            f"stop at {point['stop_samples']:>6}: resume (restore + first batch) {point['resume_s']:.3f} s, "
            f"replay from epoch start {point['replay_s']:.3f} s, state {point['state_bytes']} B\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
