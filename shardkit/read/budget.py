"""Token-budget batches: batches of whole samples bounded by tokens, not by
count (issue #55): what ``ShardDataset(..., tokens=TokenBudget(...))`` reads.

**Planned from the stored counts.** Each shard's samples, in stored order
and in windows of ``window`` samples, are cut into batches greedily: a
sample joins the batch while the batch's padded size stays within
``batch_tokens`` (its count times its longest sample, or with
``padding="packed"`` the sum of its lengths). With ``group_by_length`` a
window's samples are first sorted by length (ties in a seeded order), so a
batch holds samples of similar lengths and padding falls. The plan depends
on the shard's per-sample token counts (the offset index's token array) and
the seed alone, so every rank and worker makes the same one.

**Batches are the samples.** As token blocks are (:mod:`.blocks`), the
batches are presented to the reader as the samples of a catalog of their
own (:class:`BatchCatalog`: the real shards, each counting its batches), so
everything the reader does for samples it does for batches, unchanged:
``"balanced"`` gives every rank the same number of batches, whatever the
lengths (what DDP needs: no rank waits for a step another never takes);
``"exact"`` delivers every batch, so every sample, once; ``len()`` counts
batches; the shuffle buffer mixes batches; a checkpoint counts delivered
batches and resumes on any number of ranks or workers.

A sample longer than ``batch_tokens`` is refused when the dataset opens
(naming it), or with ``too_long="truncate"`` counted and cut to the budget.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.errors import UsageError
from shardkit.format.tar import RawSample
from shardkit.format.tokens import token_array
from shardkit.io.urls import redact_url
from shardkit.read.pieces import Located, PieceReader
from shardkit.read.split import Piece

PADDINGS = ("longest", "packed")
TOO_LONG = ("refuse", "truncate")
#: Shards whose batch plans a reader keeps at hand.
_PLANS_KEPT = 8


@dataclass(frozen=True)
class TokenBudget:
    """Read batches of whole samples bounded by tokens (see :mod:`shardkit.read.budget`).

    Args:
        field: The field whose token count each sample is measured by (a
            recorded token field, e.g. ``"tokens.npy"``).
        batch_tokens: Most tokens a batch may take, padded.
        padding: ``"longest"``: a batch's size is its count times its
            longest sample (what padding to the longest costs);
            ``"packed"``: the sum of its lengths (samples packed end to end).
        group_by_length: Sort each window's samples by length before
            cutting, so batches hold samples of similar lengths.
        window: Samples of a shard planned together (in stored order).
        too_long: ``"refuse"`` a sample longer than ``batch_tokens``, or
            ``"truncate"`` it to the budget.
        pad_id: What the default collation pads ``field`` with.
        lengths: Each sample's length in dataset order (``IndexedDataset``'s
            numbering), for samples measured otherwise than by a recorded
            token field (audio frames, say): the plan uses these instead of
            ``field``'s counts, and ``collate`` should batch what ``field``
            holds. Travels with the dataset to every worker (8 bytes a sample).

    Raises:
        UsageError: Bad values.
    """

    field: str
    batch_tokens: int
    padding: str = "longest"
    group_by_length: bool = False
    window: int = 1024
    too_long: str = "refuse"
    pad_id: int = 0
    lengths: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field:
            raise UsageError(f"TokenBudget field must be a token field such as 'tokens.npy', not {self.field!r}")
        if self.lengths is not None:
            declared = np.asarray(self.lengths)
            if declared.ndim != 1 or not np.issubdtype(declared.dtype, np.integer) or (declared < 0).any():
                raise UsageError("TokenBudget lengths must be one non-negative integer a sample, in dataset order")
            object.__setattr__(self, "lengths", declared.astype(np.int64))
        check_counts(self, "batch_tokens", "window")
        if self.padding not in PADDINGS:
            raise UsageError(f"TokenBudget padding must be one of {PADDINGS}, not {self.padding!r}")
        if self.too_long not in TOO_LONG:
            raise UsageError(f"TokenBudget too_long must be one of {TOO_LONG}, not {self.too_long!r}")
        if not isinstance(self.group_by_length, bool):
            raise UsageError(f"TokenBudget group_by_length must be True or False, not {self.group_by_length!r}")

    #: What messages call the bound.
    limit_name = "batch_tokens"

    def record(self) -> str:
        """What a checkpoint's fingerprint adds for these batches."""
        declared = "" if self.lengths is None else ":" + hashlib.sha256(self.lengths.tobytes()).hexdigest()[:16]
        return f"budget:{self.field}:{self.batch_tokens}:{self.padding}:{self.group_by_length}:{self.window}:{self.too_long}{declared}"

    def plan(self, lengths: np.ndarray, *, seed: int, shard: int) -> list[np.ndarray]:
        """A shard's batches from its samples' token counts (:func:`plan_shard`)."""
        return plan_shard(lengths, self, seed=seed, shard=shard)

    def apply(self, mixture: Any, output: Any, *, seed: int, shuffle: bool) -> tuple[Any, Any]:
        """The reader's sources and output for these batches: the catalog of
        batches, and an output that decodes, selects and maps each sample of
        a batch, then collates them (:func:`pad_collate` by default)."""
        if output.batch_size is not None:
            raise UsageError("tokens=TokenBudget(...) makes the batches: leave batch_size unset")
        per_sample = BatchOutput(self, output.decoder, output.select, output.map, output.collate)
        return mixture.with_budget(self, seed=seed), dataclasses.replace(output, decode=None, select=None,
                                                                        map=per_sample, collate=None)  # fmt: skip


