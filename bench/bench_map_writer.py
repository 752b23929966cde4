#!/usr/bin/env python3
"""A user's function inside the writer (issue #39): shardkit against three other ways of running it.

The same two top-level functions of ``bench/map_functions.py`` run in every writer:

- ``image``: decode a ~500 KB photo (``tools/gen_photos.py --preset highres``,
  a pool of ``--photos`` cached under ``bench/work/map_writer/``; items cycle
  over the pool), resize to a 256 px shorter side, encode JPEG quality 90;
- ``text``: tokenize a synthetic caption (10-40 words of a fixed vocabulary)
  into an int32 array with a plain-Python hashing tokenizer.

The writers, each at 1 and 2 workers:

- ``shardkit``: ``write_dataset(items, dest, map=fn, options=WriteOptions(workers=N, seed=0, max_samples=...))``;
- ``hand-rolled``: shuffle, deal into shards, a ``multiprocessing.Pool`` with a
  ``webdataset.TarWriter`` per shard (``bench/map_handrolled.py``);
- ``litdata``: ``litdata.optimize(fn=fn, inputs=items, num_workers=N,
  chunk_bytes="64MB")``, in its own venv (``--litdata-python``, ``make bench-map``
  makes ``.venv-map``);
- ``ray``: ``ray.data.from_items(rows).map(adapter).write_webdataset(dest)`` on a
  one-node Ray cluster with ``--num-cpus=N``, started in a network namespace
  with only loopback up (needs root; otherwise the Ray cells are recorded as
  skipped). Its temporary folder and HOME are under ``bench/work``.

Each cell is a fresh interpreter with a timeout; a writer that fails is
recorded with its error and the run goes on. Timed: the write call alone
(items built and photos read into the page cache before). Then the output is
read back: every item must be there exactly once with its fields, else the
cell is an error. For shardkit, whether 1 and 2 workers give the same bytes
(sha256 of every shard); for LitData, whether a rerun at 2 workers does.

Writes ``bench/results/map_writer.json`` / ``.md`` / ``.png``
(``--quick``: ``bench/work/results-quick/``)::

    make bench-map                                           # full: 10^4 images, 10^5 texts, 3 repeats
    sudo .venv/bin/python bench/bench_map_writer.py --quick  # 2,000 images, 20,000 texts, 1 repeat
    .venv/bin/python bench/bench_map_writer.py --writers shardkit,hand-rolled --images 50 --texts 500
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, REPO_ROOT)

from bench.common import git_commit, machine, plot_path, save_record  # noqa: E402
from bench.common import run_cell as common_run_cell  # noqa: E402

WRITERS = ("shardkit", "hand-rolled", "litdata", "ray")
FUNCTIONS = ("image", "text")
WORKERS = (1, 2)
#: Samples per shard (hand-rolled, shardkit) and blocks of Ray: ~30 MB of images, ~20 MB of text.
PER_SHARD = {"image": 1_000, "text": 10_000}
#: What each function's samples hold besides ``__key__``.
FIELDS = {"image": ["cls", "jpg"], "text": ["tokens.npy", "txt"]}
LITDATA_CHUNK_BYTES = "64MB"
SEED = 0
FULL = {"images": 10_000, "texts": 100_000, "repeats": 3, "timeout_s": 1800.0}
QUICK = {"images": 2_000, "texts": 20_000, "repeats": 1, "timeout_s": 600.0}
#: The targets of issue #39: (name, numerator, denominator, at least).
TARGETS = (
    ("shardkit / hand-rolled, 2 workers", ("shardkit", 2), ("hand-rolled", 2), 1.0),
    ("shardkit / LitData, 2 workers", ("shardkit", 2), ("litdata", 2), 1.2),
    ("shardkit / Ray Data, 2 workers", ("shardkit", 2), ("ray", 2), 2.0),
    ("shardkit 2 workers / 1 worker", ("shardkit", 2), ("shardkit", 1), 1.8),
)
CELL_ANSWER = "@@bench-map "
RAY_PORT = 6379


# --------------------------------------------------------------------------- inputs


def photo_dir(workdir: str, count: int) -> str:
    """The pool of highres photos, made once (tools/gen_photos.py) and cached."""
    folder = os.path.join(workdir, f"photos-highres-{count}")
    if not os.path.isdir(folder):
        sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
        from gen_photos import generate

        print(f"making {count} highres photos in {folder} ...", flush=True)
        shutil.rmtree(folder + ".tmp", ignore_errors=True)
        generate(folder + ".tmp", preset="highres", count=count, seed=SEED)
        os.replace(folder + ".tmp", folder)
    return folder


def make_items(spec: dict[str, Any]) -> list[tuple[int, Any]]:
    from bench.map_functions import image_items, photo_pool, text_items

    if spec["function"] == "image":
        pool = photo_pool(spec["photos"])
        for path in pool:  # into the page cache: the timed part decodes, it does not wait on the disk
            with open(path, "rb") as f:
                f.read()
        return image_items(pool, spec["items"])
    return text_items(spec["items"], seed=SEED)


# --------------------------------------------------------------------------- the writers (in the cell process)
#
# Each ``prepare_*`` imports its writer and checks what it needs (untimed), then
# returns the write itself: a function of the items, timed by the cell.

Write = Callable[[list[Any]], dict[str, Any]]


def prepare_shardkit(spec: dict[str, Any]) -> Write:
    import inspect

    import shardkit
    from bench.map_functions import FUNCTIONS as FNS

    if "map" not in inspect.signature(shardkit.write_dataset).parameters:
        raise RuntimeError("this shardkit's write_dataset has no map= yet (issue #39): nothing to measure")
    options = shardkit.WriteOptions(workers=spec["workers"], seed=SEED, shuffle=True, max_samples=spec["per_shard"])

    def write(items: list[Any]) -> dict[str, Any]:
        shardkit.write_dataset(items, spec["dest"], map=FNS[spec["function"]], options=options)
        return {"version": getattr(shardkit, "__version__", None)}

    return write


def prepare_hand_rolled(spec: dict[str, Any]) -> Write:
    import webdataset

    from bench.map_functions import FUNCTIONS as FNS
    from bench.map_handrolled import make_wds_shards

    def write(items: list[Any]) -> dict[str, Any]:
        os.makedirs(spec["dest"])
        num_shards = math.ceil(len(items) / spec["per_shard"])
        pattern = os.path.join(spec["dest"], "shard-%06d.tar")
        make_wds_shards(pattern, num_shards, spec["workers"], items, FNS[spec["function"]], seed=SEED)
        return {"version": getattr(webdataset, "__version__", None), "num_shards": num_shards}

    return write


def prepare_litdata(spec: dict[str, Any]) -> Write:
    import litdata

    from bench.map_functions import FUNCTIONS as FNS

    def write(items: list[Any]) -> dict[str, Any]:
        litdata.optimize(fn=FNS[spec["function"]], inputs=items, output_dir=spec["dest"], num_workers=spec["workers"],
                         chunk_bytes=LITDATA_CHUNK_BYTES, start_method="fork", verbose=False)  # fmt: skip
        return {"version": litdata.__version__}

    return write


def prepare_ray(spec: dict[str, Any]) -> Write:
    import ray

    from bench.map_functions import FUNCTIONS as FNS
    from bench.map_functions import ray_row

    ray.init(address=spec["address"], logging_level="WARNING", log_to_driver=False)  # connecting is not the write
    ray.data.DataContext.get_current().enable_progress_bars = False

    def write(items: list[Any]) -> dict[str, Any]:
        rows = [{"index": index, "value": value} for index, value in items]
        num_blocks = math.ceil(len(items) / spec["per_shard"])
        dataset = ray.data.from_items(rows, override_num_blocks=num_blocks)
        dataset.map(ray_row, fn_kwargs={"fn": FNS[spec["function"]]}).write_webdataset(spec["dest"], encoder=None)
        return {"version": ray.__version__, "num_blocks": num_blocks}

    return write


PREPARE = {"shardkit": prepare_shardkit, "hand-rolled": prepare_hand_rolled, "litdata": prepare_litdata,
           "ray": prepare_ray}  # fmt: skip


# --------------------------------------------------------------------------- reading the output back


def files_sha256(dest: str, suffixes: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file under ``dest`` ending in one of ``suffixes``, by relative path."""
    out = {}
    for root, _, names in os.walk(dest):
        for name in names:
            if name.endswith(suffixes):
                path = os.path.join(root, name)
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                out[os.path.relpath(path, dest)] = digest.hexdigest()
    return dict(sorted(out.items()))


