"""What a token reader hands over for each block: a tensor of the chosen
dtype (:class:`BlockOutput`), or, when torch's collation batches the
blocks, the stored arrays stacked once into the batch (:func:`stack_blocks`),
ids checked to fit where the dtype is narrower than the stored one.

With ``TokenBlocks(..., boundaries=True)`` a block is a dict instead
(:func:`block_boundaries`): ``tokens``; ``position_ids`` (int32, each
token's position in its document: every position fits, half the bytes of
int64 to hand over; embedding and rotary layers take it as it is, or
``.long()`` after the copy to the GPU); ``seq_lens`` (int32, the lengths of the
documents' parts in the block, in order; a block's first part may continue
a document, its last run on into the next block); ``cu_seqlens`` (int32,
their cumulative sums from 0: flash-attention's ``cu_seqlens``) and
``max_seqlen``. A batch of them (:func:`stack_blocks`) has ``tokens`` and
``position_ids`` of shape ``(batch, block_size)``, ``seq_lens`` padded with
zeros to ``(batch, most parts)``, and ``cu_seqlens`` over the batch
flattened (each block's parts offset by its place: what varlen attention
over ``tokens.view(-1)`` takes), with ``max_seqlen`` over the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardkit.errors import UsageError

#: The dtypes blocks may be handed over as, and their numpy twins.
OUTPUT_DTYPES = {torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32)}


class BlockOutput:
    """What a token reader yields for a block: a 1-D tensor of
    ``TokenBlocks.dtype``, passed through the user's ``map`` when there is
    one.

    :meth:`batched` is what it yields instead when blocks are batched by
    torch's collation and nothing else sees a block alone: the block as
    stored, which :func:`stack_blocks` then copies into the batch once,
    converting it as it goes.
    """

    def __init__(self, map: Callable[[torch.Tensor], Any] | None = None, dtype: torch.dtype = torch.int64):  # noqa: A002
        self.map = map
        self.dtype = dtype

    def __call__(self, sample: dict[str, Any]) -> Any:
        target = OUTPUT_DTYPES[self.dtype]
        _check_fits(sample["tokens"], target)
        block: Any = torch.from_numpy(sample["tokens"].astype(target, copy=False))
        if "positions" in sample:
            block = {"tokens": block, **block_boundaries(sample["positions"])}
        return block if self.map is None else self.map(block)

    @staticmethod
    def batched(sample: dict[str, Any]) -> Any:
        return sample["tokens"] if "positions" not in sample else (sample["tokens"], sample["positions"])


def _parts(positions: np.ndarray) -> np.ndarray:
    """The lengths of the documents' parts in a block, from its positions."""
    starts = np.flatnonzero(positions == 0)
    if not len(starts) or starts[0] != 0:
        starts = np.concatenate(([0], starts))
    return np.diff(np.concatenate((starts, [len(positions)]))).astype(np.int32)


def block_boundaries(positions: np.ndarray) -> dict[str, Any]:
    """One block's ``position_ids`` (int32), ``seq_lens``, ``cu_seqlens`` and ``max_seqlen``."""
    lengths = _parts(positions)
    cu = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    return {"position_ids": torch.from_numpy(positions.astype(np.int32, copy=False)),
            "seq_lens": torch.from_numpy(lengths), "cu_seqlens": torch.from_numpy(cu),
            "max_seqlen": int(lengths.max()) if len(lengths) else 0}  # fmt: skip


def _check_fits(block: np.ndarray, target: np.dtype) -> None:
    """Refuse a block holding an id that ``target`` cannot (int32 output of
    ids stored wider)."""
    if np.can_cast(block.dtype, target, "safe") or not len(block):
        return
    info = np.iinfo(target)
    lo, hi = int(block.min()), int(block.max())
    if lo < info.min or hi > info.max:
        bad = hi if hi > info.max else lo
        raise UsageError(
            f"a block holds token id {bad:,}, which {target} cannot hold (ids are stored as {block.dtype}): "
            "read these tokens with TokenBlocks(..., dtype=torch.int64), the default"
        )