def check_counts(spec: Any, *names: str) -> None:
    """Refuse a field of ``spec`` (among ``names``) that is not an int of at least 1 (a bool is not one)."""
    for name in names:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{type(spec).__name__} {name} must be an int >= 1, not {value!r}")


def plan_shard(lengths: np.ndarray, budget: TokenBudget, *, seed: int, shard: int) -> list[np.ndarray]:
    """A shard's batches (each an array of kept positions) from its samples'
    token counts, in stored order (see the module docstring)."""
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), budget.batch_tokens)
    batches: list[np.ndarray] = []
    rng = np.random.default_rng([seed, shard])
    cap = budget.batch_tokens
    for lo in range(0, len(lengths), budget.window):
        order = np.arange(lo, min(lo + budget.window, len(lengths)))
        if budget.group_by_length:
            ties = rng.random(len(order))
            order = order[np.lexsort((ties, lengths[order]))]
        current: list[int] = []
        longest = total = 0
        for position in order.tolist():
            n = int(lengths[position])
            grown = (len(current) + 1) * max(longest, n) if budget.padding == "longest" else total + n
            if current and grown > cap:
                batches.append(np.asarray(current, dtype=np.int64))
                current, longest, total = [], 0, 0
            current.append(position)
            longest, total = max(longest, n), total + n
        if current:
            batches.append(np.asarray(current, dtype=np.int64))
    return batches


