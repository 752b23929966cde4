"""Packing whole samples into fixed-length sequences, for fine-tuning
(issue #55): ``ShardDataset(..., tokens=PackedSamples(field, seq_len))``.

Several short samples (conversations, say) share one sequence of
``seq_len`` tokens; none is split, and what is left is padding. Which
samples share a sequence is planned per shard from the stored token counts
by best fit, largest first, within windows of ``window`` samples in stored
order: each sample goes to the open sequence it fills most tightly. A
sequence is then a sample of the reader, as a token-budget batch is
(:mod:`.budget`): ``"balanced"`` gives every rank the same number of
sequences, ``"exact"`` every sample once, checkpoints resume on any
topology, and the plan depends on the counts and the seed alone.

Each sequence is a dict as a block with boundaries is
(:mod:`.block_output`): ``tokens`` (``seq_len``, padded with ``pad_id``),
``position_ids`` restarting at each sample, ``seq_lens``/``cu_seqlens``/
``max_seqlen`` (the padding one part of its own), the samples' keys, and
each ``per_token`` field (a loss mask, role ids: 1-D arrays as long as the
sample's tokens) laid out the same way, padded with 0. With the dataset's
``batch_size``, sequences are stacked as blocks with boundaries are.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.errors import UsageError
from shardkit.read.block_output import block_boundaries
from shardkit.read.budget import TOO_LONG, BatchOutput, check_counts, token_ids


@dataclass(frozen=True)
class PackedSamples:
    """Read fixed-length sequences packed with whole samples (see :mod:`shardkit.read.packed`).

    Args:
        field: The token field (a recorded one, e.g. ``"tokens.npy"``).
        seq_len: Tokens per sequence.
        per_token: Other fields holding one value per token of ``field``
            (e.g. ``("loss_mask.npy",)``), laid out alongside.
        window: Samples of a shard packed together (in stored order).
        too_long: ``"refuse"`` a sample longer than ``seq_len``, or
            ``"truncate"`` it.
        pad_id: The padding token.

    Raises:
        UsageError: Bad values.
    """

    field: str
    seq_len: int
    per_token: tuple[str, ...] = ()
    window: int = 1024
    too_long: str = "refuse"
    pad_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field:
            raise UsageError(f"PackedSamples field must be a token field such as 'tokens.npy', not {self.field!r}")
        check_counts(self, "seq_len", "window")
        if self.too_long not in TOO_LONG:
            raise UsageError(f"PackedSamples too_long must be one of {TOO_LONG}, not {self.too_long!r}")
        object.__setattr__(self, "per_token", tuple(self.per_token))

    #: What messages call the bound.
    limit_name = "seq_len"

    @property
    def batch_tokens(self) -> int:
        """A sequence's tokens (what :class:`~.budget.BatchCatalog` bounds samples by)."""
        return self.seq_len

    def record(self) -> str:
        return f"packed:{self.field}:{self.seq_len}:{self.window}:{self.too_long}"

    def plan(self, lengths: np.ndarray, *, seed: int, shard: int) -> list[np.ndarray]:
        """A shard's sequences (kept positions each, in stored order) by best
        fit, largest first, window by window."""
        lengths = np.minimum(np.asarray(lengths, dtype=np.int64), self.seq_len)
        rng = np.random.default_rng([seed, shard])
        out: list[np.ndarray] = []
        for lo in range(0, len(lengths), self.window):
            order = np.arange(lo, min(lo + self.window, len(lengths)))
            order = order[np.lexsort((rng.random(len(order)), -lengths[order]))]
            room: list[int] = []
            members: list[list[int]] = []
            for position in order.tolist():
                n = int(lengths[position])
                fits = [i for i, r in enumerate(room) if r >= n]
                if fits:
                    best = min(fits, key=lambda i: room[i])
                    room[best] -= n
                    members[best].append(position)
                else:
                    room.append(self.seq_len - n)
                    members.append([position])
            out.extend(np.sort(np.asarray(m, dtype=np.int64)) for m in members)
        return out

    def apply(self, mixture: Any, output: Any, *, seed: int, shuffle: bool) -> tuple[Any, Any]:
        """The sequences as the reader's samples; each sample decoded,
        selected and mapped as the options say, then packed (:func:`pack`)."""
        from shardkit.read.block_output import collate_boundary_blocks

        packer = output.collate or functools.partial(pack, spec=self)
        per_sample = BatchOutput(self, output.decoder, output.select, output.map, packer)
        batched = output.batch_size is not None and output.collate is None
        return mixture.with_budget(self, seed=seed), dataclasses.replace(
            output, decode=None, select=None, map=per_sample, collate=collate_boundary_blocks if batched else None
        )


def pack(samples: list[dict[str, Any]], *, spec: PackedSamples) -> dict[str, Any]:
    """Samples laid end to end in one sequence of ``spec.seq_len`` (see the module docstring)."""
    ids = [token_ids(s[spec.field], spec.field)[: spec.seq_len] for s in samples]
    lengths = [len(a) for a in ids]
    used = sum(lengths)
    tokens = np.full(spec.seq_len, spec.pad_id, dtype=np.int64)
    at = 0
    for a in ids:
        tokens[at : at + len(a)] = a
        at += len(a)
    layout = np.asarray([0, *(n for n in lengths if n), *([spec.seq_len - used] if used < spec.seq_len else [])], np.int32)
    out = {"tokens": torch.from_numpy(tokens), **block_boundaries(layout, spec.seq_len), "__key__": [s["__key__"] for s in samples]}
    for name in spec.per_token:
        values = np.zeros(spec.seq_len, dtype=np.int64)
        at = 0
        for sample, n in zip(samples, lengths):
            column = token_ids(sample[name], name)
            if len(column) < n:
                raise UsageError(f"sample {sample['__key__']!r}: {name!r} holds {len(column)} values for {n} tokens; "
                                 f"a per-token field has one value per token of {spec.field!r}")  # fmt: skip
            values[at : at + n] = column[:n]
            at += n
        out[name] = torch.from_numpy(values)
    return out
