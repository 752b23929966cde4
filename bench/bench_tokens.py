"""Token blocks for language-model pretraining (issue #40): shardkit's
``ShardDataset(tokens=TokenBlocks(...))`` against LitData's ``TokensLoader``
and against packing documents in the training loop.

One corpus of synthetic documents (token ids drawn uniformly from a 50,000
vocabulary as uint16, lengths log-normal around 740 tokens; at least 5x10^7
tokens by default) is written twice: by ``shardkit.write_dataset`` (a
``tokens.npy`` field per document) and by ``litdata.optimize`` with a
``TokensLoader`` (chunks of 4,194,304 tokens, LitGPT's recipe), the latter in
LitData's own venv (``--litdata-python``, ``.venv-map`` from ``make bench-map``).

Readers, each cell in a fresh interpreter, a DataLoader with 1 and 2 workers
and batches of 8 blocks, at block sizes 2,048 and 8,192, one epoch:

- ``shardkit``: ``ShardDataset(dest, tokens=TokenBlocks("tokens.npy", B),
  batch_size=8)`` through ``make_loader``;
- ``litdata``: ``StreamingDataset(dest, item_loader=TokensLoader(B),
  shuffle=True)`` through ``StreamingDataLoader(batch_size=8)``;
- ``shardkit-int32``: the same with ``TokenBlocks(..., dtype=torch.int32)``
  (the ids as LitData hands them over: half the bytes of int64);
- ``litdata-long``: LitData's loader with each batch made int64 by
  ``.long()`` in the loop, as LitGPT's ``pretrain.py`` does (there after the
  copy to the GPU, where it is nearly free; here on the CPU);
- ``naive``: ``ShardDataset`` yielding each document's ids (decoded in the
  workers), packed into blocks in the training loop, as users do today (a
  tenth of the epoch: its rate is what counts);
- ``handoff``: a DataLoader whose workers read nothing and only make each
  int64 batch (in shared memory, as ``default_collate`` does) and hand it
  over: the ceiling any reader through torch's DataLoader meets here.

Like is set against like: shardkit's int64 blocks against ``litdata-long``,
its int32 blocks against ``litdata``.

Reported: tokens per second (tokens delivered / seconds from ``iter()`` to the
last batch), and each worker's private memory (USS) halfway. Memory against
corpus size: ``shardkit`` over 10^7, 10^8 and 10^9 tokens (the two larger ones
one real shard hard-linked under every name, with a manifest whose token
counts say so), 400 batches read from each with a read-ahead of 4 MB (a
worker's share of the smallest corpus would not fill the default 32 MB).

Shuffle: blocks mixed after packing (what the reader does) against no block
buffer (shard order only) and documents mixed before packing (the sample
reader's buffer, then packing in the loop), by ``shardkit.shuffle_quality``
over the shard each block's first token comes from (1.0 is as mixed as an
i.i.d. order).

Writes ``bench/results/tokens.{json,md,png}``; ``--quick`` writes under
``bench/work`` a small run's record.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import tokens_batches  # noqa: E402
from bench.common import answer_cell, bench_parser, git_commit, machine, publish_run, run_cell  # noqa: E402

CELL_ANSWER = "@@bench-tokens "
VOCAB = 50_000
LITDATA_CHUNK_TOKENS = 8192 * 512
BATCH = 8
FULL = {"batches": tokens_batches.FULL, "tokens": 50_000_000, "block_sizes": (2048, 8192), "workers": (1, 2), "repeats": 3,
        "memory_tokens": (10**7, 10**8, 10**9)}  # fmt: skip
QUICK = {"batches": tokens_batches.QUICK, "tokens": 3_000_000, "block_sizes": (2048,), "workers": (1, 2), "repeats": 1, "memory_tokens": (10**7, 10**8)}
#: Shards of the dataset the open cell opens (synthetic metadata).
OPEN_SHARDS = 500_000
#: Read-ahead of the memory cells: below a worker's share of the smallest
#: corpus (10^7 tokens, 20 MB), so every size fills it (the default, 32 MB,
#: would not fill at 10^7 and grow the figure with the corpus).
MEMORY_READ_AHEAD = 4 << 20
#: Documents a shard of the memory cells' corpus (~14 shards at 10^7 tokens:
#: each worker's share spans several, as at every larger size).
MEMORY_SHARD_DOCUMENTS = 1000
TARGETS = {"per_worker_vs_litdata": 1.0, "tokens_per_s_2_workers": 2e7}


# ------------------------------------------------------------------ the corpus


def _draw_length(rng: np.random.Generator) -> int:
    return max(1, int(rng.lognormal(6.2, 0.9)))


def doc_length(i: int) -> int:
    return _draw_length(np.random.default_rng(i))


def token_ids(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.integers(0, VOCAB, _draw_length(rng), dtype=np.uint16)


def shardkit_document(i: int) -> dict[str, Any]:
    """The map writer's function: one document's ids under ``tokens.npy``."""
    return {"__key__": f"d{i:08d}", "tokens.npy": token_ids(i)}


def litdata_document(i: int) -> Any:
    """``litdata.optimize``'s function: one document's ids as a tensor."""
    import torch

    return torch.from_numpy(token_ids(i).astype(np.int32))


def documents_for(tokens: int) -> int:
    """How many documents hold at least ``tokens`` tokens."""
    total = n = 0
    while total < tokens:
        total += doc_length(n)
        n += 1
    return n


def write_shardkit(dest: str, count: int, per_shard: int | None = None) -> float:
    import shardkit

    started = time.perf_counter()
    options = shardkit.WriteOptions(workers=2, max_samples=per_shard)
    shardkit.write_dataset(range(count), dest, map=shardkit_document, options=options)
    return time.perf_counter() - started


def write_litdata(dest: str, count: int) -> dict[str, Any]:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    started = time.perf_counter()
    litdata.optimize(fn=litdata_document, inputs=list(range(count)), output_dir=dest, chunk_size=LITDATA_CHUNK_TOKENS,
                     item_loader=TokensLoader(), num_workers=2, verbose=False)  # fmt: skip
    return {"seconds": time.perf_counter() - started, "version": litdata.__version__}


# ------------------------------------------------------------------ the cells


def _memory_of_workers() -> list[dict[str, float]]:
    from bench.bench_scale import worker_pids
    from bench.harness.memory import smaps

    return [smaps(pid) for pid in worker_pids()]


def _blocks(documents: Any, block_size: int) -> Any:
    """Documents' ids packed into blocks in the loop (the naive way)."""
    parts: list[np.ndarray] = []
    held = 0
    for doc in documents:
        parts.append(doc.numpy() if hasattr(doc, "numpy") else doc)
        held += len(parts[-1])
        if held >= block_size:
            joined = np.concatenate(parts)
            cut = len(joined) // block_size * block_size
            yield from joined[:cut].reshape(-1, block_size)
            parts, held = [joined[cut:]], len(joined) - cut