def stack_blocks(blocks: list[Any], dtype: torch.dtype = torch.int64) -> Any:
    """Blocks of token ids (1-D arrays of one length, as stored) as one
    ``(len(blocks), block_size)`` batch of ``dtype``: what torch's
    ``default_collate`` makes of the blocks as tensors, in one copy instead
    of two. In a DataLoader worker the batch is made in shared memory, as
    ``default_collate`` makes it there, so it crosses to the main process
    as it is."""
    if blocks and isinstance(blocks[0], tuple):  # with their positions (boundaries=True)
        return _stack_with_boundaries(blocks, dtype)  # type: ignore[arg-type]
    target = OUTPUT_DTYPES[dtype]
    for block in blocks:
        _check_fits(block, target)
    out = _batch_tensor((len(blocks), len(blocks[0])), dtype)
    np.stack(blocks, out=out.numpy(), casting="unsafe")  # as astype converts: checked above where it narrows
    return out


def _batch_tensor(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """An empty batch tensor; in a DataLoader worker, in shared memory, as
    ``default_collate`` makes it there, so it crosses to the main process as it is."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    empty = torch.empty(0, dtype=dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return empty.new(empty.untyped_storage()._new_shared(shape[0] * shape[1] * itemsize)).view(shape)


def _stack_with_boundaries(blocks: list[tuple[np.ndarray, np.ndarray]], dtype: torch.dtype) -> dict[str, Any]:
    """A batch of blocks with positions (see the module docstring), its
    parts found over the whole batch at once. Its tensors are views of one
    buffer (in shared memory in a DataLoader worker): one to hand over, not
    four (four cost 2.7x the hand-off time of one here)."""
    target = OUTPUT_DTYPES[dtype]
    for block, _ in blocks:
        _check_fits(block, target)
    rows, size = len(blocks), len(blocks[0][1])
    positions = np.stack([p for _, p in blocks])
    first = positions == 0
    first[:, 0] = True  # a block's first token starts a part, a document's or a continued one's
    starts = np.flatnonzero(first.ravel())
    per_row = np.bincount(starts // size, minlength=rows)
    widest = int(per_row.max())
    cells = rows * size
    layout = _aligned((cells * target.itemsize, cells * 4, 4 * (len(starts) + 1), 4 * rows * widest))
    buffer = _batch_tensor((1, layout[-1]), torch.uint8).view(-1)
    tokens = buffer[layout[0] : layout[1]].view(dtype).view(rows, size)
    position_ids = buffer[layout[1] : layout[2]].view(torch.int32)[:cells].view(rows, size)
    cu = buffer[layout[2] : layout[3]].view(torch.int32)[: len(starts) + 1]
    seq_lens = buffer[layout[3] : layout[4]].view(torch.int32)[: rows * widest].view(rows, widest)
    np.stack([b for b, _ in blocks], out=tokens.numpy(), casting="unsafe")  # checked above where it narrows
    position_ids.numpy()[...] = positions
    cu_np = cu.numpy()
    cu_np[:-1] = starts
    cu_np[-1] = first.size
    lengths = np.diff(cu_np)
    table = seq_lens.numpy()
    table[...] = 0
    table[starts // size, np.arange(len(starts)) - np.repeat(np.cumsum(per_row) - per_row, per_row)] = lengths
    return {"tokens": tokens, "position_ids": position_ids, "seq_lens": seq_lens, "cu_seqlens": cu,
            "max_seqlen": int(lengths.max())}  # fmt: skip


def _aligned(sizes: tuple[int, ...]) -> list[int]:
    """Offsets of parts of ``sizes`` bytes laid end to end, each 8-byte aligned; the total last."""
    out = [0]
    for n in sizes:
        out.append(out[-1] + -(-n // 8) * 8)
    return out


def is_boundary_block(sample: Any) -> bool:
    """Whether ``sample`` is a block with boundaries (what :class:`BlockOutput` makes)."""
    return isinstance(sample, dict) and "cu_seqlens" in sample and "position_ids" in sample and "tokens" in sample


def collate_boundary_blocks(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Blocks with boundaries, each a dict, batched as :func:`stack_blocks`
    batches them (a loader that batches what the dataset yields one by one);
    any other field of one value per token is stacked alongside, and a
    packed sequence's keys are listed per row."""
    dtype = blocks[0]["tokens"].dtype
    pairs = [(b["tokens"].numpy(), b["position_ids"].numpy()) for b in blocks]
    out = _stack_with_boundaries(pairs, dtype)
    for name, value in blocks[0].items():
        if name in out:
            continue
        if isinstance(value, torch.Tensor) and value.shape == blocks[0]["tokens"].shape:
            out[name] = torch.stack([b[name] for b in blocks])
        else:
            out[name] = [b[name] for b in blocks]
    return out
