"""What a token reader hands over for each block: a tensor of the chosen
dtype (:class:`BlockOutput`), or, when torch's collation batches the
blocks, the stored arrays stacked once into the batch (:func:`stack_blocks`),
ids checked to fit where the dtype is narrower than the stored one."""

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
        block = torch.from_numpy(sample["tokens"].astype(target, copy=False))
        return block if self.map is None else self.map(block)

    @staticmethod
    def batched(sample: dict[str, Any]) -> np.ndarray:
        return sample["tokens"]


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


def stack_blocks(blocks: list[np.ndarray], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Blocks of token ids (1-D arrays of one length, as stored) as one
    ``(len(blocks), block_size)`` batch of ``dtype``: what torch's
    ``default_collate`` makes of the blocks as tensors, in one copy instead
    of two. In a DataLoader worker the batch is made in shared memory, as
    ``default_collate`` makes it there, so it crosses to the main process
    as it is."""
    target = OUTPUT_DTYPES[dtype]
    for block in blocks:
        _check_fits(block, target)
    shape = (len(blocks), len(blocks[0]))
    if get_worker_info() is None:
        out = torch.empty(shape, dtype=dtype)
    else:
        empty = torch.empty(0, dtype=dtype)
        out = empty.new(empty.untyped_storage()._new_shared(shape[0] * shape[1] * target.itemsize)).view(shape)
    np.stack(blocks, out=out.numpy(), casting="unsafe")  # as astype converts: checked above where it narrows
    return out
