"""Token datasets for the token-block tests: documents of wildly uneven
lengths written by the map writer, each token id unique in the dataset, so a
test can tell every token's document and place from its value alone."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

import shardkit

#: Token ids of document ``i`` are ``i * STRIDE + k`` for its ``k``-th token.
STRIDE = 10_000
#: Integer dtypes the documents cycle through (the reader takes any).
DTYPES = (np.int32, np.int64, np.uint32)


def length(i: int, *, long_every: int = 17) -> int:
    """Document ``i``'s token count: mostly 1-40, some 100-400, every
    ``long_every``-th one 2,000-6,000 (many blocks of the tests' sizes)."""
    rng = np.random.default_rng(i)
    if i % long_every == long_every - 1:
        return int(rng.integers(2_000, 6_000))
    return int(rng.integers(1, 40)) if rng.random() < 0.75 else int(rng.integers(100, 400))


def document(
    i: int, *, base: int = 0, field: str = "tokens.npy", long_every: int = 17, dtypes: tuple[Any, ...] = DTYPES
) -> dict[str, Any]:
    """What the map writer stores for item ``i``: its key and token ids (of
    the ``dtypes`` in turn: documents of one dtype are read as runs of many,
    of another in turn one by one)."""
    ids = base + i * STRIDE + np.arange(length(i, long_every=long_every))
    return {"__key__": f"doc{i:06d}", field: ids.astype(dtypes[i % len(dtypes)])}


def write_documents(dest: str, count: int, *, per_shard: int = 23, **kwargs: Any) -> list[np.ndarray]:
    """Write ``count`` documents to ``dest`` (shards of ``per_shard``) and
    return each document's token ids, in item order."""
    make = functools.partial(document, **kwargs)
    shardkit.write_dataset(range(count), dest, map=make, options=shardkit.WriteOptions(max_samples=per_shard, workers=1))
    field = kwargs.get("field", "tokens.npy")
    return [np.asarray(make(i)[field], dtype=np.int64) for i in range(count)]


def runs(block: np.ndarray) -> list[np.ndarray]:
    """A block cut where consecutive ids stop rising by one: each run is one
    document's tokens in order (or an ``eos``, or one document's end and the
    next one's start when they are neighbours)."""
    cuts = np.flatnonzero(np.diff(block) != 1) + 1
    return np.split(block, cuts)


def sized_document(i: int, *, lengths: tuple[int, ...]) -> dict[str, Any]:
    """Document ``i`` of ``lengths[i % len(lengths)]`` tokens (0 allowed)."""
    ids = i * STRIDE + np.arange(lengths[i % len(lengths)])
    return {"__key__": f"doc{i:06d}", "tokens.npy": ids.astype(np.int64)}
