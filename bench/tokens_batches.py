"""The language-model batches of ``bench_tokens.py`` (issue #55).

**Padding.** A corpus of conversations (20,000 samples, 4,000 with
``--quick``; lengths log-normal, ``exp(N(5.5, 0.9))`` tokens, median ~245,
mean ~370, cut to 4,096) read in batches of about 8,192 tokens, 2 workers,
one epoch each:

- ``fixed``: 16 samples a batch (the mean batch holds ~5,900 real tokens),
  padded to the longest (``ShardDataset(batch_size=16)`` and a padding
  collate);
- ``budget``: ``TokenBudget("tokens.npy", 8192)``;
- ``budget, grouped``: the same with ``group_by_length=True``;
- ``packed``: ``PackedSamples("tokens.npy", 4096)``, batches of 2 sequences;
- ``hf grouped``: the Hugging Face ``Trainer``'s ``LengthGroupedSampler``
  (its mega-batches of 50 batches sorted by length) over an
  ``IndexedDataset``, 16 samples a batch, padded to the longest.

Reported: the padding fraction (padding cells / all cells) and real
(non-padding) tokens/s.

**Cost of boundaries.** ``TokenBlocks`` with and without
``boundaries=True`` over the token corpus, batches of 8, 2 workers, at
block sizes 2,048 and 8,192: tokens/s; and ``boundaries, in workers``,
their ``position_ids`` made in the workers and handed over in shared memory
at every size (``block_output.LAID_FROM_TOKENS`` out of reach), against
made where a batch lands from 65,536 tokens.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import numpy as np

FULL = {"conversations": 20_000, "budget": 8192, "fixed_batch": 16}
QUICK = {"conversations": 4_000, "budget": 8192, "fixed_batch": 16}
WAYS = ("fixed", "budget", "budget, grouped", "packed", "hf grouped")
BLOCKS_A_BATCH = 8


def conversation_length(i: int) -> int:
    return int(min(max(np.random.default_rng(i).lognormal(5.5, 0.9), 1), 4096))


def conversation(i: int) -> dict[str, Any]:
    n = conversation_length(i)
    return {"__key__": f"c{i:07d}", "tokens.npy": np.random.default_rng(i).integers(0, 50_000, n, dtype=np.uint16)}


def write_conversations(dest: str, count: int) -> None:
    import shardkit

    shardkit.write_dataset(range(count), dest, map=conversation, options=shardkit.WriteOptions(workers=2, max_samples=2000))


def _pad(samples: list[dict[str, Any]]) -> dict[str, Any]:
    from shardkit.read.budget import pad_collate

    return pad_collate(samples, field="tokens.npy")


def _loader(spec: dict[str, Any]) -> Any:
    import torch

    import shardkit

    way, dest = spec["way"], spec["dest"]
    if way == "fixed":
        ds = shardkit.ShardDataset(dest, seed=0, batch_size=spec["fixed_batch"], collate=_pad)
    elif way.startswith("budget"):
        budget = shardkit.TokenBudget("tokens.npy", spec["budget"], group_by_length=way.endswith("grouped"))
        ds = shardkit.ShardDataset(dest, seed=0, tokens=budget)
    elif way == "packed":
        ds = shardkit.ShardDataset(dest, seed=0, tokens=shardkit.PackedSamples("tokens.npy", spec["budget"] // 2),
                                   batch_size=2)  # fmt: skip
    elif way == "hf grouped":
        from transformers.trainer_pt_utils import LengthGroupedSampler

        indexed = shardkit.IndexedDataset(dest)
        lengths = shardkit.token_counts(dest, "tokens.npy").tolist()
        sampler = LengthGroupedSampler(spec["fixed_batch"], lengths=lengths, generator=torch.Generator().manual_seed(0))
        batches = torch.utils.data.BatchSampler(sampler, spec["fixed_batch"], drop_last=False)
        return torch.utils.data.DataLoader(indexed, batch_sampler=batches, num_workers=2, collate_fn=_pad)
    elif way.startswith("blocks"):
        if way.endswith("in workers"):
            from shardkit.read import block_output

            block_output.LAID_FROM_TOKENS = sys.maxsize  # the workers (forked) inherit it
        blocks = shardkit.TokenBlocks("tokens.npy", spec["block_size"], boundaries="boundaries" in way)
        ds = shardkit.ShardDataset(dest, seed=0, tokens=blocks, batch_size=BLOCKS_A_BATCH)
    else:
        raise ValueError(way)
    return shardkit.make_loader(ds, batch_size=None, num_workers=2)


def batches_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch of one way of batching: padding fraction and real tokens/s."""
    loader = _loader(spec)
    real = cells = batches = 0
    started = time.perf_counter()
    for batch in loader:
        if isinstance(batch, dict) and "attention_mask" in batch:
            real += int(batch["attention_mask"].sum())
            cells += batch["attention_mask"].numel()
        elif isinstance(batch, dict):  # packed sequences or blocks with boundaries
            keys = batch.get("__key__")
            tokens = batch["tokens"]
            cells += tokens.numel()
            if keys is not None:  # the parts before the padding one are the samples
                real += sum(int(batch["seq_lens"][row, : len(k)].sum()) for row, k in enumerate(keys))
            else:
                real += tokens.numel()
        else:
            real += batch.numel()
            cells += batch.numel()
        batches += 1
    seconds = time.perf_counter() - started
    return {"batches": batches, "real_tokens": real, "cells": cells, "seconds": seconds,
            "padding": 1 - real / cells if cells else 0.0, "tokens_per_s": real / seconds}  # fmt: skip