def _packed(documents: Any, block_size: int) -> Any:
    """:func:`_blocks` in batches of :data:`BATCH`, as int64 tensors."""
    import torch

    batch: list[np.ndarray] = []
    for block in _blocks(documents, block_size):
        batch.append(block)
        if len(batch) == BATCH:
            yield torch.from_numpy(np.stack(batch).astype(np.int64))
            batch = []


def _doc_ids(sample: dict[str, Any]) -> np.ndarray:
    return np.load(io.BytesIO(sample["tokens.npy"]), allow_pickle=False)


class _Handoff(torch.utils.data.IterableDataset):
    """An iterable dataset of ``count`` int64 batches made from one block
    and no reading (the ``handoff`` tool): what is left is the DataLoader's
    part."""

    def __init__(self, count: int, block_size: int):
        super().__init__()
        self.count, self.block_size = count, block_size

    def __iter__(self) -> Any:
        from torch.utils.data import get_worker_info

        from shardkit.read.block_output import stack_blocks

        info = get_worker_info()
        share = range(info.id, self.count, info.num_workers) if info else range(self.count)
        row = token_ids(0)[:1].repeat(self.block_size)
        for _ in share:
            yield stack_blocks([row] * BATCH)


def open_loader(spec: dict[str, Any]) -> Any:
    tool, block, workers = spec["tool"], spec["block_size"], spec["workers"]
    if tool in ("litdata", "litdata-long"):
        import litdata
        from litdata.streaming.item_loader import TokensLoader

        ds = litdata.StreamingDataset(spec["dest"], item_loader=TokensLoader(block_size=block), shuffle=True, seed=0)
        loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
        return loader if tool == "litdata" else (batch.long() for batch in loader)
    import torch

    import shardkit

    if tool in ("shardkit", "shardkit-int32"):
        ahead = spec.get("read_ahead_bytes", 32 << 20)  # shardkit's default
        dtype = torch.int32 if tool == "shardkit-int32" else torch.int64
        blocks = shardkit.TokenBlocks("tokens.npy", block, dtype=dtype)
        ds = shardkit.ShardDataset(spec["dest"], tokens=blocks, seed=0, batch_size=BATCH, read_ahead_bytes=ahead)
        return shardkit.make_loader(ds, batch_size=None, num_workers=workers)
    if tool == "handoff":
        return torch.utils.data.DataLoader(_Handoff(spec["expected_batches"], block), batch_size=None,
                                           num_workers=workers)  # fmt: skip
    ds = shardkit.ShardDataset(spec["dest"], seed=0, map=_doc_ids)
    return _packed(shardkit.make_loader(ds, batch_size=None, num_workers=workers), block)


