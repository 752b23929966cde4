"""Memory of DataLoader workers as the dataset grows.

Three datasets over the same synthetic sample list of N samples:

* ``shardkit``: a manifest of N samples in shards. To reach 10^7 samples
  without writing gigabytes, every shard is a hard link to one real shard of
  tiny samples (the reader cannot tell: offsets, counts and bytes are real).
* ``in_memory``: a map-style dataset holding the list of ``(path, label)``
  tuples in a Python list, built before the workers fork (the common way).
* ``sqlite``: a map-style dataset that looks each sample up in a read-only
  SQLite file, opened after the fork in each worker.

Each case runs in a fresh interpreter with 2 workers. Each worker reads
``samples_per_worker`` samples; half way, the in-memory dataset references
each of its samples once (what a full epoch of ``__getitem__`` calls does to
reference counts, and so to the copy-on-write pages of the forked list,
without spending an epoch on it), and every worker runs one full garbage
collection, as Python does on its own during a long run. Then the parent
reads each worker's ``/proc/PID/smaps_rollup``: RSS, PSS and private (USS)
memory (the median of a few snapshots taken as the worker reads on).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Any

KINDS = ("shardkit", "in_memory", "sqlite")
#: Samples in the one real shard that all synthetic shards link to.
BASE_SHARD_SAMPLES = 10_000
#: Payload per sample: large enough that even the 10^4 case gives each
#: worker more bytes than the reader's read-ahead budget, so every size
#: measures the same steady state.
PAYLOAD_BYTES = 8192
WORKERS = 2
BATCH = 32
#: Memory snapshots per worker (the median is kept).
SNAPSHOTS = 5
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sample_path(i: int) -> str:
    return f"train/n{i % 1000:08d}/img_{i:08d}.JPEG"


def ensure_synthetic(root: str, num_samples: int) -> dict[str, str]:
    """Build (or reuse) the shardkit folder and SQLite file for N samples."""
    from shardkit import ShardWriter
    from shardkit.format.manifest import MANIFEST_NAME, Manifest, ShardEntry, load_manifest
    from shardkit.write.publish import publish_manifest

    base = os.path.join(root, f"base-{PAYLOAD_BYTES}")
    if not os.path.exists(os.path.join(base, MANIFEST_NAME)):
        with ShardWriter(base, max_samples=BASE_SHARD_SAMPLES, max_bytes=None, overwrite=True) as writer:
            for i in range(BASE_SHARD_SAMPLES):
                writer.write({"__key__": f"k{i:08d}", "bin": os.urandom(PAYLOAD_BYTES), "cls": i % 1000})
    base_entry = load_manifest(os.path.join(base, MANIFEST_NAME)).shards[0]
    if num_samples % BASE_SHARD_SAMPLES:
        raise ValueError(f"num_samples must be a multiple of {BASE_SHARD_SAMPLES}")

    folder = os.path.join(root, f"shardkit-{PAYLOAD_BYTES}-{num_samples}")
    if not os.path.exists(os.path.join(folder, MANIFEST_NAME)):
        os.makedirs(folder, exist_ok=True)
        entries = []
        for s in range(num_samples // BASE_SHARD_SAMPLES):
            tar, idx = f"shard-{s:06d}.tar", f"shard-{s:06d}.idx"
            for name, src in ((tar, base_entry.path), (idx, base_entry.index)):
                dest = os.path.join(folder, name)
                if not os.path.exists(dest):
                    os.link(os.path.join(base, src), dest)
            entries.append(
                ShardEntry(path=tar, index=idx, num_samples=base_entry.num_samples,
                           num_bytes=base_entry.num_bytes, sha256=base_entry.sha256)
            )
        manifest = Manifest(shards=tuple(entries), extensions=("bin", "cls"), source={"format": "synthetic"})
        publish_manifest(folder, manifest)  # the shard table, then manifest.json

    db = os.path.join(root, f"samples-{num_samples}.sqlite")
    if not os.path.exists(db):
        tmp = db + ".tmp"
        if os.path.exists(tmp):
            os.unlink(tmp)
        con = sqlite3.connect(tmp)
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE samples (id INTEGER PRIMARY KEY, path TEXT NOT NULL, label INTEGER NOT NULL)")
        con.executemany(
            "INSERT INTO samples VALUES (?, ?, ?)", ((i, sample_path(i), i % 1000) for i in range(num_samples))
        )
        con.commit()
        con.close()
        os.rename(tmp, db)
    return {"shardkit": folder, "sqlite": db}


# -- the datasets (module level so workers can unpickle them) --------------


class _GcOnce:
    """Counts items in a worker; at item ``at`` it runs ``sweep`` (if any)
    and one full garbage collection."""

    def __init__(self, at: int):
        self.at = at
        self.count = 0

    def tick(self, sweep: Any = None) -> None:
        self.count += 1
        if self.count == self.at:
            if sweep is not None:
                sweep()
            gc.collect()


class InMemoryDataset:
    """Map-style: the sample list lives in a Python list."""

    def __init__(self, num_samples: int, gc_at: int):
        self.items = [(sample_path(i), i % 1000) for i in range(num_samples)]
        self.gc = _GcOnce(gc_at)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, int]:
        path, label = self.items[i]
        self.gc.tick(self._epoch_touch)
        return len(path), label

    def _epoch_touch(self) -> None:
        """Reference every sample once, as a full epoch of ``__getitem__``
        calls would: the reference counts written are what copy the forked
        list's pages into this worker."""
        for path, label in self.items:
            pass


