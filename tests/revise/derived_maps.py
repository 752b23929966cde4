"""Functions ``extend`` runs in its worker processes (they must import by name)."""

from __future__ import annotations

import io
import json
import os
import time

import numpy as np


def embedding(sample: dict) -> dict | None:
    """A 4-d float16 "embedding" from the sample's JSON; None for every 7th."""
    i = json.loads(sample["json"])["i"]
    if i % 7 == 3:
        return None
    return {"emb.npy": np.full(4, i, dtype=np.float16), "score.txt": str(i / 100)}


def expected_fields(sample: dict) -> dict[str, bytes]:
    """What :func:`embedding` adds to ``sample``, as stored bytes."""
    produced = embedding(sample)
    if produced is None:
        return {}
    buf = io.BytesIO()
    np.save(buf, produced["emb.npy"], allow_pickle=False)
    return {"emb.npy": buf.getvalue(), "score.txt": produced["score.txt"].encode()}


def slow_embedding(sample: dict) -> dict | None:
    """:func:`embedding`, slowly (a run to kill midway)."""
    time.sleep(float(os.environ.get("SHARDKIT_TEST_SLEEP", "0.02")))
    return embedding(sample)


def clashing(sample: dict) -> dict:
    return {"json": b"{}"}
