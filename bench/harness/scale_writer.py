"""The writer at scale (issue #23): ``bench/bench_scale.py --writer``.

On JSONL files of small text rows (the issue's ``{"__key__", "txt", "json"}``,
~140 bytes a line), each cell in a fresh child process:

- ``plan``: ``shardkit write --dry-run`` (scan + plan, nothing written) with
  1 and 2 workers: the driver's peak memory (``VmHWM``: scanning processes
  not counted, with 2 workers the driver scans nothing itself), the wall
  time, and the CPU seconds of the driver and its scanning processes;
- ``write``: ``write_dataset`` end to end, 1 and 2 workers, default shard size;
- peers on the same rows: webdataset's ``ShardWriter`` loop (one process,
  ``json.loads`` per line), LitData's ``optimize`` (``num_workers`` 1, 2) and
  Mosaic's ``MDSWriter`` loop (one process);
- ``images``: an ImageFolder of ``--image-files`` small files (100 class
  folders of tiny real JPEGs, ~640 bytes each, every file different;
  made once under ``--workdir``, so every cell reads them from the page
  cache): shardkit's scan + plan (``--dry-run``: driver peak memory, files/s)
  and ``write_dataset`` end to end with 1 and 2 workers, against the same
  three peers writing the same samples (key, image bytes, class index) from a
  sorted listing of the folder, the listing timed with the write; every
  writer cuts shards (chunks) of ``--image-shard-bytes`` (16 MB: ~16 shards,
  where the JSONL rows' default 256 MB would make one, with nothing for a
  second worker to do);
- ``quality``: the shuffle of class-sorted rows (100 classes):
  ``shardkit.shuffle_quality`` of the written order with batches of 256
  (1.0 = as mixed as i.i.d.) and the classes in the least mixed shard of
  1,000; with ``--before PATH`` also for the writer of the checkout at PATH.

Writes ``bench/results/scale-writer.json`` / ``.md`` / ``.png`` (driver memory
against rows).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(HERE)
CLASSES = 100
#: Shard (chunk) size of every writer on JSONL rows: shardkit's default.
SHARD_BYTES = 256 << 20

sys.path.insert(0, REPO_ROOT)
from bench.common import peak_rss_mb  # noqa: E402


def rows_file(workdir: str, num_rows: int, *, classes: bool = False) -> str:
    """A cached JSONL of ``num_rows`` rows (class-sorted with a ``cls`` field when ``classes``)."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, f"rows-{num_rows}{'-cls' if classes else ''}.jsonl")
    if os.path.exists(path):
        return path
    with open(path + ".tmp", "w") as f:
        batch = []
        for i in range(num_rows):
            row: dict[str, Any] = {"__key__": f"row{i:010d}", "txt": f"caption number {i} " * 3, "json": {"i": i, "w": 640}}
            if classes:
                row["cls"] = i * CLASSES // num_rows
            batch.append(json.dumps(row))
            if len(batch) == 100_000:
                f.write("\n".join(batch) + "\n")
                batch = []
        if batch:
            f.write("\n".join(batch) + "\n")
    os.replace(path + ".tmp", path)
    return path


def image_folder(workdir: str, num_files: int) -> str:
    """A cached ImageFolder of ``num_files`` tiny JPEGs in :data:`CLASSES` class folders.

    Sixteen 16x16 JPEGs are encoded once; each file is one of them with its
    own index appended after the image's end marker (decoders ignore it), so
    no two files hold the same bytes.
    """
    import io

    from PIL import Image

    root = os.path.join(workdir, f"images-{num_files}")
    if os.path.exists(root):
        return root
    templates = []
    for t in range(16):
        buf = io.BytesIO()
        Image.new("RGB", (16, 16), (t * 16, 255 - t * 16, (t * 97) % 256)).save(buf, format="JPEG", quality=90)
        templates.append(buf.getvalue())
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for c in range(CLASSES):
        os.makedirs(os.path.join(tmp, f"class{c:03d}"))
    for i in range(num_files):
        c = i * CLASSES // num_files
        with open(os.path.join(tmp, f"class{c:03d}", f"img{i:07d}.jpg"), "wb") as f:
            f.write(templates[i % 16] + b"%d" % i)
    os.replace(tmp, root)
    return root


