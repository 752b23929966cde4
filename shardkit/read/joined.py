"""Reading the sides of an extension side by side (see :mod:`.derived`).

An extension's sample is one stored position in each side: the parent's
data shard, and the shard of each extension's new fields. Every side
yields the same samples in the same order, so :class:`JoinedReader` reads
the same pieces from each (one :class:`~.pieces.PieceReader` a side, each
reading ahead on its own) and merges the samples at the same position into
one: the key, and the members of every side. A sample one side lost to a
skipped fault (``on_error="skip"``) is dropped from all of them; one whose
keys differ between the sides is a fault naming both shards.

Column projection (``fields=``) reads only the sides that hold the fields
asked for, and keeps only those members.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardkit.errors import CorruptShardError
from shardkit.format.sample import RawSample
from shardkit.io.base import close_iterator
from shardkit.read.pieces import Located, PieceReader
from shardkit.read.split import Piece

#: The member an extension writes for a sample its function gave no fields
#: (every sample of the parent has a place in each extension shard).
NO_FIELDS = "shardkit-none"


class _SharedPieces:
    """One iterator of pieces drawn by several read-ahead threads, each
    getting every piece (``itertools.tee`` is not safe across threads); what
    one side has drawn and the others not yet is held, a few pieces."""

    _END = object()

    def __init__(self, pieces: Iterator[Piece], n: int):
        self._pieces = pieces
        self._lock = threading.Lock()
        self._queues: list[deque[Any]] = [deque() for _ in range(n)]

    def stream(self, i: int) -> Iterator[Piece]:
        queue = self._queues[i]
        while True:
            with self._lock:
                if not queue:
                    item = next(self._pieces, self._END)
                    for other in self._queues:
                        other.append(item)
                item = queue.popleft()
            if item is self._END:
                return
            yield item


class JoinedReader:
    """Reads a catalog's ``sides`` together (see the module docstring);
    takes what :class:`~.pieces.PieceReader` takes, its read-ahead budget
    shared by the sides."""

    def __init__(self, catalog: Any, *, read_ahead_bytes: int, **options: Any):
        self.catalog = catalog
        sides = catalog.sides or (catalog,)
        budget = max(read_ahead_bytes // len(sides), 1)
        self.readers = [PieceReader(side, read_ahead_bytes=budget, **options) for side in sides]
        self.fields: frozenset[str] | None = catalog.fields
        self.on_error = options["on_error"]
        self.on_skip = options["on_skip"]

    def read(self, pieces: Iterator[Piece]) -> Iterator[Located]:
        shared = _SharedPieces(pieces, len(self.readers))
        return self._join([reader.read(shared.stream(i)) for i, reader in enumerate(self.readers)])

    def load_bounds(self, shard: int) -> np.ndarray:
        """Each kept sample's bytes over all sides, laid end to end (what a
        restore plans its reads by)."""
        sizes = sum(np.diff(reader.load_bounds(shard)) for reader in self.readers)
        return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    def read_runs(self, shard: int, runs: list[tuple[int, int]], *, bounds: np.ndarray) -> Iterator[Located]:
        del bounds  # each side reads by its own
        return self._join([r.read_runs(shard, runs, bounds=r.load_bounds(shard)) for r in self.readers])

    def _join(self, streams: list[Iterator[Located]]) -> Iterator[Located]:
        current = -1  # the shard of the last sample yielded
        try:
            heads: list[Located | None] = [next(s, None) for s in streams]
            while all(h is not None for h in heads):
                first = heads[0]
                if all(h[1] == first[1] and h[0] == first[0] for h in heads):  # type: ignore[index]  # in step
                    yield self._merged(heads)  # type: ignore[arg-type]
                    current = first[0]  # type: ignore[index]
                    heads = [next(s, None) for s in streams]
                    continue
                places = [(h[0], h[1]) for h in heads]  # type: ignore[index]
                if any(p != places[0] for p in places):
                    # A side skipped a sample (on_error="skip"): the others
                    # drop it too. Behind are the sides still in the shard
                    # read last, or at a lower position of the same shard.
                    behind = [p[0] == current and any(q[0] != current for q in places) for p in places]
                    if not any(behind):
                        top = max(p[1] for p in places if p[0] == places[0][0]) if len({p[0] for p in places}) == 1 else None
                        behind = [top is None or p[1] < top for p in places]
                        behind = behind if not all(behind) else [True] + [False] * (len(places) - 1)
                    heads = [next(s, None) if b else h for h, s, b in zip(heads, streams, behind)]
                    continue
                yield self._merged(heads)  # type: ignore[arg-type]
                current = places[0][0]
                heads = [next(s, None) for s in streams]
        finally:
            for stream in streams:
                close_iterator(stream)

    def _merged(self, heads: list[Located]) -> Located:
        shard, position, _ = heads[0]
        urls = lambda: [r.catalog.url(shard) for r in self.readers]  # noqa: E731
        return shard, position, merge_sides([raw for _, _, raw in heads], self.fields, urls)


def merge_sides(raws: list[RawSample], fields: frozenset[str] | None, urls: Any) -> RawSample:
    """One sample from the same sample of each side: the first's key, every
    side's members (less the placeholder of a sample given no fields), only
    ``fields`` where given.

    Raises:
        CorruptShardError: The sides disagree on the key (``urls()`` names their shards).
    """
    first = raws[0]
    members = first.fields  # the first side's sample is the joined one: its members dict gets the others'
    for raw in raws[1:]:
        if raw.key != first.key:
            shards = urls()
            raise CorruptShardError(
                f"{' and '.join(shards)}: one sample has key {first.key!r} in one and {raw.key!r} in the other: "
                "the extension does not match its parent (run `shardkit verify` on it, or extend again)",
                path=shards[0],
                offset=first.start,
            )
        members.update(raw.fields)
    members.pop(NO_FIELDS, None)
    if fields is not None and not members.keys() <= fields:
        first.fields = {k: v for k, v in members.items() if k in fields}
    return first

def reader_type(catalog: Any) -> type:
    """The reader of a catalog's samples: a :class:`JoinedReader` where it
    joins sides or keeps some fields, else a plain :class:`PieceReader`."""
    return JoinedReader if catalog.sides is not None or catalog.fields is not None else PieceReader


def read_joined(dataset: Any, shard: int, position: int, *, max_bytes: int | None) -> RawSample:
    """Sample ``position`` of row ``shard`` of an :class:`~.indexed.IndexedDataset`
    over joined sides or some fields: each side read by a copy of the
    dataset over that side alone (made once per process), then merged."""
    if dataset._joined is None:
        views = []
        for side in dataset._catalog.sides or (dataset._catalog,):
            view = copy.copy(dataset)
            view._catalog = _alone(side)
            view._derive_arrays()
            view._reset_handles()
            views.append(view)
        dataset._joined = views
    raws = [view._read(shard, position, max_bytes=max_bytes) for view in dataset._joined]
    return merge_sides(raws, dataset._catalog.fields, lambda: [v.shard_url(shard) for v in dataset._joined])


def _alone(side: Any) -> Any:
    """``side`` read as it is (no joining, every field): a copy for a plain catalog keeping some fields."""
    if side.sides is None and side.fields is None:
        return side
    alone = copy.copy(side)
    alone.sides, alone.fields = None, None
    return alone