def tree_bytes(dest: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(dest) for name in names)


def tar_samples(dest: str) -> Iterator[tuple[str, list[str]]]:
    """(key, field names) of each sample of every tar file under ``dest``: members in a row
    with the same key (the name up to its first dot) are one sample, as webdataset reads them."""
    for path in sorted(os.path.join(root, n) for root, _, names in os.walk(dest) for n in names if n.endswith(".tar")):
        key, fields = None, []
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                stem, _, field = os.path.basename(member.name).partition(".")
                if stem != key and key is not None:
                    yield key, fields
                    fields = []
                key = stem
                fields.append(field)
        if key is not None:
            yield key, fields


def litdata_samples(dest: str) -> Iterator[tuple[str, list[str]]]:
    import litdata

    for sample in litdata.StreamingDataset(dest):
        yield sample["__key__"], [name for name in sample if name != "__key__"]


def check_samples(samples: Iterator[tuple[str, list[str]]], spec: dict[str, Any]) -> dict[str, Any]:
    """Count what was written; ``error`` unless every item is there once with the expected fields."""
    from bench.map_functions import sample_key

    expected_fields = sorted(FIELDS[spec["function"]])
    seen: set[str] = set()
    count = duplicates = bad_fields = 0
    for key, fields in samples:
        count += 1
        duplicates += key in seen
        seen.add(key)
        bad_fields += sorted(fields) != expected_fields
    missing = sum(sample_key(i) not in seen for i in range(spec["items"]))
    out: dict[str, Any] = {"samples": count}
    problems = [f"{n} {what}" for n, what in ((duplicates, "duplicate keys"), (missing, "items missing"),
                                               (bad_fields, f"samples without exactly {expected_fields}")) if n]  # fmt: skip
    if count != spec["items"] or problems:
        out["error"] = f"wrote {count} samples for {spec['items']} items" + (f" ({', '.join(problems)})" if problems else "")
    return out