def image_samples(root: str) -> list[tuple[str, str, int]]:
    """``(key, path, class index)`` of every file of the ImageFolder ``root``, sorted (shardkit's keys)."""
    samples = []
    for label, name in enumerate(sorted(e.name for e in os.scandir(root) if e.is_dir())):
        folder = os.path.join(root, name)
        for file in sorted(os.listdir(folder)):
            samples.append((f"{name}/{file.rpartition('.')[0]}", os.path.join(folder, file), label))
    return samples


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# ------------------------------------------------------------------ cells (in a child process)


def cell_plan(rows: str, workers: int) -> dict[str, Any]:
    from shardkit.write.dry_run import plan_dataset
    from shardkit.write.parallel import WriteOptions

    base = peak_rss_mb()
    wall, cpu = time.perf_counter(), cpu_s()
    plan = plan_dataset(rows, options=WriteOptions(workers=workers))
    wall, cpu = time.perf_counter() - wall, cpu_s() - cpu
    return {"samples": plan.num_samples, "shards": plan.num_shards, "seconds": wall, "cpu_seconds": cpu,
            "rows_per_s": plan.num_samples / wall, "rows_per_cpu_s": plan.num_samples / cpu,
            "driver_peak_mb": peak_rss_mb(), "rss_at_start_mb": base}


def _written(samples: int, started: tuple[float, float]) -> dict[str, Any]:
    """A write cell's result: ``samples`` written since ``started`` (:func:`_clocks`),
    wall and CPU time (every thread and reaped worker process of the writer counted)."""
    wall, cpu = (now - then for now, then in zip(_clocks(), started))
    return {"samples": samples, "seconds": wall, "samples_per_s": samples / wall, "cpu_seconds": cpu,
            "samples_per_cpu_s": samples / cpu, "driver_peak_mb": peak_rss_mb()}


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), cpu_s()


def cell_write(rows: str, workers: int, dest: str, shard_bytes: int = SHARD_BYTES) -> dict[str, Any]:
    from shardkit.write.parallel import WriteOptions, write_dataset

    started = _clocks()
    report = write_dataset(rows, dest, options=WriteOptions(workers=workers, max_bytes=shard_bytes))
    return _written(report.manifest.num_samples, started)


def _loop(rows: str, sink: Any, key_name: str) -> dict[str, Any]:
    """Write every row through ``sink.write`` (one process, ``json.loads`` per line), timed."""
    started, count = _clocks(), 0
    with sink, open(rows) as f:
        for line in f:
            row = json.loads(line)
            sink.write({key_name: row["__key__"], "txt": row["txt"], "json": row["json"]})
            count += 1
    return _written(count, started)


def cell_webdataset(rows: str, dest: str, shard_bytes: int = SHARD_BYTES) -> dict[str, Any]:
    import webdataset as wds

    os.makedirs(dest, exist_ok=True)
    return _loop(rows, wds.ShardWriter(os.path.join(dest, "shard-%06d.tar"), maxsize=shard_bytes, verbose=0), "__key__")


def _litdata_row(line: str) -> dict[str, Any]:
    row = json.loads(line)
    return {"txt": row["txt"], "json": json.dumps(row["json"])}


def cell_litdata(rows: str, workers: int, dest: str, shard_bytes: int = SHARD_BYTES) -> dict[str, Any]:
    from litdata import optimize

    with open(rows) as f:
        lines = f.read().splitlines()
    started = _clocks()
    optimize(fn=_litdata_row, inputs=lines, output_dir=dest, chunk_bytes=shard_bytes, num_workers=workers,
             verbose=False, start_method="fork")
    return _written(len(lines), started)