class BatchCatalog:
    """One dataset's token-budget batches as a catalog (see the module
    docstring): its real shards, each counting its batches.

    Raises:
        UsageError: No token counts for the field, compressed shards, or
            (``too_long="refuse"``) a sample longer than the budget.
    """

    has_indexes = True
    compressed = False
    manifest = None
    sides = None
    fields = None

    def __init__(self, catalog: Any, budget: Any, *, seed: int):
        if not catalog.has_indexes or catalog.counts is None:
            raise UsageError("token-budget batches are planned from offset indexes: read an uncompressed dataset "
                             "with a manifest")  # fmt: skip
        declared = getattr(budget, "lengths", None)
        if declared is None:
            catalog.shard_tokens(budget.field)  # refuses a field without counts, naming those it has
        elif len(declared) != int(np.sum(catalog.counts)):
            raise UsageError(f"TokenBudget lengths has {len(declared):,} values, the dataset {int(np.sum(catalog.counts)):,} "
                             "samples: give one a sample, in dataset order")  # fmt: skip
        self.catalog = catalog
        self.budget = budget
        self.seed = seed
        counts = np.zeros(catalog.num_shards, dtype=np.int64)
        for shard in range(catalog.num_shards):
            if int(catalog.counts[shard]):
                counts[shard] = len(self._plan_checked(shard))
        counts.flags.writeable = False
        self.counts = counts
        self.num_shards = catalog.num_shards
        self.num_samples = int(counts.sum())
        self._plans: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        if not self.num_samples:
            raise UsageError(f"{redact_url(catalog.url(0)) if catalog.num_shards else 'the dataset'}: no samples to batch")

    @functools.cached_property
    def starts(self) -> np.ndarray:
        starts = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=starts[1:])
        return starts

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.catalog.fingerprint}|{self.budget.record()}|{self.seed}".encode()).hexdigest()

    def url(self, shard: int) -> str:
        return self.catalog.url(shard)

    def _lengths(self, shard: int) -> np.ndarray:
        declared = getattr(self.budget, "lengths", None)
        if declared is not None:
            lo = int(self.catalog.starts[shard])
            return declared[lo : lo + int(self.catalog.counts[shard])]
        return self.catalog.document_tokens(shard, self.budget.field)

    def _plan_checked(self, shard: int) -> list[np.ndarray]:
        lengths = self._lengths(shard)
        if self.budget.too_long == "refuse" and len(lengths) and int(lengths.max()) > self.budget.batch_tokens:
            at = int(np.argmax(lengths))
            raise UsageError(
                f"{redact_url(self.catalog.url(shard))}: sample {at} holds {int(lengths[at]):,} tokens in "
                f"{self.budget.field!r}, more than {self.budget.limit_name}={self.budget.batch_tokens:,}: raise it, or "
                f"pass {type(self.budget).__name__}(..., too_long='truncate') to cut such samples to it"
            )
        return self.budget.plan(lengths, seed=self.seed, shard=shard)

    def plan(self, shard: int) -> list[np.ndarray]:
        """Shard ``shard``'s batches (kept positions each), made again on demand."""
        with self._lock:
            found = self._plans.get(shard)
        if found is None:
            found = self.budget.plan(self._lengths(shard), seed=self.seed, shard=shard)
            with self._lock:
                if len(self._plans) >= _PLANS_KEPT:
                    self._plans.pop(next(iter(self._plans)))
                self._plans[shard] = found
        return found

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_plans", "_lock", "starts")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._plans, self._lock = {}, threading.Lock()


class BatchReader:
    """Reads batches (pieces of a :class:`BatchCatalog`'s shards): the
    samples under them through a :class:`~shardkit.read.pieces.PieceReader`
    of the real shards, grouped as planned. Each batch is yielded as soon as
    its samples have come (a window's worth held at most)."""

    def __init__(self, catalog: BatchCatalog, **reader: Any):
        self.catalog = catalog
        self._reader = PieceReader(catalog.catalog, **reader)
        self.on_error = self._reader.on_error
        self.on_skip = self._reader.on_skip

    def load_bounds(self, shard: int) -> np.ndarray:
        """Batches as byte spans of equal size (what a restored buffer is sized by)."""
        return np.arange(int(self.catalog.counts[shard]) + 1, dtype=np.int64) * 1024

    def read_runs(self, shard: int, runs: list[tuple[int, int]], *, bounds: np.ndarray) -> Iterator[Located]:
        for lo, hi in runs:
            yield from self.read(iter([Piece(shard, lo, hi)]))

    def read(self, pieces: Iterator[Piece]) -> Iterator[Located]:
        plans: deque[tuple[Piece, list[np.ndarray]]] = deque()

        def samples() -> Iterator[Piece]:  # in the read-ahead thread: hands each plan to the grouping
            for piece in pieces:
                batches = self.catalog.plan(piece.shard)[piece.start : piece.stop]
                plans.append((piece, batches))
                if batches:
                    lo = min(int(b.min()) for b in batches)
                    hi = max(int(b.max()) for b in batches) + 1
                    yield Piece(piece.shard, lo, hi)

        return self._batches(iter(self._reader.read(samples())), plans)

    def _batches(self, located: Iterator[Located], plans: deque[tuple[Piece, list[np.ndarray]]]) -> Iterator[Located]:
        pending: Located | None = next(located, None)
        while plans:
            piece, batches = plans.popleft()
            if not batches:
                continue
            wanted = {int(p): j for j, batch in enumerate(batches) for p in batch.tolist()}
            left = [len(b) for b in batches]
            held: dict[int, RawSample] = {}
            lo, hi = min(wanted), max(wanted)
            last = -1
            ready = 0
            while pending is not None and pending[0] == piece.shard and last < pending[1] and lo <= pending[1] <= hi:
                _, position, raw = pending
                last = position
                j = wanted.get(position)
                if j is not None:
                    held[position] = raw
                    left[j] -= 1
                pending = next(located, None)
                while ready < len(batches) and not left[ready]:
                    yield self._batch(piece, ready, batches[ready], held)
                    ready += 1
            for j in range(ready, len(batches)):  # samples lost to skipped faults: the batch as it is
                yield self._batch(piece, j, batches[j], held)

    def _batch(self, piece: Piece, j: int, batch: np.ndarray, held: dict[int, RawSample]) -> Located:
        raws = [held.pop(int(p)) for p in batch.tolist() if int(p) in held]
        size = sum(r.end - r.start for r in raws)
        return piece.shard, piece.start + j, RawSample(f"batch-{piece.shard}-{piece.start + j}", {"samples": raws}, 0, size)  # type: ignore[dict-item]


