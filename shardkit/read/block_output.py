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

import functools
import itertools
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
        if "layout" in sample:
            block = {"tokens": block, **block_boundaries(sample["layout"], len(sample["tokens"]))}
        return block if self.map is None else self.map(block)

    @staticmethod
    def batched(sample: dict[str, Any]) -> Any:
        return sample["tokens"] if "layout" not in sample else (sample["tokens"], sample["layout"])


def block_boundaries(layout: np.ndarray, size: int) -> dict[str, Any]:
    """One block's ``position_ids`` (int32), ``seq_lens``, ``cu_seqlens``
    and ``max_seqlen``, from its layout (see :mod:`.packer`)."""
    out = _Parts.of([layout], size, check=False).boundaries()  # a layout a packer made
    out["position_ids"], out["seq_lens"] = out["position_ids"].view(-1), out["seq_lens"].view(-1)
    return out


class _Parts:
    """The documents' parts of a batch of blocks of ``size`` tokens: their
    ``lengths`` row after row, each row's ``offset`` (its first token's
    position in its document) and its number of parts (``per_row``);
    checked to fill the blocks where they are not the packer's own
    (``check``)."""

    def __init__(self, lengths: np.ndarray, offsets: list[int], per_row: list[int], size: int, check: bool = True):
        self.lengths, self.offsets, self.per_row, self.size = lengths, offsets, per_row, size
        self.firsts = list(itertools.accumulate(per_row, initial=0))[:-1]  # each row's first part in ``lengths``
        if check and (
            min(per_row) < 1 or (lengths <= 0).any()
            or (np.add.reduceat(lengths, self.firsts, dtype=np.int64) != size).any()
        ):  # fmt: skip
            raise UsageError(f"blocks whose parts do not fill {size} tokens each: seq_lens {lengths.tolist()[:16]}")

    @classmethod
    def of(cls, layouts: list[np.ndarray], size: int, check: bool = True) -> _Parts:
        """The parts of blocks of these layouts (see :mod:`.packer`)."""
        lengths = np.concatenate([layout[1:] for layout in layouts])
        offsets, per_row = [int(layout[0]) for layout in layouts], [len(layout) - 1 for layout in layouts]
        return cls(lengths, offsets, per_row, size, check)

    def boundaries(self) -> dict[str, Any]:
        """The batch's ``position_ids``, ``seq_lens``, ``cu_seqlens`` and
        ``max_seqlen`` (see the module docstring), each an array of its own."""
        rows, widest = len(self.per_row), max(self.per_row)
        positions = np.empty((rows, self.size), dtype=np.int32)
        cu, table = np.empty(len(self.lengths) + 1, dtype=np.int32), np.empty((rows, widest), dtype=np.int32)
        self.fill(positions, cu, table)
        return {"position_ids": torch.from_numpy(positions), "seq_lens": torch.from_numpy(table),
                "cu_seqlens": torch.from_numpy(cu), "max_seqlen": int(self.lengths.max())}  # fmt: skip

    def fill(self, positions: np.ndarray, cu: np.ndarray, table: np.ndarray) -> None:
        """Each token's position in its document into ``positions``, the
        parts' cumulative sums into ``cu``, and into ``table`` each row's
        part lengths padded with zeros."""
        cu[0] = 0
        np.cumsum(self.lengths, out=cu[1:])
        shift = cu[:-1].copy()
        shift[self.firsts] -= self.offsets
        np.subtract(_arange(positions.size), np.repeat(shift, self.lengths), out=positions.reshape(-1))
        table[...] = 0
        table[np.arange(table.shape[1]) < np.array(self.per_row)[:, None]] = self.lengths


@functools.lru_cache(maxsize=8)
def _arange(n: int) -> np.ndarray:
    out = np.arange(n, dtype=np.int32)
    out.flags.writeable = False
    return out


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
    as it is. Blocks with their layouts (``boundaries=True``) make a batch
    with boundaries (see the module docstring); in the workers of
    :func:`~shardkit.make_loader` it crosses as its one buffer
    (:func:`_views`), or from :data:`LAID_FROM_TOKENS` tokens as its tokens
    and parts (:func:`_landed`)."""
    if not blocks or not isinstance(blocks[0], tuple):
        return _stack_tokens(blocks, dtype)
    crossing = lean_handoff and get_worker_info() is not None
    if crossing and len(blocks) * len(blocks[0][0]) >= LAID_FROM_TOKENS:
        tokens = _stack_tokens([block for block, _ in blocks], dtype)
        parts = _Parts.of([layout for _, layout in blocks], tokens.shape[1], check=False)
        return Crossing(_landed, tokens, parts.lengths.astype(np.int32).tobytes(), parts.offsets, parts.per_row)
    return _stack_with_boundaries(blocks, dtype, crossing=crossing)


def _stack_tokens(blocks: list[np.ndarray], dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``blocks`` stacked into a new batch tensor of ``dtype``, or into ``out``."""
    target = OUTPUT_DTYPES[dtype]
    for block in blocks:
        _check_fits(block, target)
    if out is None:
        out = _batch_tensor((len(blocks), len(blocks[0])), dtype)
    np.stack(blocks, out=out.numpy(), casting="unsafe")  # as astype converts: checked above where it narrows
    return out


#: Whether a batch with boundaries made in this process crosses to the main
#: process as a :class:`Crossing`, which unpickles into the batch dict
#: there. Set in each worker by
#: :func:`~shardkit.make_loader`'s loader, where nothing but its own code
#: sees a batch between the dataset and the main process; a plain
#: DataLoader's worker hands over the dict.
lean_handoff = False