def cell_mosaic(rows: str, dest: str, shard_bytes: int = SHARD_BYTES) -> dict[str, Any]:
    from streaming import MDSWriter

    columns = {"key": "str", "txt": "str", "json": "json"}
    return _loop(rows, MDSWriter(out=dest, columns=columns, size_limit=shard_bytes), "key")


def _image_loop(root: str, sink: Any, key_name: str) -> dict[str, Any]:
    """Write every file of the ImageFolder ``root`` through ``sink.write`` (one process), timed with the listing."""
    started = _clocks()
    samples = image_samples(root)
    with sink:
        for key, path, label in samples:
            with open(path, "rb") as f:
                sink.write({key_name: key, "jpg": f.read(), "cls": label})
    return _written(len(samples), started)


def cell_webdataset_images(root: str, dest: str, shard_bytes: int) -> dict[str, Any]:
    import webdataset as wds

    os.makedirs(dest, exist_ok=True)
    sink = wds.ShardWriter(os.path.join(dest, "shard-%06d.tar"), maxsize=shard_bytes, verbose=0)
    return _image_loop(root, sink, "__key__")


def _litdata_image(sample: tuple[str, str, int]) -> dict[str, Any]:
    key, path, label = sample
    with open(path, "rb") as f:
        return {"key": key, "jpg": f.read(), "cls": label}


def cell_litdata_images(root: str, workers: int, dest: str, shard_bytes: int) -> dict[str, Any]:
    from litdata import optimize

    started = _clocks()
    samples = image_samples(root)
    optimize(fn=_litdata_image, inputs=samples, output_dir=dest, chunk_bytes=shard_bytes, num_workers=workers,
             verbose=False, start_method="fork")
    return _written(len(samples), started)


def cell_mosaic_images(root: str, dest: str, shard_bytes: int) -> dict[str, Any]:
    from streaming import MDSWriter

    columns = {"key": "str", "jpg": "bytes", "cls": "int"}
    return _image_loop(root, MDSWriter(out=dest, columns=columns, size_limit=shard_bytes), "key")


def cell_quality(rows: str, dest: str) -> dict[str, Any]:
    import numpy as np
    import webdataset as wds

    import shardkit
    from shardkit.format.manifest import load_manifest
    from shardkit.read.shuffle import shuffle_quality
    from shardkit.write.parallel import WriteOptions, write_dataset

    write_dataset(rows, dest, options=WriteOptions(max_samples=1000, seed=0, workers=2))
    manifest = load_manifest(dest)
    labels, per_shard = [], []
    for entry in manifest.shards:
        shard = [int(s["cls"]) for s in wds.WebDataset([manifest.resolve(entry.path)], shardshuffle=False)]
        labels += shard
        per_shard.append(len(set(shard)))
    return {"samples": len(labels), "shuffle_quality": shuffle_quality(np.array(labels), batch_size=256),
            "min_classes_per_shard": min(per_shard), "mean_classes_per_shard": sum(per_shard) / len(per_shard),
            "tree": os.path.dirname(os.path.dirname(os.path.abspath(shardkit.__file__)))}


CELLS = {"plan": cell_plan, "write": cell_write, "webdataset": cell_webdataset, "litdata": cell_litdata,
         "mosaic": cell_mosaic, "quality": cell_quality, "webdataset_images": cell_webdataset_images,
         "litdata_images": cell_litdata_images, "mosaic_images": cell_mosaic_images}


def run_cell(kind: str, *args: Any, tree: str = REPO_ROOT, timeout_s: float = 1800) -> dict[str, Any]:
    """Run one cell in a fresh interpreter importing shardkit from ``tree``; its result or error."""
    env = {**os.environ, "PYTHONPATH": tree, "SHARDKIT_BENCH_TREE": tree}
    # Run as a script: the interpreter then puts this folder first on sys.path, not the
    # current directory; the cell puts ``tree`` before this checkout (which it needs for
    # ``bench``), so `import shardkit` finds the tree asked for.
    command = [sys.executable, os.path.abspath(__file__), "--cell", json.dumps([kind, *args])]
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the run