class BatchOutput:
    """What a token-budget reader yields for a batch: each sample decoded,
    selected and mapped as the dataset's options say, then collated
    (:func:`pad_collate` of the budget's field unless ``collate`` is given)."""

    def __init__(self, budget: Any, decoder: Any, select: Any, map: Any, collate: Any):  # noqa: A002
        self.budget, self.decoder, self.select, self.map = budget, decoder, select, map
        self.collate = collate or functools.partial(pad_collate, field=budget.field, pad_id=budget.pad_id,
                                                    limit=budget.batch_tokens)  # fmt: skip

    def __call__(self, batch: dict[str, Any]) -> Any:
        out = []
        for raw in batch["samples"]:
            sample: dict[str, Any] = {"__key__": raw.key, **raw.fields}
            if self.decoder is not None:
                sample = self.decoder(sample, path=raw.key)
            if self.select is not None and not self.select(sample):
                continue
            out.append(sample if self.map is None else self.map(sample))
        batch_out = self.collate(out)
        if "__stream__" in batch and isinstance(batch_out, dict):  # a mixture's: the batch's one source
            batch_out["__stream__"] = batch["__stream__"]
        return batch_out


def pad_collate(samples: list[dict[str, Any]], *, field: str, pad_id: int = 0, limit: int | None = None) -> dict[str, Any]:
    """A batch of samples of different lengths: ``field`` padded with
    ``pad_id`` to the longest (cut to ``limit``) as an int64 ``(B, L)``
    tensor, its ``lengths`` and ``attention_mask``; ``__key__`` and every
    other field as lists."""
    arrays = [token_ids(s[field], field) for s in samples]
    if limit is not None:
        arrays = [a[:limit] for a in arrays]
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    tokens = np.full((len(arrays), width), pad_id, dtype=np.int64)
    for i, a in enumerate(arrays):
        tokens[i, : len(a)] = a
    out: dict[str, Any] = {field: torch.from_numpy(tokens), "lengths": torch.from_numpy(lengths),
                           "attention_mask": torch.from_numpy(np.arange(width)[None, :] < lengths[:, None])}  # fmt: skip
    for name in samples[0] if samples else ():
        if name != field:
            out[name] = [s.get(name) for s in samples]
    return out


def token_ids(value: Any, field: str) -> np.ndarray:
    """A sample's token ids as int64: stored ``.npy`` bytes, or an array already decoded."""
    if isinstance(value, (bytes, memoryview)):
        found = token_array(value)
        if found is None:
            raise UsageError(f"field {field!r} does not hold a 1-D integer .npy array of token ids")
        return found.astype(np.int64, copy=False)
    return np.asarray(value, dtype=np.int64).reshape(-1)