#: The fewest tokens a batch has for its boundaries to be made where it
#: lands (:func:`_landed`) rather than in the worker (:func:`_views`).
#: Measured with the two ways alternating: 1.04x the tokens/s of the one
#: buffer at 8 x 8,192 with 2 workers, 1.16x with 1; against a dict made
#: in the worker, 1.0x at 8 x 4,096 and 0.96x at 8 x 2,048. Shared memory
#: costs by the byte, making them in the main process mostly by the call.
LAID_FROM_TOKENS = 1 << 16


class Crossing:
    """A batch with boundaries on its way from a worker of
    :func:`~shardkit.make_loader` to the main process, as what ``land``
    makes it from there: unpickled, it is ``land(*parts)``, the batch dict."""

    def __init__(self, land: Callable[..., dict[str, Any]], *parts: Any):
        self.land, self.parts = land, parts

    def __reduce__(self) -> tuple[Any, ...]:
        return self.land, self.parts


def _landed(tokens: torch.Tensor, lengths: bytes, offsets: list[int], per_row: list[int]) -> dict[str, Any]:
    """A batch from its tokens (in shared memory) and its documents' parts,
    a few bytes a block: ``position_ids``, ``seq_lens``, ``cu_seqlens`` and
    ``max_seqlen`` are made where the batch lands. Made in the worker, they
    would cross in shared memory, and a fresh segment each batch costs by
    the page (about 0.5 µs a KB here): the 256 KB of ``position_ids`` of a
    batch of 8 x 8,192 cost more there than making them costs the main
    process (see :data:`LAID_FROM_TOKENS`)."""
    parts = _Parts(np.frombuffer(lengths, dtype=np.int32), offsets, per_row, tokens.shape[1], check=False)
    return {"tokens": tokens, **parts.boundaries()}


def _batch_tensor(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """An empty batch tensor; in a DataLoader worker, in shared memory, as
    ``default_collate`` makes it there, so it crosses to the main process as it is."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    empty = torch.empty(0, dtype=dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return empty.new(empty.untyped_storage()._new_shared(shape[0] * shape[1] * itemsize)).view(shape)


def _stack_with_boundaries(
    blocks: list[tuple[np.ndarray, np.ndarray]], dtype: torch.dtype, check: bool = False, crossing: bool = False
) -> Any:
    """A batch of blocks with their layouts (see the module docstring).
    Its tensors are views of one buffer (in shared memory in a DataLoader
    worker): one to hand over, not four (four cost 2.7x the hand-off time
    of one here). ``crossing``: the buffer crosses alone, and the views
    are made where it lands (:func:`_views`)."""
    rows, size = len(blocks), len(blocks[0][0])
    parts = _Parts.of([layout for _, layout in blocks], size, check=check)
    shape = (dtype, rows, size, len(parts.lengths), max(parts.per_row))
    at = _aligned(_part_bytes(*shape))
    buffer = _batch_tensor((1, at[-1]), torch.uint8).view(-1)
    batch = _views(buffer, shape, at, int(parts.lengths.max()))
    _stack_tokens([b for b, _ in blocks], dtype, out=batch["tokens"])
    parts.fill(batch["position_ids"].numpy(), batch["cu_seqlens"].numpy(), batch["seq_lens"].numpy())
    return Crossing(_views, buffer, shape, at, batch["max_seqlen"]) if crossing else batch


def _part_bytes(dtype: torch.dtype, rows: int, size: int, count: int, widest: int) -> tuple[int, ...]:
    """The bytes of a batch's tokens, position_ids, cu_seqlens and seq_lens."""
    cells = rows * size
    return cells * OUTPUT_DTYPES[dtype].itemsize, cells * 4, 4 * (count + 1), 4 * rows * widest


def _views(buffer: torch.Tensor, shape: tuple[Any, ...], at: list[int], longest: int) -> dict[str, Any]:
    """The batch with boundaries whose tensors ``buffer`` holds (see
    :func:`_stack_with_boundaries`): ``shape`` is ``(dtype, rows, block
    size, parts, most parts in a row)``, ``at`` where each tensor starts.
    A batch that crosses as its buffer alone costs less on both sides than
    its dict, whose tensors cross one by one (a storage reference rebuilt,
    a tensor made each): 1.06x the tokens/s at 8 x 2,048, 2 workers."""
    dtype, rows, size, count, widest = shape
    ints = buffer.view(torch.int32)
    return {"tokens": buffer.view(dtype).as_strided((rows, size), (size, 1), 0),
            "position_ids": ints.as_strided((rows, size), (size, 1), at[1] // 4),
            "seq_lens": ints.as_strided((rows, widest), (widest, 1), at[3] // 4),
            "cu_seqlens": ints.as_strided((count + 1,), (1,), at[2] // 4), "max_seqlen": longest}  # fmt: skip


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
    pairs = [(b["tokens"].numpy(), layout_of(b)) for b in blocks]
    out = _stack_with_boundaries(pairs, dtype, check=True)
    for name, value in blocks[0].items():
        if name in out:
            continue
        if isinstance(value, torch.Tensor) and value.shape == blocks[0]["tokens"].shape:
            out[name] = torch.stack([b[name] for b in blocks])
        else:
            out[name] = [b[name] for b in blocks]
    return out


def layout_of(block: dict[str, Any]) -> np.ndarray:
    """A block's layout (see :mod:`.packer`) from its ``position_ids`` and ``seq_lens``."""
    lengths = block["seq_lens"].numpy()
    return np.concatenate(([int(block["position_ids"][0])], lengths[lengths > 0])).astype(np.int32)