CELLS = {"batches": batches_cell}


def measure_batches(args: Any, preset: dict[str, Any], run: Any, ensure: Any, token_corpus: str) -> dict[str, Any]:
    """The padding and boundaries cells (``run(spec)`` runs one in a fresh interpreter)."""
    sizes = preset["batches"]
    dest = os.path.join(args.workdir, f"conversations-{sizes['conversations']}")
    if not os.path.exists(os.path.join(dest, "manifest.json")):
        write_conversations(dest, sizes["conversations"])
    out: dict[str, Any] = {"padding": {}, "boundaries": {}}
    for _ in range(preset["repeats"]):
        for way in WAYS:
            out["padding"].setdefault(way, []).append(run({"cell": "batches", "way": way, "dest": dest, **sizes}))
        for block in preset["block_sizes"]:
            for way in ("blocks", "blocks, boundaries", "blocks, boundaries, in workers"):
                spec = {"cell": "batches", "way": way, "dest": token_corpus, "block_size": block}
                out["boundaries"].setdefault(f"{way}, {block}", []).append(run(spec))
    return out


def _median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else float("nan")


def batches_targets(out: dict[str, Any], block_sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    from shardkit.read.block_output import LAID_FROM_TOKENS

    rows = []
    fixed = _median(out["padding"]["fixed"], "tokens_per_s")
    for way in ("budget, grouped", "packed"):
        pad = _median(out["padding"][way], "padding")
        rows.append({"target": f"padding, {way}", "value": pad, "unit": "", "limit": 0.05, "met": pad < 0.05})
        ratio = _median(out["padding"][way], "tokens_per_s") / fixed
        rows.append({"target": f"real tokens/s, {way} / fixed-count", "value": ratio, "limit": 0.9, "met": ratio >= 0.9})
    for block in block_sizes:
        ratio = (_median(out["boundaries"][f"blocks, boundaries, {block}"], "tokens_per_s")
                 / _median(out["boundaries"][f"blocks, {block}"], "tokens_per_s"))  # fmt: skip
        rows.append({"target": f"tokens/s with boundaries / without, block {block}", "value": ratio, "limit": 0.9,
                     "met": ratio >= 0.9})  # fmt: skip
        if block * BLOCKS_A_BATCH >= LAID_FROM_TOKENS:  # the mechanism earns its place (3%) where it acts
            landed = _median(out["boundaries"][f"blocks, boundaries, {block}"], "tokens_per_s")
            ratio = landed / _median(out["boundaries"][f"blocks, boundaries, in workers, {block}"], "tokens_per_s")
            rows.append({"target": f"boundaries made where a batch lands / in the workers, block {block}",
                         "value": ratio, "limit": 1.03, "met": ratio >= 1.03})  # fmt: skip
    return rows


def batches_markdown(out: dict[str, Any]) -> list[str]:
    lines = ["", "## Batches for fine-tuning (issue #55)", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| batching | padding | real tokens/s (median) | batches |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for way, runs in out["padding"].items():
        lines.append(f"| {way} | {_median(runs, 'padding'):.1%} | {_median(runs, 'tokens_per_s') / 1e6:.2f} M | "
                     f"{_median(runs, 'batches'):.0f} |")  # fmt: skip
    cost = next(p for p in __doc__.split("\n\n") if p.startswith("**Cost of boundaries"))
    lines += ["", cost.replace("\n", " "), "", "| token blocks | tokens/s (median) |", "| --- | ---: |"]
    for way, runs in out["boundaries"].items():
        lines.append(f"| {way} | {_median(runs, 'tokens_per_s') / 1e6:.2f} M |")
    return lines
