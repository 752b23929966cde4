"""The derived datasets of ``bench_revisions.py`` (issue #54): extensions and views.

- **extend against a rewrite**: a pool of JPEGs of ~20 KB (20,000; 2,000
  with ``--quick``) gets a 1 KB field (a 512-d float16 array from a cheap
  function of the key) with ``shardkit.extend``, and with a rewrite that adds
  the same field (``write_dataset(pool, map=...)``, the shards as the
  source): bytes the result holds, wall time, 2 workers each.
- **reading a joined dataset**: the extension (image + new field) against
  the rewritten dataset, raw samples through ``make_loader`` with 1 and 2
  workers, from the page cache (5 epochs, persistent workers) and cold (one
  epoch, every file involved evicted first); the new field alone
  (``fields=["emb.npy"]``) against the whole rewritten dataset: samples/s
  and the bytes of the shards read. And as a trainer reads, the images
  decoded (``decode="tensor"``), 2 workers.
- **a 50% view**: ``view --where 'cls < 3'`` (3 of 6 classes, spread over
  every shard by the write's shuffle) against a rewritten copy of the same
  samples, read the same way.
- **opening a 2% split of 5x10^9 samples**: a view keeping 200 of the 10,000
  samples of each of the 5x10^5 shards of ``bench_remove.py``'s synthetic
  dataset (synthetic rows: the same 200 positions in every row; 10^8
  positions, a 400 MB rows table), opened in a fresh process: seconds,
  memory (USS growth) and the pickled dataset's size.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FULL = {"images": 20_000, "split_shards": 500_000, "read_workers": [1, 2], "warm_epochs": 5}
QUICK = {"images": 2_000, "split_shards": 5_000, "read_workers": [1], "warm_epochs": 2}
EMBED_DIM = 512


def embedding(sample: dict[str, Any]) -> dict[str, Any]:
    """The new field: 512 float16 (1 KB) from the key, cheap as a lookup."""
    seed = int.from_bytes(hashlib.blake2b(sample["__key__"].encode(), digest_size=8).digest(), "little")
    return {"emb.npy": np.random.default_rng(seed).standard_normal(EMBED_DIM).astype(np.float16)}


def with_embedding(sample: dict[str, Any]) -> dict[str, Any]:
    """The rewrite's map: the sample as it is, plus :func:`embedding`."""
    return {**sample, **embedding(sample)}


def low_classes(sample: dict[str, Any]) -> dict[str, Any] | None:
    """The rewritten 50% copy's map: classes 0-2 of 6."""
    return sample if int(sample["cls"]) < 3 else None


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


# ------------------------------------------------------------------ datasets


