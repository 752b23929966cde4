"""Which samples a page shows, and reading them as stored.

Samples are drawn by number, ``numpy.random.default_rng(seed)`` choosing
distinct global sample numbers, and read through the offset index of an
:class:`~shardkit.IndexedDataset` (one ranged read each, raw bytes), so a
page costs the same for a hundred samples as for a billion. A sample that
cannot be read (a damaged shard, a sample larger than the page reads)
becomes a drawn sample with ``error`` set, never an exception: the page is
still written, saying why.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from shardkit.errors import CorruptShardError, ManifestError
from shardkit.io.urls import redact_url

if TYPE_CHECKING:
    from shardkit.format.manifest import Manifest
    from shardkit.format.tar import RawSample

#: Most bytes of one sample read for a page; a larger one is named, not read.
DEFAULT_MAX_SAMPLE_BYTES = 64 << 20
#: Samples read at once (remote samples cost a request each).
READ_THREADS = 8


class RandomAccess(Protocol):
    """What a page needs of :class:`~shardkit.IndexedDataset` (named so
    that this floor does not import the reader's module)."""

    @property
    def manifest(self) -> Manifest | None: ...
    @property
    def num_shards(self) -> int: ...
    @property
    def shard_counts(self) -> np.ndarray: ...
    def __len__(self) -> int: ...
    def locate(self, index: int) -> tuple[int, int]: ...
    def shard_url(self, shard: int) -> str: ...
    def raw_sample(self, index: int, *, max_bytes: int | None = None) -> RawSample: ...


#: Bytes of a ``cls`` member kept from a sample drawn for the statistics only.
MAX_LABEL_BYTES = 64


@dataclass(frozen=True)
class DrawnSample:
    """One sample drawn for the page.

    Attributes:
        number: Its global sample number.
        shard: Its shard's number.
        shard_name: Its shard's path in the dataset (or redacted URL).
        offset: Where it starts in the shard (None when it could not be read).
        key: Its key ("" when it could not be read).
        sizes: Field name -> member size in bytes, in member order.
        fields: Field name -> member bytes, for a sample shown; for one
            drawn for the statistics only, its ``cls`` (up to
            :data:`MAX_LABEL_BYTES`) alone.
        error: Why it could not be read (then ``sizes`` and ``fields`` are empty), or None.
    """

    number: int
    shard: int
    shard_name: str
    offset: int | None
    key: str
    sizes: dict[str, int]
    fields: dict[str, bytes]
    error: str | None = None


def pick_numbers(total: int, count: int, seed: int) -> list[int]:
    """``count`` distinct sample numbers of ``total`` (all of them when
    fewer), drawn with ``seed``, in the order drawn: any first ones are a
    random choice too."""
    rng = np.random.default_rng(seed)
    if count >= total:
        return [int(n) for n in rng.permutation(total)]
    return [int(n) for n in rng.choice(total, size=count, replace=False)]


def shard_name(dataset: RandomAccess, shard: int) -> str:
    """A shard as the page names it: its path in the dataset when there is
    a manifest, else its path or URL, with any credentials taken out."""
    manifest = dataset.manifest
    if manifest is not None:
        return manifest.table.path(shard)
    return redact_url(dataset.shard_url(shard))


def read_samples(
    dataset: RandomAccess, numbers: list[int], *, keep: set[int], max_sample_bytes: int
) -> list[DrawnSample]:
    """Samples ``numbers`` of ``dataset``, read as stored, a few at once,
    in that order; only those in ``keep`` hold on to their bytes."""
    def read(number: int) -> DrawnSample:
        return _read_one(dataset, number, number in keep, max_sample_bytes)

    if len(numbers) <= 1:
        return [read(n) for n in numbers]
    with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="shardkit-preview") as pool:
        return list(pool.map(read, numbers))


def _read_one(dataset: RandomAccess, number: int, keep: bool, max_sample_bytes: int) -> DrawnSample:
    shard, _ = dataset.locate(number)
    name = shard_name(dataset, shard)
    try:
        raw = dataset.raw_sample(number, max_bytes=max_sample_bytes)
    except (CorruptShardError, ManifestError, OSError) as exc:  # the reader's data faults
        return DrawnSample(number, shard, name, None, "", {}, {}, error=f"{type(exc).__name__}: {exc}")
    sizes = {field: len(data) for field, data in raw.fields.items()}
    fields = dict(raw.fields) if keep else {"cls": raw.fields["cls"][:MAX_LABEL_BYTES]} if "cls" in raw.fields else {}
    return DrawnSample(number, shard, name, raw.start, raw.key, sizes, fields)