def measure(args: Any) -> dict[str, Any]:
    from bench.common import git_commit, machine

    workdir = args.workdir
    record: dict[str, Any] = {"commit": git_commit(), "machine": machine(), "plan": [], "write": [], "quality": []}
    scratch = os.path.join(workdir, "out")
    for rows in args.rows:
        path = rows_file(workdir, rows)
        for workers in (1, 2):
            cell = run_cell("plan", path, workers)
            record["plan"].append({"rows": rows, "workers": workers, **cell})
            print("plan", rows, workers, cell, flush=True)
    for rows in args.e2e_rows:
        path = rows_file(workdir, rows)
        for peer, workers, cell in _write_cells(path, args.peers, scratch, suffix="", shard_bytes=SHARD_BYTES,
                                                repeats=args.repeats):
            record["write"].append({"rows": rows, "peer": peer, "workers": workers, **cell})
            print("write", rows, peer, workers, cell, flush=True)
    if args.image_files:
        root = image_folder(workdir, args.image_files)
        sizes = []
        for _, path, _ in image_samples(root):  # read every file once: the table says "page cache warm"
            with open(path, "rb") as f:
                sizes.append(len(f.read()))
        images: dict[str, Any] = {"files": len(sizes), "mean_file_bytes": sum(sizes) / len(sizes),
                                  "shard_bytes": args.image_shard_bytes, "plan": [], "write": []}
        record["images"] = images
        for workers in (1, 2):
            cell = run_cell("plan", root, workers)
            images["plan"].append({"workers": workers, **cell})
            print("images plan", workers, cell, flush=True)
        for peer, workers, cell in _write_cells(root, args.peers, scratch, suffix="_images",
                                                shard_bytes=args.image_shard_bytes, repeats=args.repeats):
            images["write"].append({"peer": peer, "workers": workers, **cell})
            print("images write", peer, workers, cell, flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    if args.quality_rows:
        path = rows_file(workdir, args.quality_rows, classes=True)
        for name, tree in [("this tree", REPO_ROOT)] + ([("before", args.before)] if args.before else []):
            shutil.rmtree(scratch, ignore_errors=True)
            cell = run_cell("quality", path, scratch, tree=tree)
            record["quality"].append({"writer": name, "rows": args.quality_rows, **cell})
            print("quality", name, cell, flush=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return record


def _write_cells(source: str, peers: list[str], scratch: str, *, suffix: str, shard_bytes: int, repeats: int) -> Any:
    """``(peer, workers, cell)`` for shardkit's write with 1 and 2 workers, then each peer
    (LitData with 1 and 2 workers) writing ``source`` in shards (chunks) of at most
    ``shard_bytes``; ``suffix`` picks the peers' cells for the source's kind (``""``:
    JSONL rows, ``"_images"``: an ImageFolder). With ``repeats`` > 1 the writers take
    turns that many times; a cell is its median run by wall time, with every run's
    samples/s and samples per CPU-second kept."""
    cells = [("shardkit", 1), ("shardkit", 2)] + [(p, w) for p in peers for w in ((1, 2) if p == "litdata" else (1,))]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {cell: [] for cell in cells}
    for _ in range(repeats):
        for peer, workers in cells:
            shutil.rmtree(scratch, ignore_errors=True)
            if peer == "shardkit":
                cell = run_cell("write", source, workers, scratch, shard_bytes)
            elif peer == "litdata":
                cell = run_cell("litdata" + suffix, source, workers, scratch, shard_bytes)
            else:
                cell = run_cell(peer + suffix, source, scratch, shard_bytes)
            print("  run", peer, workers, cell, flush=True)
            runs[peer, workers].append(cell)
    for (peer, workers), done in runs.items():
        good = sorted((c for c in done if "error" not in c), key=lambda c: c["seconds"])
        if not good:
            yield peer, workers, done[0]
            continue
        median = dict(good[len(good) // 2])
        if repeats > 1:
            median["runs"] = [{k: c[k] for k in ("samples_per_s", "samples_per_cpu_s")} for c in good]
        yield peer, workers, median


def _row(cell: dict[str, Any], lead: str, body: Any) -> str:
    """A Markdown table row: ``lead`` cells, then ``body(cell)`` or the cell's error."""
    return f"| {lead} | {'error: ' + cell['error'] if 'error' in cell else body(cell)} |"


def table(record: dict[str, Any]) -> str:
    lines = [f"# Writer at scale (commit {record['commit']}, {record['machine']['cpus']} CPUs)", "",
             *[f"- {note}" for note in record.get("notes", [])], *([""] if record.get("notes") else []),
             "## Scan + plan (`shardkit write --dry-run`)", "",
             "| rows | workers | driver peak MB | seconds | rows/s (wall) | rows per CPU second |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [_row(c, f"{c['rows']:,} | {c['workers']}", lambda c: f"{c['driver_peak_mb']:.0f} | {c['seconds']:.1f} | "
                   f"{c['rows_per_s']:,.0f} | {c['rows_per_cpu_s']:,.0f}") for c in record["plan"]]
    lines += ["", "## End to end (default shard size 256 MB)", "",
              "CPU seconds: every thread and worker process of the writer, so samples per CPU-second is the rate per core.",
              "", "| rows | writer | workers | seconds | samples/s | CPU seconds | samples per CPU-second |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [_row(c, f"{c['rows']:,} | {c['peer']} | {c['workers']}", lambda c: f"{c['seconds']:.1f} | {c['samples_per_s']:,.0f} | "
                   f"{_cpu(c)}") for c in record["write"]]
    if record.get("images"):
        lines += ["", *image_table(record["images"])]
    if record["quality"]:
        lines += ["", "## Shuffle of class-sorted rows (100 classes, shards of 1,000)", "",
                  "| writer | rows | shuffle_quality (1.0 = i.i.d.) | classes in the least mixed shard | mean classes per shard |",
                  "|---|---:|---:|---:|---:|"]
        lines += [_row(c, f"{c['writer']} | {c['rows']:,}", lambda c: f"{c['shuffle_quality']:.3f} | "
                       f"{c['min_classes_per_shard']} | {c['mean_classes_per_shard']:.1f}") for c in record["quality"]]
    return "\n".join(lines) + "\n"


def _cpu(cell: dict[str, Any]) -> str:
    """A write cell's CPU seconds and samples per CPU-second, with every run's rates when repeated."""
    if "cpu_seconds" not in cell:
        return "– | –"  # a record from before CPU time was measured
    text = f"{cell['cpu_seconds']:.1f} | {cell['samples_per_cpu_s']:,.0f}"
    if len(cell.get("runs", [])) > 1:
        text += " (runs: " + ", ".join(f"{r['samples_per_cpu_s']:,.0f}" for r in cell["runs"]) + ")"
    return text


def image_table(images: dict[str, Any]) -> list[str]:
    """The ImageFolder section: one row per writer and worker count, shardkit's scan + plan beside its write."""
    plans = {c["workers"]: c for c in images["plan"]}
    lines = [f"## ImageFolder of {images['files']:,} small files (100 classes, JPEGs of {images['mean_file_bytes']:.0f} B "
             f"on average, page cache warm; shards of {images['shard_bytes'] / 2**20:g} MB)", "",
             "Scan + plan is shardkit's `--dry-run` (nothing written); the peers list the folder inside their "
             "write loop, so their end-to-end time includes it. Driver peak: the writing process's VmHWM "
             "(worker processes not counted).", "",
             "| writer | workers | scan + plan: driver peak MB | scan + plan: files/s | end to end: seconds "
             "| end to end: samples/s | end to end: CPU seconds | samples per CPU-second | end to end: driver peak MB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in images["write"]:
        plan = plans.get(c["workers"]) if c["peer"] == "shardkit" else None
        if plan is None:
            scan = "– | –"
        elif "error" in plan:
            scan = f"error: {plan['error']} | –"
        else:
            scan = f"{plan['driver_peak_mb']:.0f} | {plan['rows_per_s']:,.0f}"
        lines.append(_row(c, f"{c['peer']} | {c['workers']} | {scan}", lambda c: f"{c['seconds']:.1f} | "
                          f"{c['samples_per_s']:,.0f} | {_cpu(c)} | {c['driver_peak_mb']:.0f}"))
    return lines


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for workers in (1, 2):
        cells = [c for c in record["plan"] if c["workers"] == workers and "error" not in c]
        if cells:
            ax.plot([c["rows"] for c in cells], [c["driver_peak_mb"] for c in cells], "o-", label=f"shardkit, {workers} worker(s)")
    images = record.get("images") or {}
    for workers in (1, 2):
        cells = [c for c in images.get("plan", []) if c["workers"] == workers and "error" not in c]
        if cells:
            ax.plot([images["files"]] * len(cells), [c["driver_peak_mb"] for c in cells], "s",
                    label=f"shardkit ImageFolder, {workers} worker(s)")
    rows = sorted({c["rows"] for c in record["plan"]})
    if rows:
        ax.plot(rows, [r * 330 / 2**20 for r in rows], "k:", label="330 B per sample (before)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples (JSONL rows, image files)")
    ax.set_ylabel("driver peak memory, MB")
    ax.set_title("shardkit write --dry-run: driver memory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str]) -> int:
    """``bench/bench_scale.py --writer [options]``."""
    import argparse

    from bench.common import plot_path, save_record

    def ints(text: str) -> list[int]:
        return [int(float(part)) for part in text.split(",") if part.strip()]

    parser = argparse.ArgumentParser(prog="bench/bench_scale.py --writer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=ints, default=[10**5, 10**6, 10**7], help="dry-run sizes")
    parser.add_argument("--e2e-rows", type=ints, default=[10**5, 10**6], help="end-to-end sizes")
    parser.add_argument("--peers", type=lambda t: [p for p in t.split(",") if p], default=["webdataset", "litdata", "mosaic"])
    parser.add_argument("--image-files", type=lambda t: int(float(t)), default=10**5,
                        help="files of the ImageFolder rows (scan + plan and end to end, with the peers); 0 skips them")
    parser.add_argument("--image-shard-bytes", type=lambda t: int(float(t)), default=16 << 20,
                        help="shard (chunk) size of every writer in the ImageFolder rows: 16 MB by default, so "
                        "10^5 files make ~16 shards and 2 workers have shards to share")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each end-to-end cell, the writers taking turns; the median run is reported")
    parser.add_argument("--quality-rows", type=int, default=10**5)
    parser.add_argument("--before", help="a checkout of shardkit to compare the shuffle with (e.g. /work/main)")
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "scale-writer"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "scale-writer.json"))
    parser.add_argument("--report-only", action="store_true", help="rewrite the Markdown and plot from --out's JSON")
    args = parser.parse_args(argv)
    if args.report_only:
        with open(args.out) as f:
            record = json.load(f)
    else:
        started = time.time()
        record = measure(args)
        record["command"] = " ".join(["bench/bench_scale.py --writer", *argv])
        record["seconds"] = time.time() - started
    save_record(args.out, record, table(record))
    plot(record, plot_path(args.out))
    print(table(record))
    return 0


if __name__ == "__main__":
    kind, *cell_args = json.loads(sys.argv[2])  # --cell JSON, from run_cell
    # `bench` is imported from this checkout by now; shardkit comes from the tree asked for.
    sys.path.insert(0, os.environ.get("SHARDKIT_BENCH_TREE", REPO_ROOT))
    assert "shardkit" not in sys.modules, "a cell must import shardkit only after choosing its tree"
    print(json.dumps(CELLS[kind](*cell_args)))
