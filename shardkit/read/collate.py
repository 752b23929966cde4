"""Collating samples into a batch, with an error that names the field
and the samples when they cannot be stacked (images of different sizes,
PIL images), where torch's own says neither."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from shardkit.read.block_output import collate_boundary_blocks, is_boundary_block
from shardkit.errors import UsageError


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tuple(value.shape)
    return None


def _find_field(
    samples: list[Any], differ: Callable[[list[Any]], tuple[int, int] | None], path: tuple[Any, ...] = ()
) -> tuple[tuple[Any, ...], int, int] | None:
    """The first field (as a key path) whose values across ``samples``
    ``differ`` finds at fault, with the two sample numbers it names; None if
    none is."""
    first = samples[0]
    if isinstance(first, dict):
        for key in first:
            if all(isinstance(s, dict) and key in s for s in samples):
                found = _find_field([s[key] for s in samples], differ, path + (key,))
                if found is not None:
                    return found
        return None
    if isinstance(first, (tuple, list)) and not isinstance(first, str):
        if all(isinstance(s, (tuple, list)) and len(s) == len(first) for s in samples):
            for i in range(len(first)):
                found = _find_field([s[i] for s in samples], differ, path + (i,))
                if found is not None:
                    return found
        return None
    pair = differ(samples)
    return None if pair is None else (path, *pair)


def _shapes_differ(values: list[Any]) -> tuple[int, int] | None:
    shape = _shape(values[0])
    if shape is None:
        return None
    for j, value in enumerate(values[1:], 1):
        other = _shape(value)
        if other is not None and other != shape:
            return 0, j
    return None


def _is_image(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.")


def _images(values: list[Any]) -> tuple[int, int] | None:
    """Two PIL images (which no collation stacks), or None."""
    found = [j for j, value in enumerate(values) if _is_image(value)]
    return (found[0], found[-1]) if found else None


def _sample_name(sample: Any, number: int) -> str:
    key = sample.get("__key__") if isinstance(sample, dict) else None
    return f"sample {key!r}" if isinstance(key, str) else f"sample {number} of the batch"


def collate_samples(samples: list[Any], *, collate: Callable[[list[Any]], Any] = default_collate) -> Any:
    """``collate(samples)``, with a clear error when a field's tensors
    differ in shape (images of different sizes, say), which torch reports
    as a bare ``RuntimeError`` (in a worker: "Trying to resize storage that
    is not resizable"), or holds PIL images (``decode="pil"``), which torch
    reports as a bare ``TypeError``.

    Args:
        samples: The samples of one batch.
        collate: The collation (default ``torch.utils.data.default_collate``).

    Returns:
        The batch.

    Raises:
        UsageError: A field's tensors differ in shape, or it holds PIL
            images; names the field, the samples and the remedies.
    """
    if collate is default_collate and samples and is_boundary_block(samples[0]):
        return collate_boundary_blocks(samples)  # parts of different counts: batched as flash-attention takes them
    try:
        return collate(samples)
    except (RuntimeError, TypeError) as exc:
        ragged = isinstance(exc, RuntimeError)
        found = _find_field(samples, _shapes_differ if ragged else _images)
        if found is None:
            raise
        path, a, b = found
        field = ".".join(map(str, path)) or "<sample>"
        top = path[0] if path and isinstance(path[0], str) else "jpg"  # the sample dict's field

        def value(sample: Any) -> Any:
            for part in path:
                sample = sample[part]
            return sample

        if ragged:
            what = (
                f"its tensors differ in shape, {_shape(value(samples[a]))} in {_sample_name(samples[a], a)} and "
                f"{_shape(value(samples[b]))} in {_sample_name(samples[b], b)}"
            )
        else:
            what = f"it holds PIL images ({_sample_name(samples[a], a)}: {value(samples[a]).size}), which no batch stacks"
        raise UsageError(
            f"cannot batch field {field!r}: {what}. "
            "A batch stacks each field as tensors of one size: decode and crop the image to a fixed size, e.g. "
            f"ShardDataset(..., decode=shardkit.Decoder(image=None), map=shardkit.transforms.MapField({top!r}, "
            "shardkit.transforms.DecodeRandomResizedCrop(224))), or keep the samples as a list "
            "(ShardDataset(..., batch_size=64, collate=list) with make_loader(dataset, batch_size=None))"
        ) from exc