def read_back(spec: dict[str, Any]) -> dict[str, Any]:
    dest = spec["dest"]
    litdata = spec["writer"] == "litdata"
    hashes = files_sha256(dest, (".bin",) if litdata else (".tar",))
    out = check_samples(litdata_samples(dest) if litdata else tar_samples(dest), spec)
    return {**out, "output_bytes": tree_bytes(dest), "num_files": len(hashes), "files_sha256": hashes}


def cell_main(spec: dict[str, Any]) -> dict[str, Any]:
    items = make_items(spec)
    shutil.rmtree(spec["dest"], ignore_errors=True)
    write = PREPARE[spec["writer"]](spec)
    started = time.perf_counter()
    result = write(items)
    result["seconds"] = time.perf_counter() - started
    if spec["writer"] == "ray":
        import ray

        ray.shutdown()
    result.update(read_back(spec))
    return result


# --------------------------------------------------------------------------- the parent


def run_cell(spec: dict[str, Any], *, python: str, timeout_s: float, prefix: list[str] | None = None,
             env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One cell in a fresh interpreter (inside ``prefix``, e.g. ``ip netns exec``); its answer or its error."""
    return common_run_cell(__file__, spec, answer=CELL_ANSWER, python=python, timeout_s=timeout_s, prefix=prefix,
                           env=env)  # fmt: skip


def ray_temp_dir(workdir: str) -> str:
    """Ray's temporary folder under ``workdir``, or under /tmp when that path is too long for
    the Unix sockets Ray makes inside it (~60 more characters, 107 at most)."""
    name = f"ray{uuid.uuid4().hex[:4]}"
    inside = os.path.join(workdir, name)
    return inside if len(inside) <= 40 else os.path.join("/tmp", name)


@contextlib.contextmanager
def ray_cluster(num_cpus: int, workdir: str) -> Iterator[dict[str, Any]]:
    """A one-node Ray cluster of ``num_cpus`` CPUs in a fresh network namespace (loopback only).

    Yields ``{"prefix", "env", "address"}`` to run its drivers with, or ``{"skip": why}``.
    """
    if os.geteuid() != 0:
        yield {"skip": "not root: Ray runs in a network namespace of its own (ip netns add)"}
        return
    name = f"skmap-{uuid.uuid4().hex[:6]}"
    temp_dir = ray_temp_dir(workdir)
    home = os.path.join(workdir, "ray-home")
    os.makedirs(home, exist_ok=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": REPO_ROOT, "RAY_TMPDIR": temp_dir, "HOME": home}
    env.pop("RAY_ADDRESS", None)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    prefix = ["ip", "netns", "exec", name]
    added = False
    try:
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, text=True)
        added = True
        subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], check=True, capture_output=True, text=True)
        subprocess.run(
            [*prefix, ray_bin, "start", "--head", f"--port={RAY_PORT}", f"--num-cpus={num_cpus}", "--num-gpus=0",
             f"--temp-dir={temp_dir}", "--object-store-memory=2000000000", "--include-dashboard=false",
             "--disable-usage-stats"],
            check=True, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or ""
        yield {"skip": f"the Ray cluster did not start: {exc} {detail.strip()[-300:]}".strip()}
    else:
        yield {"prefix": prefix, "env": env, "address": f"127.0.0.1:{RAY_PORT}", "temp_dir": temp_dir}
    finally:
        if added:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), sig)
                if pids:
                    time.sleep(2)
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


def summarize(runs: list[dict[str, Any]], items: int) -> dict[str, Any]:
    """The cell's row from its runs: the median time of the runs that wrote every item."""
    good = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs": [{k: v for k, v in r.items() if k != "files_sha256"} for r in runs]}
    if not good:
        out["error"] = runs[-1]["error"] if runs else "not run"
        return out
    seconds = statistics.median(r["seconds"] for r in good)
    last = good[-1]
    out.update(seconds=seconds, items_per_s=items / seconds, output_bytes=last["output_bytes"],
               num_files=last["num_files"], samples=last["samples"], version=last.get("version"),
               files_sha256=last["files_sha256"])  # fmt: skip
    if len(good) > 1:
        out["same_bytes_on_rerun"] = all(r["files_sha256"] == good[0]["files_sha256"] for r in good[1:])
    if len(good) < len(runs):
        out["failed_runs"] = len(runs) - len(good)
    return out


def run_writer(spec: dict[str, Any], args: argparse.Namespace, cluster: dict[str, Any]) -> dict[str, Any]:
    """One run of one writer, in the interpreter (and, for Ray, the namespace) it needs."""
    if spec["writer"] == "ray":
        spec = {**spec, "address": cluster["address"]}
        return run_cell(spec, python=sys.executable, timeout_s=args.timeout_s, prefix=cluster["prefix"],
                        env=cluster["env"])  # fmt: skip
    if spec["writer"] == "litdata":  # its scratch folders (default: under /tmp) go under workdir
        scratch = os.path.join(args.workdir, "litdata-cache")
        env = {**os.environ, "DATA_OPTIMIZER_CACHE_FOLDER": os.path.join(scratch, "chunks"),
               "DATA_OPTIMIZER_DATA_CACHE_FOLDER": os.path.join(scratch, "data")}  # fmt: skip
        return run_cell(spec, python=args.litdata_python, timeout_s=args.timeout_s, env=env)
    return run_cell(spec, python=sys.executable, timeout_s=args.timeout_s)


def measure(args: argparse.Namespace, record: dict[str, Any], save: Callable[[], None]) -> None:
    """Every cell, 1 worker then 2 (one Ray cluster each), the writers interleaved within a repeat."""
    out_root = os.path.join(args.workdir, "out")
    photos = photo_dir(args.workdir, args.photos) if "image" in args.functions else None
    if "litdata" in args.writers and not os.path.exists(args.litdata_python):
        record["skipped"]["litdata"] = f"{args.litdata_python} not found (`make bench-map` makes .venv-map)"
    counts = {"image": args.images, "text": args.texts}
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for workers in WORKERS:
        want_ray = "ray" in args.writers
        with ray_cluster(workers, args.workdir) if want_ray else contextlib.nullcontext({}) as cluster:
            if "skip" in cluster:
                record["skipped"][f"ray, {workers} CPUs"] = cluster["skip"]
            writers = [w for w in args.writers if not (w == "litdata" and "litdata" in record["skipped"])
                       and not (w == "ray" and "skip" in cluster)]  # fmt: skip
            for function in args.functions:
                rounds = [(repeat, writers) for repeat in range(args.repeats)]
                if args.litdata_rerun and "litdata" in writers and workers == max(WORKERS):
                    rounds.append((args.repeats, ["litdata"]))  # untimed: are its bytes the same again?
                for repeat, round_writers in rounds:
                    for writer in round_writers:
                        spec = {"writer": writer, "function": function, "workers": workers, "items": counts[function],
                                "per_shard": PER_SHARD[function], "photos": photos,
                                "dest": os.path.join(out_root, f"{function}-{writer}-{workers}w")}  # fmt: skip
                        result = run_writer(spec, args, cluster)
                        result["untimed_rerun"] = repeat == args.repeats
                        runs.setdefault((function, writer, workers), []).append(result)
                        brief = {k: v for k, v in result.items() if k not in ("files_sha256", "stderr_tail")}
                        print(f"{function} {writer} {workers}w run {repeat + 1}: {json.dumps(brief)}", flush=True)
                    record["cells"] = cells_of(args, record, runs)
                    save()


def cells_of(args: argparse.Namespace, record: dict[str, Any], runs: dict[tuple[str, str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:  # fmt: skip
    counts = {"image": args.images, "text": args.texts}
    cells = []
    for function in args.functions:
        for writer in args.writers:
            for workers in WORKERS:
                cell: dict[str, Any] = {"function": function, "writer": writer, "workers": workers}
                got = runs.get((function, writer, workers))
                skip = record["skipped"].get("litdata" if writer == "litdata" else f"ray, {workers} CPUs")
                if writer in ("litdata", "ray") and skip:
                    cell["error"] = f"skipped: {skip}"
                elif got:
                    timed = [r for r in got if not r.get("untimed_rerun")]
                    cell.update(summarize(timed, counts[function]))
                    reruns = [r for r in got if r.get("untimed_rerun") and "error" not in r]
                    if reruns and "files_sha256" in cell:
                        cell["same_bytes_on_rerun"] = reruns[0]["files_sha256"] == cell["files_sha256"]
                else:
                    continue
                cells.append(cell)
    for function in args.functions:  # 1 and 2 workers: the same bytes?
        for writer in args.writers:
            pair = [c for c in cells if (c["function"], c["writer"]) == (function, writer) and "files_sha256" in c]
            if len(pair) == 2:
                same = pair[0]["files_sha256"] == pair[1]["files_sha256"]
                for c in pair:
                    c["same_bytes_1w_2w"] = same
    return cells


# --------------------------------------------------------------------------- report


def cell_of(record: dict[str, Any], function: str, writer: str, workers: int) -> dict[str, Any]:
    for cell in record["cells"]:
        if (cell["function"], cell["writer"], cell["workers"]) == (function, writer, workers):
            return cell
    return {}


def target_checks(record: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for function in record["functions"]:
        checks = []
        for name, top, bottom, least in TARGETS:
            a = cell_of(record, function, *top).get("items_per_s")
            b = cell_of(record, function, *bottom).get("items_per_s")
            ratio = a / b if a and b else None
            checks.append({"target": name, "ratio": ratio, "at_least": least,
                           "met": None if ratio is None else ratio >= least})  # fmt: skip
        out[function] = checks
    return out


def _yes(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "–")


def table(record: dict[str, Any]) -> str:
    names = {"image": "Image: decode a ~500 KB photo, resize to 256 px, JPEG q90",
             "text": "Text: tokenize a caption into an int32 array"}  # fmt: skip
    lines = [
        "# A user's function inside the writer (issue #39)",
        "",
        f"shardkit commit {record['git_commit']}; "
        + ", ".join(f"{k} {v}" for k, v in record["versions"].items() if v)
        + f". {record['machine']['cpus']} CPUs shared with other jobs (load average {record['load_before']:.1f} "
        f"before, {record.get('load_after', float('nan')):.1f} after); {record.get('seconds', 0) / 60:.1f} minutes. "
        f"Median of {record['repeats']} run(s); each run a fresh process; timed: the write call alone (items built "
        f"and photos in the page cache before; Ray: after connecting to its cluster). Every output read back: "
        f"each item once, with its fields. Shards of {PER_SHARD['image']:,} images / {PER_SHARD['text']:,} texts "
        f"(hand-rolled and shardkit; Ray: as many blocks); LitData chunks of {LITDATA_CHUNK_BYTES}. Ray: one node "
        f"with N CPUs in a network namespace.",
        "",
    ]
    for function in record["functions"]:
        count = record["items"][function]
        lines += [f"## {names[function]} ({count:,} items)", "",
                  "| writer | workers | seconds | items/s | output MB | files | same bytes 1w/2w | same bytes on rerun | note |",
                  "|---|---:|---:|---:|---:|---:|---|---|---|"]  # fmt: skip
        for writer in record["writers"]:
            for workers in WORKERS:
                cell = cell_of(record, function, writer, workers)
                if not cell:
                    continue
                note = (cell.get("error") or "").replace("|", "/").replace("\n", " ")[:200]
                if cell.get("failed_runs"):
                    note = f"{cell['failed_runs']} run(s) failed: {cell['runs'][-1].get('error', '')}"[:200]
                if "seconds" not in cell:
                    lines.append(f"| {writer} | {workers} | – | – | – | – | – | – | {note} |")
                    continue
                lines.append(
                    f"| {writer} | {workers} | {cell['seconds']:.2f} | {cell['items_per_s']:,.0f} "
                    f"| {cell['output_bytes'] / 1e6:.1f} | {cell['num_files']} | {_yes(cell.get('same_bytes_1w_2w'))} "
                    f"| {_yes(cell.get('same_bytes_on_rerun'))} | {note} |"
                )
        lines += ["", "| target | ratio | at least | met |", "|---|---:|---:|---|"]
        for check in record["targets"][function]:
            ratio = "–" if check["ratio"] is None else f"{check['ratio']:.2f}x"
            met = {True: "✓ met", False: "✗ not met"}.get(check["met"], "– not measured")
            lines.append(f"| {check['target']} | {ratio} | {check['at_least']:g}x | {met} |")
        lines.append("")
    sk = [c for c in record["cells"] if c["writer"] == "shardkit" and c["workers"] == 2 and "same_bytes_1w_2w" in c]
    if sk:
        lines += ["shardkit, 1 and 2 workers byte-identical (sha256 of every shard): "
                  + ", ".join(f"{c['function']} {_yes(c['same_bytes_1w_2w'])}" for c in sk) + ".", ""]  # fmt: skip
    lines += ["Same bytes: sha256 of every output file (tar shards; LitData's .bin chunks), names included. "
              "Where the peers differ, the usual causes: webdataset's TarWriter stamps each member with the current "
              "time unless given `mtime` (the hand-rolled writer, like the seed's, does not); Ray Data stamps the time "
              "and names its files with a random id; LitData's chunks follow its workers.", ""]  # fmt: skip
    if record["skipped"]:
        lines.append("Skipped: " + "; ".join(f"{k}: {v}" for k, v in record["skipped"].items()) + ".")
    return "\n".join(lines).rstrip() + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    functions = record["functions"]
    fig, axes = plt.subplots(1, len(functions), figsize=(6 * len(functions), 4), squeeze=False)
    width = 0.8 / len(WORKERS)
    for ax, function in zip(axes[0], functions):
        writers = record["writers"]
        for j, workers in enumerate(WORKERS):
            rates = [cell_of(record, function, w, workers).get("items_per_s", 0.0) for w in writers]
            xs = [i + (j - (len(WORKERS) - 1) / 2) * width for i in range(len(writers))]
            ax.bar(xs, rates, width, label=f"{workers} worker{'s' if workers > 1 else ''}")
        ax.set_xticks(range(len(writers)), writers)
        ax.set_ylabel("items/s")
        ax.set_title(f"{function} ({record['items'][function]:,} items)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"A user's function inside the writer (shardkit {record['git_commit']}; 0 = failed or skipped)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("shardkit", "webdataset", "ray", "numpy", "pillow"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def finish(record: dict[str, Any], out: str) -> None:
    record["targets"] = target_checks(record)
    lit = [c.get("version") for c in record["cells"] if c["writer"] == "litdata" and c.get("version")]
    if lit:
        record["versions"]["litdata"] = lit[0]
    save_record(out, record, table(record))


def parse_list(text: str, allowed: tuple[str, ...]) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(allowed))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {allowed}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="2,000 images, 20,000 texts, 1 repeat")
    parser.add_argument("--images", type=int, help=f"image items (default {FULL['images']:,})")
    parser.add_argument("--texts", type=int, help=f"text items (default {FULL['texts']:,})")
    parser.add_argument("--repeats", type=int, help="timed runs per cell (default 3; quick 1)")
    parser.add_argument("--photos", type=int, default=200, help="size of the photo pool the image items cycle over")
    parser.add_argument("--writers", type=lambda t: parse_list(t, WRITERS), default=list(WRITERS))
    parser.add_argument("--functions", type=lambda t: parse_list(t, FUNCTIONS), default=list(FUNCTIONS))
    parser.add_argument("--litdata-python", default=os.path.join(REPO_ROOT, ".venv-map", "bin", "python"),
                        help="interpreter with litdata installed (make bench-map: .venv-map)")  # fmt: skip
    parser.add_argument("--no-litdata-rerun", dest="litdata_rerun", action="store_false",
                        help="with 1 repeat, skip the untimed LitData rerun that checks its bytes")  # fmt: skip
    parser.add_argument("--timeout-s", type=float, help="per cell (default 1800; quick 600)")
    parser.add_argument("--workdir", default=os.path.join(HERE, "work", "map_writer"))
    parser.add_argument("--out", help="the JSON record (default bench/results/map_writer.json; "
                        "quick: bench/work/results-quick/map_writer.json)")  # fmt: skip
    parser.add_argument("--report-only", action="store_true", help="rewrite the Markdown and plot from --out's JSON")
    args = parser.parse_args(argv)
    if args.cell:
        result = cell_main(json.loads(args.cell))
        print(CELL_ANSWER + json.dumps(result), flush=True)
        return 0
    preset = QUICK if args.quick else FULL
    args.images = preset["images"] if args.images is None else args.images
    args.texts = preset["texts"] if args.texts is None else args.texts
    args.repeats = preset["repeats"] if args.repeats is None else args.repeats
    args.timeout_s = preset["timeout_s"] if args.timeout_s is None else args.timeout_s
    args.litdata_rerun = args.litdata_rerun and args.repeats == 1 and "litdata" in args.writers
    args.workdir = os.path.abspath(args.workdir)
    # matplotlib keeps a font cache in ~/.cache unless told otherwise
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(args.workdir, "matplotlib"))
    args.out = args.out or os.path.join(HERE, *(("work", "results-quick") if args.quick else ("results",)), "map_writer.json")
    if args.report_only:
        with open(args.out) as f:
            record = json.load(f)
        finish(record, args.out)
        plot(record, plot_path(args.out))
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    started = time.time()
    record: dict[str, Any] = {
        "benchmark": "map_writer",
        "command": " ".join(["bench/bench_map_writer.py", *(argv if argv is not None else sys.argv[1:])]),
        "git_commit": git_commit(),
        "machine": machine(),
        "versions": versions(),
        "load_before": os.getloadavg()[0],
        "functions": args.functions,
        "writers": args.writers,
        "items": {"image": args.images, "text": args.texts},
        "photos": args.photos,
        "repeats": args.repeats,
        "per_shard": PER_SHARD,
        "litdata_chunk_bytes": LITDATA_CHUNK_BYTES,
        "timeout_s": args.timeout_s,
        "skipped": {},
        "cells": [],
    }

    def save() -> None:
        record["seconds"] = time.time() - started
        record["load_after"] = os.getloadavg()[0]
        finish(record, args.out)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the running cell and the Ray cluster are ended
    measure(args, record, save)
    save()
    plot(record, plot_path(args.out))
    sys.stdout.write("\n" + table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