def read_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch (or ``max_batches``) through one tool's loader."""
    loader = open_loader(spec)
    limit = spec.get("max_batches")
    expected = spec.get("expected_batches")
    tokens = batches = 0
    memory: list[dict[str, float]] = []
    start = time.perf_counter()
    paused = 0.0
    for batch in loader:
        tokens += batch.numel()
        batches += 1
        halfway = (limit or expected or 0) // 2
        if not memory and spec["workers"] and batches >= max(halfway, 1):
            began = time.perf_counter()
            memory = _memory_of_workers()
            paused += time.perf_counter() - began
        if limit is not None and batches >= limit:
            break
    seconds = time.perf_counter() - start - paused
    return {"tokens": tokens, "batches": batches, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "worker_uss_mb": statistics.fmean(m["uss_mb"] for m in memory) if memory else None,
            "worker_dirty_mb": statistics.fmean(m["private_dirty_mb"] for m in memory) if memory else None}  # fmt: skip


def shuffle_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """``shuffle_quality`` of the shard each block starts in, per way of mixing."""
    import shardkit
    from shardkit import TokenBlocks

    dest, block = spec["dest"], spec["block_size"]
    starts = shard_of_document(dest)
    out = {}
    for name, buffer in (("blocks after packing", spec["buffer_size"]), ("no block buffer", 1)):
        ds = shardkit.ShardDataset(dest, tokens=TokenBlocks("tokens.npy", block), seed=0, buffer_size=buffer,
                                   mode="exact")  # fmt: skip
        labels = [starts[int(b[0]) // STRIDE] for b in ds]
        out[name] = shardkit.shuffle_quality(labels, batch_size=BATCH)
    docs = shardkit.ShardDataset(dest, seed=0, buffer_size=spec["buffer_size"], map=_doc_ids, mode="exact")
    labels = [starts[int(b[0]) // STRIDE] for b in _blocks(iter(docs), block)]
    out["documents before packing"] = shardkit.shuffle_quality(labels, batch_size=BATCH)
    return out


#: Token ids of the shuffle corpus: document ``i``'s ids start at ``i * STRIDE``.
STRIDE = 1 << 20


def labelled_document(i: int) -> dict[str, Any]:
    """A document of the shuffle corpus: its ids tell the document."""
    return {"__key__": f"d{i:08d}", "tokens.npy": i * STRIDE + np.arange(doc_length(i), dtype=np.int64)}


def shard_of_document(dest: str) -> dict[int, int]:
    """The shard each document of the shuffle corpus is stored in."""
    import shardkit

    ds = shardkit.ShardDataset(dest, shuffle=False, mode="exact")
    ends = np.cumsum(ds.catalog.counts)
    return {int(s["__key__"][1:]): int(np.searchsorted(ends, n, side="right")) for n, s in enumerate(ds)}


def write_labelled(dest: str, count: int) -> None:
    import shardkit

    shardkit.write_dataset(range(count), dest, map=labelled_document,
                           options=shardkit.WriteOptions(workers=2, max_samples=200))  # fmt: skip


def open_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Open a token dataset of ``shards`` shards (synthetic metadata: a
    table with token counts, no shard files) and plan its first epoch:
    seconds and the growth of the process's private memory (issue #22's bar)."""
    from bench.harness.memory import smaps
    from shardkit.format.manifest import MANIFEST_NAME, Manifest
    from shardkit.format.table_writer import write_shard_table

    import shardkit

    folder, n = spec["dest"], spec["shards"]
    if not os.path.exists(os.path.join(folder, MANIFEST_NAME)):
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng(0)
        counts = rng.integers(1000, 3000, n)
        tokens = (counts * rng.integers(500, 1000, n))[:, None]
        table = write_shard_table(folder, counts, counts * 2048, np.zeros((n, 32), dtype=np.uint8), tokens=tokens)
        manifest = Manifest.from_table(table, source={"format": "synthetic"}, stored_fingerprint="0" * 64,
                                       token_fields=("tokens.npy",))  # fmt: skip
        with open(os.path.join(folder, MANIFEST_NAME), "w") as f:
            f.write(manifest.to_json())
    shardkit.ShardDataset, shardkit.TokenBlocks  # the library's code (and torch) loaded before the baseline
    before = smaps(os.getpid())["uss_mb"]
    started = time.perf_counter()
    ds = shardkit.ShardDataset(folder, tokens=shardkit.TokenBlocks("tokens.npy", 2048), seed=0)
    blocks = len(ds)
    ds._mixture.catalogs[0].stream(0)  # the first epoch's order and running totals, as a read plans it
    seconds = time.perf_counter() - started
    return {"shards": n, "seconds": seconds, "uss_growth_mb": smaps(os.getpid())["uss_mb"] - before, "blocks": blocks}


CELLS = {"read": read_cell, "shuffle": shuffle_cell, "open": open_cell, **tokens_batches.CELLS}


def write_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Write one corpus (in the interpreter the writer needs)."""
    if spec["writer"] == "litdata":
        return write_litdata(spec["dest"], spec["documents"])
    if spec["writer"] == "labelled":
        write_labelled(spec["dest"], spec["documents"])
        return {}
    return {"seconds": write_shardkit(spec["dest"], spec["documents"], spec.get("per_shard"))}


CELLS["write"] = write_cell


# ------------------------------------------------------------------ corpora


def ensure_corpus(args: argparse.Namespace, writer: str, tokens: int, per_shard: int | None = None) -> dict[str, Any]:
    """The corpus of ``tokens`` tokens as ``writer`` writes it (``per_shard``
    documents a shard, else the writer's default size), built once and reused."""
    dest = os.path.join(args.workdir, f"{writer}-{tokens}" + (f"-{per_shard}" if per_shard else ""))
    log = dest + ".json"
    if os.path.exists(log):
        with open(log) as f:
            return json.load(f)
    count = documents_for(tokens)
    spec = {"writer": writer, "dest": dest, "documents": count, "per_shard": per_shard}
    python = args.litdata_python if writer == "litdata" else sys.executable
    env = {**os.environ, "DATA_OPTIMIZER_CACHE_FOLDER": os.path.join(args.workdir, "litdata-cache", "chunks"),
           "DATA_OPTIMIZER_DATA_CACHE_FOLDER": os.path.join(args.workdir, "litdata-cache", "data")}  # fmt: skip
    built = run_cell(__file__, spec, answer=CELL_ANSWER, python=python, timeout_s=args.timeout_s * 4, env=env)
    if "error" in built:
        raise SystemExit(f"writing the {writer} corpus failed: {built['error']}\n{built.get('stderr_tail', '')}")
    out = {**built, "dest": dest, "documents": count, "tokens": sum(doc_length(i) for i in range(count))}
    with open(log, "w") as f:
        json.dump(out, f)
    return out


def linked_corpus(args: argparse.Namespace, base: dict[str, Any], copies: int) -> dict[str, Any]:
    """``base``'s shards hard-linked ``copies`` times under new names, with
    a manifest and table that count them (tokens included): a corpus
    ``copies`` times as large on the disk of one."""
    from shardkit.format.manifest import load_manifest
    from shardkit.format.table import build_table
    from shardkit.format.manifest import Manifest
    from shardkit.write.publish import publish_manifest

    dest = os.path.join(args.workdir, f"linked-{base['tokens'] * copies}-{os.path.basename(base['dest'])}")
    if os.path.exists(os.path.join(dest, "manifest.json")):
        return {"dest": dest, "tokens": base["tokens"] * copies}
    manifest = load_manifest(base["dest"])
    table = manifest.table
    n = table.num_shards
    os.makedirs(dest, exist_ok=True)
    for copy in range(copies):
        for shard in range(n):
            number = copy * n + shard
            for name, target in ((table.path(shard), f"shard-{number:06d}.tar"),
                                 (table.index_path(shard), f"shard-{number:06d}.idx")):  # fmt: skip
                os.link(os.path.join(base["dest"], name), os.path.join(dest, target))
    big = build_table(np.tile(table.counts, copies), np.tile(table.num_bytes, copies), np.tile(table.sha256, (copies, 1)),
                      tokens=np.tile(table.tokens, (copies, 1)))  # fmt: skip
    fields = {"extensions": manifest.extensions, "token_fields": manifest.token_fields}
    publish_manifest(dest, Manifest.from_table(big, source={"format": "synthetic", "copies": copies}, **fields))
    return {"dest": dest, "tokens": base["tokens"] * copies}


# ------------------------------------------------------------------ the run


def measure(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {"commit": git_commit(), "machine": machine(), "preset": preset, "cells": [],
                              "memory": [], "shuffle": {}, "skipped": {}}  # fmt: skip
    shardkit_corpus = ensure_corpus(args, "shardkit", preset["tokens"])

    def run(spec: dict[str, Any]) -> dict[str, Any]:
        done = run_cell(__file__, spec, answer=CELL_ANSWER, python=sys.executable, timeout_s=args.timeout_s)
        print(json.dumps({**spec, **done}), flush=True)
        return done

    record["batches"] = tokens_batches.measure_batches(args, preset, run, ensure_corpus, shardkit_corpus["dest"])
    if args.only_batches:
        # The batches measured again into the last full record (its other parts kept as they were).
        last = os.path.join("bench", "results", "tokens.json")
        if not args.quick and os.path.exists(last):
            with open(last) as f:
                record = {**json.load(f), "batches": record["batches"], "batches_commit": record["commit"]}
        record["targets"] = targets(record)
        return record
    tools = ["shardkit", "shardkit-int32", "naive", "handoff"]
    litdata_corpus = None
    if os.path.exists(args.litdata_python):
        litdata_corpus = ensure_corpus(args, "litdata", preset["tokens"])
        tools[2:2] = ["litdata-long", "litdata"]
    else:
        record["skipped"]["litdata"] = f"{args.litdata_python} not found (`make bench-map` makes .venv-map)"
    record["corpus"] = {"shardkit": shardkit_corpus, "litdata": litdata_corpus}
    for block in preset["block_sizes"]:
        for workers in preset["workers"]:
            runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
            for _ in range(preset["repeats"]):
                for tool in tools:
                    corpus = litdata_corpus if tool.startswith("litdata") else shardkit_corpus
                    batches = corpus["tokens"] // block // BATCH
                    spec = {"cell": "read", "tool": tool, "dest": corpus["dest"], "block_size": block,
                            "workers": workers, "expected_batches": batches}  # fmt: skip
                    if tool == "naive":  # ~20x slower: a tenth of the epoch gives its rate
                        spec["max_batches"] = max(batches // 10, 1)
                    python = args.litdata_python if tool.startswith("litdata") else sys.executable
                    runs[tool].append(run_cell(__file__, spec, answer=CELL_ANSWER, python=python,
                                               timeout_s=args.timeout_s))  # fmt: skip
            for tool, done in runs.items():
                cell = summarise(tool, block, workers, done)
                record["cells"].append(cell)
                print(json.dumps(cell), flush=True)
    base = ensure_corpus(args, "shardkit", preset["memory_tokens"][0], per_shard=MEMORY_SHARD_DOCUMENTS)
    for tokens in preset["memory_tokens"]:
        corpus = base if tokens == preset["memory_tokens"][0] else linked_corpus(args, base, tokens // preset["memory_tokens"][0])
        spec = {"cell": "read", "tool": "shardkit", "dest": corpus["dest"], "block_size": 2048, "workers": 2,
                "max_batches": 400, "read_ahead_bytes": MEMORY_READ_AHEAD}  # fmt: skip
        done = run_cell(__file__, spec, answer=CELL_ANSWER, python=sys.executable, timeout_s=args.timeout_s)
        record["memory"].append({**done, "corpus_tokens": corpus["tokens"]})
        print(json.dumps(record["memory"][-1]), flush=True)
    spec = {"cell": "open", "dest": os.path.join(args.workdir, f"open-{OPEN_SHARDS}"), "shards": OPEN_SHARDS}
    record["open"] = run_cell(__file__, spec, answer=CELL_ANSWER, python=sys.executable, timeout_s=args.timeout_s)
    print(json.dumps(record["open"]), flush=True)
    labelled = ensure_corpus(args, "labelled", min(preset["tokens"], 5_000_000))
    spec = {"cell": "shuffle", "dest": labelled["dest"], "block_size": 2048, "buffer_size": 100}
    record["shuffle"] = run_cell(__file__, spec, answer=CELL_ANSWER, python=sys.executable, timeout_s=args.timeout_s * 2)
    print(json.dumps(record["shuffle"]), flush=True)
    record["targets"] = targets(record)
    return record


def summarise(tool: str, block: int, workers: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if "error" not in r]
    cell: dict[str, Any] = {"tool": tool, "block_size": block, "workers": workers, "runs": len(runs)}
    if not good:
        return {**cell, "error": runs[-1].get("error", "not run")}
    rates = sorted(r["tokens_per_s"] for r in good)
    memory = [r["worker_uss_mb"] for r in good if r["worker_uss_mb"] is not None]
    dirty = [r["worker_dirty_mb"] for r in good if r.get("worker_dirty_mb") is not None]
    return {**cell, "tokens_per_s": statistics.median(rates), "range": [rates[0], rates[-1]],
            "tokens": good[-1]["tokens"], "worker_uss_mb": statistics.median(memory) if memory else None,
            "worker_dirty_mb": statistics.median(dirty) if dirty else None}  # fmt: skip


def _find(record: dict[str, Any], tool: str, block: int, workers: int) -> dict[str, Any] | None:
    for cell in record["cells"]:
        if (cell["tool"], cell["block_size"], cell["workers"]) == (tool, block, workers) and "tokens_per_s" in cell:
            return cell
    return None


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for block in record["preset"]["block_sizes"]:
        for workers in record["preset"]["workers"]:
            for mine, theirs, what in (("shardkit", "litdata-long", "int64"), ("shardkit-int32", "litdata", "int32")):
                ours, peer = _find(record, mine, block, workers), _find(record, theirs, block, workers)
                if ours and peer:
                    ratio = ours["tokens_per_s"] / peer["tokens_per_s"]
                    out.append({"target": f"shardkit / LitData tokens/s, {what} out, block {block}, {workers} workers",
                                "value": ratio, "limit": TARGETS["per_worker_vs_litdata"], "met": ratio >= 1.0})  # fmt: skip
        ours, ceiling = _find(record, "shardkit", block, 2), _find(record, "handoff", block, 2)
        if ours:
            where = f" (the DataLoader's hand-off alone: {ceiling['tokens_per_s'] / 1e6:.1f} M)" if ceiling else ""
            out.append({"target": f"shardkit tokens/s, block {block}, 2 workers{where}", "value": ours["tokens_per_s"],
                        "limit": TARGETS["tokens_per_s_2_workers"], "unit": "tokens/s",
                        "met": ours["tokens_per_s"] >= TARGETS["tokens_per_s_2_workers"]})  # fmt: skip
    if "batches" in record:
        out += tokens_batches.batches_targets(record["batches"], tuple(record["preset"]["block_sizes"]))
    opened = record.get("open", {})
    if "seconds" in opened:
        out.append({"target": f"open {opened['shards']:,} token shards", "value": opened["seconds"], "unit": " s",
                    "limit": 1.0, "met": opened["seconds"] <= 1.0})  # fmt: skip
        out.append({"target": f"open {opened['shards']:,} token shards, memory", "value": opened["uss_growth_mb"],
                    "unit": " MB", "limit": 50, "met": opened["uss_growth_mb"] <= 50})  # fmt: skip
    memory = [m["worker_uss_mb"] for m in record["memory"] if m.get("worker_uss_mb")]
    if len(memory) >= 2:
        growth = memory[-1] / memory[0]
        out.append({"target": "worker memory, largest corpus / smallest", "value": growth, "limit": 1.2,
                    "met": growth <= 1.2})  # fmt: skip
    return out


def markdown(record: dict[str, Any]) -> str:
    lines = ["# Token blocks: shardkit vs LitData's TokensLoader vs packing in the loop", "",
             f"At commit {record['commit']}, {record['machine']['cpus']} CPUs. " + __doc__.split("\n\n")[1].replace("\n", " "),
             "", "Worker memory: USS (private: it also counts a shard file's pages that this worker alone maps, "
             "which the page cache holds) and its written part, Private_Dirty.", "",
             "| block | workers | tool | tokens/s (median) | range | worker USS MB | worker Private_Dirty MB |",
             "| ---: | ---: | --- | ---: | --- | ---: | ---: |"]  # fmt: skip
    for c in record["cells"]:
        if "tokens_per_s" not in c:
            lines.append(f"| {c['block_size']} | {c['workers']} | {c['tool']} | error: {c.get('error')} | | | |")
            continue
        uss = "–" if c["worker_uss_mb"] is None else f"{c['worker_uss_mb']:.0f}"
        dirty = "–" if c.get("worker_dirty_mb") is None else f"{c['worker_dirty_mb']:.0f}"
        lines.append(f"| {c['block_size']:,} | {c['workers']} | {c['tool']} | {c['tokens_per_s'] / 1e6:.1f} M | "
                     f"{c['range'][0] / 1e6:.1f}-{c['range'][1] / 1e6:.1f} M | {uss} | {dirty} |")  # fmt: skip
    lines += ["", "## Worker memory against corpus size (shardkit, block 2,048, 2 workers, 400 batches, read-ahead 4 MB)", "",
              "| corpus tokens | worker USS MB | worker Private_Dirty MB | tokens/s |", "| ---: | ---: | ---: | ---: |"]  # fmt: skip
    for m in record["memory"]:
        uss = "–" if m.get("worker_uss_mb") is None else f"{m['worker_uss_mb']:.1f}"
        dirty = "–" if m.get("worker_dirty_mb") is None else f"{m['worker_dirty_mb']:.1f}"
        rate = f"{m['tokens_per_s'] / 1e6:.1f} M" if "tokens_per_s" in m else m.get("error", "")
        lines.append(f"| {m['corpus_tokens']:,} | {uss} | {dirty} | {rate} |")
    lines += ["", "## Shuffle (block 2,048, buffer of 100, batches of 8; 1.0 = i.i.d.)", "", "| mixing | shuffle_quality |",
              "| --- | ---: |"]  # fmt: skip
    for name, value in record["shuffle"].items():
        lines.append(f"| {name} | {value:.2f} |" if isinstance(value, float) else f"| {name} | {value} |")
    if "batches" in record:
        lines += tokens_batches.batches_markdown(record["batches"])
        if record.get("batches_commit"):
            lines += ["", f"(These batches measured again at commit {record['batches_commit']}, the rest as above.)"]
    lines += ["", "## Targets (issues #40 part 8, #55)", "", "| target | value | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in record["targets"]:
        unit = t.get("unit", "x")
        value = f"{t['value'] / 1e6:.1f} M" if unit == "tokens/s" else f"{t['value']:.2f}{unit}"
        limit = f"{t['limit'] / 1e6:.0f} M" if unit == "tokens/s" else f"{t['limit']}{unit}"
        lines.append(f"| {t['target']} | {value} | {limit} | {'yes' if t['met'] else 'no'} |")
    opened = record.get("open", {})
    if "seconds" in opened:
        lines += ["", f"Opening {opened['shards']:,} token shards (synthetic metadata) and planning an epoch: "
                  f"{opened['seconds']:.2f} s, +{opened['uss_growth_mb']:.1f} MB of private memory."]
    for tool, why in record["skipped"].items():
        lines.append(f"\nNot run: {tool}: {why}")
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    groups = [(b, w) for b in record["preset"]["block_sizes"] for w in record["preset"]["workers"]]
    order = ["shardkit", "shardkit-int32", "litdata-long", "litdata", "naive", "handoff"]
    tools = sorted({c["tool"] for c in record["cells"]}, key=order.index)
    width = 0.8 / max(len(tools), 1)
    for k, tool in enumerate(tools):
        values = [(_find(record, tool, b, w) or {}).get("tokens_per_s", 0) / 1e6 for b, w in groups]
        ax.bar([g + k * width for g in range(len(groups))], values, width, label=tool)
    ax.set_xticks([g + width * (len(tools) - 1) / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"block {b}\n{w} worker{'s' if w > 1 else ''}" for b, w in groups])
    ax.set_ylabel("million tokens / s")
    ax.set_title("Token blocks per second, one epoch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "tokens", quick_help="3x10^6 tokens, block 2,048, one repeat", timeout_s=600)
    parser.add_argument("--tokens", type=int, help="tokens of the corpus (default 5x10^7)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--litdata-python", default=os.path.join(".venv-map", "bin", "python"))
    parser.add_argument("--only-batches", action="store_true",
                        help="only the fine-tuning batches and boundaries (issue #55), into the last full record")
    args = parser.parse_args(argv)
    if answer_cell(args, CELL_ANSWER, lambda spec: CELLS[spec.get("cell", "write" if "writer" in spec else "read")](spec)):
        return 0
    preset = dict(QUICK if args.quick else FULL)
    if args.tokens:
        preset["tokens"] = args.tokens
    if args.repeats:
        preset["repeats"] = args.repeats
    os.makedirs(args.workdir, exist_ok=True)
    return publish_run(args, "tokens", measure(args, preset), markdown, plot)


if __name__ == "__main__":
    raise SystemExit(main())
