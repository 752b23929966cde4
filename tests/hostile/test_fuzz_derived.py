"""Fuzzing views and extensions (issue #54): their rows tables and manifests
are data someone else may have written.

A pool (two of its samples removed), an extension of it, a view of the
extension keeping a few samples per shard (rows that list what they keep), a
view keeping most (rows that list what they leave out) and a view of that
view. Then one seeded mutation at a time of one derived dataset, published as
a crafted one would be (its rows table under its content name, the manifest
pinned to it, the fingerprint recomputed): a column's values (parents, parent
shards, counts, kinds, offsets, positions, removals) changed, swapped, made
huge or negative; the table's bytes flipped, cut short or grown; the
manifest's fields (parents' paths and fingerprints, kind, fields).

Each mutated dataset is read whole (``ShardDataset``, exact mode; and
``IndexedDataset``, every index) in a child under a memory cap. What must
hold: no exception outside shardkit's error tree, no hang, nothing past the
cap, and every sample yielded is one of the pool's, with its bytes, and never
a removed one (a crafted row naming a removed sample, or one its parent view
leaves out, is an error, not a sample).

``pytest tests/hostile/test_fuzz_derived.py --fuzz-mutations 2000 -s`` runs
more (the default runs a tenth of ``--fuzz-mutations``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import random
import shutil
import traceback

import numpy as np
import pytest

import shardkit
from shardkit import IndexedDataset, ShardDataset
from shardkit.errors import ShardkitError
from shardkit.format.derived import build_rows
from shardkit.format.manifest import load_manifest
from shardkit.revise.derived_publish import publish_derived
from tests.conftest import build_dataset
from tests.hostile.conftest import print_outcomes, run_fuzz
from tests.hostile.test_fuzz import Hang, deadline
from tests.revise import derived_maps

READ_TIMEOUT_S = 20
MEM_MB = 768
CHILD_TIMEOUT_S = 240
DERIVED = ("ext", "few", "most", "most-few")
_COLUMNS = ("parent", "parent_row", "counts", "select_kind", "select_offsets", "select_positions", "removed")


def _digest(sample: dict) -> str:
    return hashlib.sha256(json.dumps({k: hashlib.sha256(bytes(v)).hexdigest() for k, v in sorted(sample.items())
                                      if not k.startswith("__")}).encode()).hexdigest()  # fmt: skip


def _mutated_column(values: np.ndarray, rng: random.Random) -> np.ndarray:
    out = np.array(values, dtype=np.int64 if values.dtype != np.uint64 else np.uint64)
    if not len(out):
        return np.array([rng.choice([0, 1, 2**31, 2**40])], dtype=out.dtype)
    i = rng.randrange(len(out))
    how = rng.choice(("plus", "minus", "huge", "zero", "swap", "drop", "dup", "negative"))
    if how == "plus":
        out[i] += rng.choice((1, 2, 7, 1000))
    elif how == "minus" and out[i] > 0:
        out[i] -= 1
    elif how == "huge":
        out[i] = rng.choice((2**32 - 1, 2**31, 2**62)) if out.dtype != np.uint64 else np.uint64(2**63 + 5)
    elif how == "zero":
        out[i] = 0
    elif how == "swap" and len(out) > 1:
        j = rng.randrange(len(out))
        out[i], out[j] = out[j], out[i]
    elif how == "drop":
        out = np.delete(out, i)
    elif how == "dup":
        out = np.insert(out, i, out[i])
    elif how == "negative" and out.dtype != np.uint64:
        out[i] = -rng.choice((1, 5, 2**40))
    return out


def _mutate(folder: str, rng: random.Random) -> str:
    """One seeded mutation of the derived dataset in ``folder``; says which."""
    manifest = load_manifest(folder)
    rows = manifest.rows
    kind = rng.choice(("column", "column", "column", "bytes", "manifest"))
    if kind == "column":
        name = rng.choice(_COLUMNS)
        columns = {c: (None if rows.columns.get(c) is None else np.asarray(rows.columns[c])) for c in _COLUMNS}
        if name == "removed" and columns["removed"] is None:
            columns["removed"] = np.array([rng.randrange(2**40)], dtype=np.uint64)
        else:
            columns[name] = _mutated_column(columns[name], rng)
        clip = {"parent": (-(2**31), 2**31 - 1), "select_kind": (0, 255), "select_positions": (0, 2**32 - 1)}
        if name in clip:
            columns[name] = np.clip(columns[name], *clip[name])
        try:
            mutated = build_rows(*(columns[c] for c in _COLUMNS))
        except (ValueError, OverflowError):
            return "column (unbuildable)"
        publish_derived(folder, dataclasses.replace(manifest, rows=mutated))
        return f"column {name}"
    if kind == "bytes":
        data = bytearray(rows.encode())
        how = rng.choice(("flip", "cut", "grow"))
        if how == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif how == "cut":
            data = data[: rng.randrange(len(data))]
        else:
            data += bytes(rng.randrange(1, 200))
        ref = json.load(open(os.path.join(folder, "manifest.json")))
        name = f"rows-{hashlib.sha256(data).hexdigest()[:16]}.table"
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        ref["table"] = {"path": name, "num_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump(ref, f)
        return f"bytes {how}"
    data = json.load(open(os.path.join(folder, "manifest.json")))
    field = rng.choice(("parents", "fingerprint", "kind", "fields", "num_samples", "how", "extensions"))
    value = rng.choice((None, 0, -1, 2**70, "", "../" * 40, "/etc", "http://127.0.0.1:9/x", [], {}, [{"path": ".", "fingerprint": "0" * 64}],
                        "x" * 5000, ["emb.npy"] * 3))  # fmt: skip
    data[field] = value
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(data, f)
    return f"manifest {field}"


def _read(folder: str) -> tuple[list[tuple[str, str]], str | None]:
    """Every sample of ``folder`` (exact mode, then at random), or the shardkit error that stopped it."""
    got: list[tuple[str, str]] = []
    try:
        with deadline(READ_TIMEOUT_S):
            for sample in ShardDataset(folder, mode="exact", seed=1):
                got.append((sample["__key__"], _digest(sample)))
            indexed = IndexedDataset(folder)
            for i in range(len(indexed)):
                sample = indexed[i]
                got.append((sample["__key__"], _digest(sample)))
    except ShardkitError as exc:
        return got, f"{type(exc).__name__}: {exc}"
    return got, None


def fuzz(root: str, count: int, seed: int) -> dict:
    """``count`` seeded cases over the datasets under ``root``."""
    truth = json.load(open(os.path.join(root, "truth.json")))
    rng = random.Random(seed)
    outcomes: collections.Counter = collections.Counter()
    failures: list[str] = []
    for case in range(count):
        target = rng.choice(DERIVED)
        folder = os.path.join(root, target)
        backup = folder + ".pristine"
        shutil.copytree(folder, backup)
        try:
            what = _mutate(folder, rng)
            label = f"case {case} ({what} of {target})"
            try:
                got, error = _read(folder)
            except Hang:
                failures.append(f"{label}: hang")
                continue
            except Exception as exc:  # noqa: BLE001 - the failure names it
                failures.append(f"{label}: foreign {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
                continue
            outcomes[f"{what.split(' (')[0].split(' ')[0]}: {'error' if error else 'read'}"] += 1
            for key, digest in got:
                if key in truth["removed"]:
                    failures.append(f"{label}: yielded removed sample {key}")
                elif digest not in truth["samples"].get(key, {}).values():
                    failures.append(f"{label}: yielded {key} with bytes no dataset holds")
        finally:
            shutil.rmtree(folder)
            shutil.move(backup, folder)
    return {"outcomes": dict(outcomes), "failures": failures}


@pytest.fixture(scope="module")
def derived_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("fuzz-derived")
    pool = str(root / "pool")
    build_dataset(pool, (7, 0, 9, 6))
    removed = ["s000_00001", "s002_00004"]
    shardkit.remove_samples(pool, removed)
    shardkit.extend(pool, root / "ext", map=derived_maps.embedding, workers=1)
    shardkit.view(root / "ext", root / "few", where="json.i < 2", workers=1)
    shardkit.view(root / "ext", root / "most", where="json.i >= 1", workers=1)
    shardkit.view(root / "most", root / "most-few", where="json.i >= 5", workers=1)
    samples: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for name in ("pool", *DERIVED):  # each sample's bytes as any of the datasets gives them
        for sample in ShardDataset(root / name, mode="exact"):
            samples[sample["__key__"]][name] = _digest(sample)
    with open(root / "truth.json", "w") as f:
        json.dump({"removed": removed, "samples": samples}, f)
    return str(root)


def test_mutated_views_and_extensions_yield_their_samples_or_shardkit_errors(derived_root, pytestconfig, capsys, tmp_path):
    count = max(1, pytestconfig.getoption("--fuzz-mutations") // 10)
    report = run_fuzz(fuzz, (derived_root, count, 20261204), output=str(tmp_path / "report.json"), mem_mb=MEM_MB,
                      timeout_s=CHILD_TIMEOUT_S)  # fmt: skip
    print_outcomes(capsys, f"derived fuzz: {count} mutations", report)
    assert not report["failures"], "\n".join(report["failures"][:20])