def make_pool(dest: str, images: int) -> None:
    from tools.gen_images import generate

    import shardkit

    source = dest + "-images"
    if not os.path.isdir(source):
        generate(source, classes=6, per_class=images // 6, target_kb=20.0)
    shardkit.write_dataset(source, dest, options=shardkit.WriteOptions(max_samples=1000, seed=0))


def make_split_view(dest: str, synthetic: str) -> None:
    """A 2% view of ``synthetic`` made from synthetic rows (see the module docstring)."""
    from shardkit.format.derived import DerivedManifest, ParentRef, build_rows
    from shardkit.format.manifest import load_manifest
    from shardkit.revise.derived_publish import publish_derived

    parent = load_manifest(synthetic)
    n = parent.num_shards
    per = int(parent.table.counts[0]) // 50
    positions = np.sort(np.random.default_rng(0).choice(int(parent.table.counts[0]), per, replace=False))
    rows = build_rows(np.zeros(n), np.arange(n), np.full(n, per), np.zeros(n), np.arange(n + 1) * per,
                      np.tile(positions.astype(np.uint32), n))  # fmt: skip
    manifest = DerivedManifest(
        kind="view", parents=(ParentRef(os.path.relpath(synthetic, dest), parent.fingerprint),), rows=rows,
        extensions=parent.extensions, how="split val=0.02 (synthetic rows)",
    )
    os.makedirs(dest, exist_ok=True)
    publish_derived(dest, manifest)


# ------------------------------------------------------------------ cells


def extend_cell(spec: dict[str, Any]) -> dict[str, Any]:
    import shutil

    import shardkit

    shutil.rmtree(spec["dest"], ignore_errors=True)
    started = time.perf_counter()
    shardkit.extend(spec["pool"], spec["dest"], map=embedding, workers=2)
    return {"seconds": time.perf_counter() - started, "bytes": folder_bytes(spec["dest"])}


def rewrite_cell(spec: dict[str, Any]) -> dict[str, Any]:
    import shutil

    import shardkit

    shutil.rmtree(spec["dest"], ignore_errors=True)
    fn = {"embedding": with_embedding, "low_classes": low_classes}[spec["map"]]
    started = time.perf_counter()
    shardkit.write_dataset(spec["pool"], spec["dest"], map=fn, options=shardkit.WriteOptions(max_samples=1000, workers=2))
    return {"seconds": time.perf_counter() - started, "bytes": folder_bytes(spec["dest"])}


def view_cell(spec: dict[str, Any]) -> dict[str, Any]:
    import shardkit

    started = time.perf_counter()
    report = shardkit.view(spec["pool"], spec["dest"], where=spec["where"], workers=2, overwrite=True)
    return {"seconds": time.perf_counter() - started, "bytes": folder_bytes(spec["dest"]), "samples": report.num_samples}


def _count(batch: list[Any]) -> int:
    return len(batch)


def read_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Read ``epochs`` epochs (one loader, persistent workers: what one
    epoch's start costs is paid once); cold: the files of the dataset and
    of every one it stands on evicted from the page cache first."""
    from bench.bench_reader import evict
    from shardkit import ShardDataset, make_loader

    if spec.get("cold"):
        for folder in spec["evict"]:
            evict(folder)
    ds = ShardDataset(spec["source"], seed=0, fields=spec.get("fields"), batch_size=64, collate=_count,
                      decode=spec.get("decode"))  # fmt: skip
    loader = make_loader(ds, batch_size=None, num_workers=spec["workers"], persistent_workers=spec["workers"] > 0)
    samples = 0
    started = time.perf_counter()
    for epoch in range(spec.get("epochs", 1)):
        ds.set_epoch(epoch)
        for count in loader:
            samples += int(count)
    seconds = time.perf_counter() - started
    return {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds}


def split_open_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """``bench_remove``'s open cell (seconds, USS growth), and the size of the dataset pickled."""
    from bench.bench_remove import open_cell
    from shardkit import ShardDataset

    opened = open_cell(spec)
    return {**opened, "pickle_bytes": len(pickle.dumps(ShardDataset(spec["dest"], seed=0)))}


def litdata_item(path: str) -> dict[str, Any]:
    """LitData's route to the same result: the sample written again whole,
    its image read from the source folder, with the new field."""
    key = os.path.splitext(os.path.basename(path))[0]
    with open(path, "rb") as f:
        image = f.read()
    label = int(os.path.basename(os.path.dirname(path)).split("_")[-1])
    return {"jpg": image, "cls": label, "emb": embedding({"__key__": key})["emb.npy"]}


def litdata_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """``litdata.optimize`` of every image with its new field (run in .venv-map's interpreter)."""
    import shutil

    import litdata

    shutil.rmtree(spec["dest"], ignore_errors=True)
    items = sorted(os.path.join(d, n) for d, _, names in os.walk(spec["images"]) for n in names if n.endswith(".jpg"))
    started = time.perf_counter()
    litdata.optimize(fn=litdata_item, inputs=items, output_dir=spec["dest"], num_workers=2, chunk_bytes="64MB",
                     start_method="fork", verbose=False)  # fmt: skip
    return {"seconds": time.perf_counter() - started, "bytes": folder_bytes(spec["dest"]), "version": litdata.__version__}


LITDATA_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-map", "bin", "python")

CELLS = {"litdata": litdata_cell, "extend": extend_cell, "rewrite": rewrite_cell, "view": view_cell, "read": read_cell, "split_open": split_open_cell}


def measure_derived(
    args: Any, preset: dict[str, Any], cell: Any, ensure: Any, synthetic: str, litdata: Any
) -> dict[str, Any]:
    """Run the derived datasets' cells (``cell(spec)`` runs one in a fresh
    process; ``litdata(spec, env)`` one in LitData's interpreter)."""
    work = args.workdir
    derived = preset["derived"]
    pool = ensure(args, f"pool-{derived['images']}", lambda p: make_pool(p, derived["images"]))
    out: dict[str, Any] = {"pool_bytes": folder_bytes(pool), "runs": {}}
    runs = out["runs"]
    for _ in range(preset["repeats"]):
        runs.setdefault("extend", []).append(cell({"cell": "extend", "pool": pool, "dest": os.path.join(work, "ext")}))
        if os.path.exists(LITDATA_PYTHON):
            env = {**os.environ, "DATA_OPTIMIZER_CACHE_FOLDER": os.path.join(work, "litdata-cache", "chunks"),
                   "DATA_OPTIMIZER_DATA_CACHE_FOLDER": os.path.join(work, "litdata-cache", "data")}  # fmt: skip
            spec = {"cell": "litdata", "images": pool + "-images", "dest": os.path.join(work, "litdata")}
            runs.setdefault("litdata rewrite", []).append(litdata(spec, env))
        else:
            out["skipped"] = f"LitData: {LITDATA_PYTHON} not found (`make bench-revisions` makes it)"
        runs.setdefault("rewrite", []).append(cell({"cell": "rewrite", "pool": pool, "dest": os.path.join(work, "rewritten"),
                                                    "map": "embedding"}))  # fmt: skip
        runs.setdefault("view", []).append(cell({"cell": "view", "pool": pool, "dest": os.path.join(work, "half"),
                                                 "where": "cls < 3"}))  # fmt: skip
        runs.setdefault("half_copy", []).append(cell({"cell": "rewrite", "pool": pool, "dest": os.path.join(work, "half-copy"),
                                                      "map": "low_classes"}))  # fmt: skip
        folders = [pool] + [os.path.join(work, f) for f in ("ext", "rewritten", "half", "half-copy")]
        for workers in derived["read_workers"]:
            for cold in (False, True):
                for name, source, fields in (
                    ("joined", "ext", None), ("rewritten", "rewritten", None), ("new field alone", "ext", ["emb.npy"]),
                    ("50% view", "half", None), ("50% copy", "half-copy", None),
                ):
                    spec = {"cell": "read", "source": os.path.join(work, source), "fields": fields, "workers": workers,
                            "cold": cold, "evict": folders, "epochs": 1 if cold else derived["warm_epochs"]}  # fmt: skip
                    runs.setdefault(f"read {name}, {workers} workers{', cold' if cold else ''}", []).append(cell(spec))
        for name, source in (("joined", "ext"), ("rewritten", "rewritten")):  # as a trainer reads: images decoded
            spec = {"cell": "read", "source": os.path.join(work, source), "workers": 2, "decode": "tensor", "epochs": 1}
            runs.setdefault(f"read {name}, 2 workers, images decoded", []).append(cell(spec))
    out["bytes_read"] = {
        "rewritten": folder_bytes(os.path.join(work, "rewritten")),
        "new field alone": folder_bytes(os.path.join(work, "ext", "fields")),
    }
    view = ensure(args, f"split-2pct-{derived['split_shards']}", lambda p: make_split_view(p, synthetic))
    runs["split_open"] = [cell({"cell": "split_open", "dest": view}) for _ in range(preset["repeats"])]
    return out


def median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return float(np.median(values)) if values else float("nan")


def derived_targets(out: dict[str, Any], workers: list[int]) -> list[dict[str, Any]]:
    runs = out["runs"]

    def target(name: str, value: float, limit: float, unit: str, at_most: bool) -> dict[str, Any]:
        return {"target": name, "value": value, "unit": unit, "limit": limit, "met": value <= limit if at_most else value >= limit}

    extend_bytes = median(runs["extend"], "bytes") / median(runs["rewrite"], "bytes")
    extend_time = median(runs["extend"], "seconds") / median(runs["rewrite"], "seconds")
    rows = [target("extend bytes / rewrite bytes", extend_bytes, 0.10, "x", True),
            target("extend time / rewrite time", extend_time, 0.5, "x", True)]
    if "litdata rewrite" in runs:
        rows.append(target("extend time / LitData's rewrite time", median(runs["extend"], "seconds")
                           / median(runs["litdata rewrite"], "seconds"), 0.5, "x", True))  # fmt: skip
    for w in workers:
        for cold in ("", ", cold"):
            rate = lambda name: median(runs[f"read {name}, {w} workers{cold}"], "samples_per_s")  # noqa: E731
            at = f"{w} workers{cold or ', page cache'}"
            rows.append(target(f"joined read / rewritten read, {at}", rate("joined") / rate("rewritten"), 0.9, "x", False))
            rows.append(target(f"new field alone / rewritten read, {at}", rate("new field alone") / rate("rewritten"), 5.0, "x", False))
            rows.append(target(f"50% view read / 50% copy read, {at}", rate("50% view") / rate("50% copy"), 0.9, "x", False))
    decoded = lambda name: median(runs[f"read {name}, 2 workers, images decoded"], "samples_per_s")  # noqa: E731
    rows.append(target("joined read / rewritten read, 2 workers, images decoded", decoded("joined") / decoded("rewritten"),
                       0.9, "x", False))  # fmt: skip
    rows.append(target("new field alone / rewritten read, 2 workers, the rewritten's images decoded",
                       median(runs["read new field alone, 2 workers"], "samples_per_s") / decoded("rewritten"), 5.0, "x",
                       False))  # fmt: skip
    rows.append(target("new field alone: bytes read / rewritten's", out["bytes_read"]["new field alone"] / out["bytes_read"]["rewritten"], 0.10, "x", True))
    rows.append(target("2% split of 5x10^9: open s", median(runs["split_open"], "seconds"), 1.0, " s", True))
    rows.append(target("2% split of 5x10^9: memory MB", median(runs["split_open"], "uss_growth_mb"), 50.0, " MB", True))
    rows.append(target("2% split of 5x10^9: pickle MB", median(runs["split_open"], "pickle_bytes") / 1e6, 2.0, " MB", True))
    return rows


def derived_markdown(out: dict[str, Any]) -> list[str]:
    runs = out["runs"]
    skipped = f" Skipped: {out['skipped']}." if out.get("skipped") else ""
    lines = ["", "## Extensions and views", "", f"Pool: {out['pool_bytes'] / 1e6:.0f} MB of JPEGs.{skipped}", "",
             "| cell | seconds (median) | bytes written | samples/s |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for name, cell_runs in runs.items():
        rate = median(cell_runs, "samples_per_s")
        size = median(cell_runs, "bytes")
        lines.append(f"| {name} | {median(cell_runs, 'seconds'):.2f} | {'' if np.isnan(size) else f'{size:,.0f}'} | "
                     f"{'' if np.isnan(rate) else f'{rate:,.0f}'} |")  # fmt: skip
    return lines