class ReadOnlySqlite:
    """Map-style over a SQLite file: a read-only connection opened lazily in
    each process (after the fork: one opened before it corrupts reads)."""

    def __init__(self, path: str, num_samples: int):
        self.path = path
        self.num_samples = num_samples
        self._con: sqlite3.Connection | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.num_samples

    def fetch(self, query: str, i: int) -> tuple[Any, ...]:
        """The row ``query`` finds for ``(i,)``, on this process's connection."""
        if self._con is None or self._pid != os.getpid():
            self._con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            self._pid = os.getpid()
        return self._con.execute(query, (i,)).fetchone()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_con": None, "_pid": -1}


class SqliteDataset(ReadOnlySqlite):
    """Map-style: samples looked up in SQLite; connection opened per worker."""

    def __init__(self, path: str, num_samples: int, gc_at: int):
        super().__init__(path, num_samples)
        self.gc = _GcOnce(gc_at)

    def __getitem__(self, i: int) -> tuple[int, int]:
        path, label = self.fetch("SELECT path, label FROM samples WHERE id = ?", i)
        self.gc.tick()
        return len(path), label


class _ShardkitMap:
    def __init__(self, gc_at: int):
        self.gc = _GcOnce(gc_at)

    def __call__(self, sample: dict[str, Any]) -> tuple[int, int]:
        self.gc.tick()
        return len(sample["bin"]), 0


def _count(batch: list[tuple[int, int]]) -> int:
    return len(batch)


def smaps(pid: int) -> dict[str, float]:
    """RSS, PSS, private memory (USS) and its written part (Private_Dirty:
    what the kernel cannot drop under memory pressure, there being no swap)
    of a process, in MB."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                values[parts[0][:-1]] = int(parts[1])
    kb = 1024 / 1e6
    return {
        "rss_mb": values.get("Rss", 0) * kb,
        "pss_mb": values.get("Pss", 0) * kb,
        "uss_mb": (values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)) * kb,
        "private_dirty_mb": values.get("Private_Dirty", 0) * kb,
    }


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out.extend(int(p) for p in f.read().split())
    return sorted(set(out))


def measure_case(kind: str, num_samples: int, paths: dict[str, str], samples_per_worker: int) -> dict[str, Any]:
    """Run one case in this process (call in a fresh interpreter)."""
    from torch.utils.data import DataLoader

    gc_at = samples_per_worker // 2
    start = time.perf_counter()
    if kind == "shardkit":
        import shardkit
        from shardkit.read.loader import make_loader

        dataset = shardkit.ShardDataset(
            paths["shardkit"], mode="balanced", seed=0, buffer_size=1000, batch_size=BATCH,
            collate=_count, map=_ShardkitMap(gc_at),
        )
        loader = make_loader(dataset, num_workers=WORKERS, persistent_workers=False)
    elif kind == "in_memory":
        loader = DataLoader(InMemoryDataset(num_samples, gc_at), batch_size=BATCH, shuffle=True,
                            num_workers=WORKERS, collate_fn=_count)
    elif kind == "sqlite":
        loader = DataLoader(SqliteDataset(paths["sqlite"], num_samples, gc_at), batch_size=BATCH, shuffle=True,
                            num_workers=WORKERS, collate_fn=_count)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    build_s = time.perf_counter() - start
    want = samples_per_worker * WORKERS
    seen = 0
    iterator = iter(loader)
    while seen < want:
        seen += next(iterator)
    # Read-ahead and shuffle buffers fill and drain as a worker runs, so
    # sample each worker a few times while reading on, and keep the median.
    samples: dict[int, list[dict[str, float]]] = {}
    for _ in range(SNAPSHOTS):
        for _ in range(4):
            seen += next(iterator)
        time.sleep(0.2)
        for pid in _children(os.getpid()):
            samples.setdefault(pid, []).append(smaps(pid))
    main = smaps(os.getpid())
    del iterator
    if not samples:
        raise RuntimeError("found no worker processes to measure")
    workers = [
        {key: statistics.median(snap[key] for snap in snaps) for key in snaps[0]} for snaps in samples.values()
    ]
    return {
        "kind": kind,
        "num_samples": num_samples,
        "workers": workers,
        "worker_rss_mb": sum(w["rss_mb"] for w in workers) / len(workers),
        "worker_pss_mb": sum(w["pss_mb"] for w in workers) / len(workers),
        "worker_uss_mb": sum(w["uss_mb"] for w in workers) / len(workers),
        "main_rss_mb": main["rss_mb"],
        "build_s": build_s,
        "samples_read": seen,
    }


def measure(root: str, sizes: tuple[int, ...], *, samples_per_worker: int = 2000) -> dict[str, Any]:
    """Every kind at every size, each in its own interpreter."""
    started = time.time()
    cases = []
    for n in sizes:
        paths = ensure_synthetic(root, n)
        for kind in KINDS:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.harness.memory", kind, str(n), json.dumps(paths), str(samples_per_worker)],
                cwd=REPO_ROOT, capture_output=True, text=True,
            )
            if proc.returncode != 0:
                cases.append({"kind": kind, "num_samples": n, "error": proc.stderr[-2000:]})
                continue
            cases.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {
        "sizes": list(sizes),
        "workers": WORKERS,
        "samples_per_worker": samples_per_worker,
        "cases": cases,
        "seconds": time.time() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one memory case (used by measure())")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("num_samples", type=int)
    parser.add_argument("paths")
    parser.add_argument("samples_per_worker", type=int)
    args = parser.parse_args(argv)
    result = measure_case(args.kind, args.num_samples, json.loads(args.paths), args.samples_per_worker)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
