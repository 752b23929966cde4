"""Rebuild a slot's reading position from a state: the I/O side of resume.

:mod:`.replay` and :mod:`.elastic` hold the pure math; this module feeds
them the reader's plan and the shards' offset indexes, and reads the
restored buffer's samples back through the index.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator

import numpy as np

from shardkit.errors import StateError
from shardkit.read.plan import ReadPlan
from shardkit.read.resume.elastic import (
    EpochSequence,
    LevelPlan,
    remainder,
    sequence_pieces,
)
from shardkit.read.resume.replay import Position, SlotReplay, replay_slot, resident_runs
from shardkit.read.resume.state import Level
from shardkit.read.split import Piece, part_span
from shardkit.read.pieces import Located, PieceReader
from shardkit.world import World

log = logging.getLogger(__name__)


def _position_nbytes(position: Position) -> int:
    return position[4]


class SlotRestorer:
    """Restores slots of one epoch of a plan (caches offset indexes).

    Args:
        plan: The reader's plan; it must have sample counts.
        reader: Reads indexes and the buffered samples.
        epoch: The epoch being resumed.
    """

    def __init__(self, plan: ReadPlan, reader: PieceReader, *, epoch: int):
        assert plan.counts is not None, "resuming needs sample counts"
        self.plan = plan
        self.counts: np.ndarray = plan.counts
        self.reader = reader
        self.epoch = epoch
        self._sizes: dict[int, np.ndarray] = {}

    def sizes(self, shard: int) -> np.ndarray:
        """Stored size of each sample of ``shard`` (from its offset index)."""
        found = self._sizes.get(shard)
        if found is None:
            found = self._sizes[shard] = np.diff(self.reader.load_bounds(shard))
        return found

    def part_pieces(self, world: World, plan: LevelPlan, part: int) -> Iterator[Piece]:
        """The pieces one read part of ``world``'s slot reads at a level
        (endless in ``"infinite"`` mode)."""
        if plan.fresh:
            return self.plan.pieces(world, epoch=plan.epoch, part=part)
        carried = itertools.chain.from_iterable(
            self._sequence_pieces(world, seq, epoch=plan.epoch + k, part=part) for k, seq in enumerate(plan.carried)
        )
        if not plan.endless:
            return carried
        after = plan.epoch + len(plan.carried)  # whole epochs from here on
        return itertools.chain(carried, self.plan.pieces(world, epoch=after, part=part))

    def _sequence_pieces(self, world: World, seq: EpochSequence, *, epoch: int, part: int) -> Iterator[Piece]:
        opts = self.plan.options
        lo, hi = part_span(len(seq), world, mode=opts.mode, pad=opts.pad, part=part, num_parts=opts.interleave)
        assert self.plan.layout is not None
        return sequence_pieces(seq, self.plan.layout, epoch, lo, hi)

    def replay(self, world: World, *, plan: LevelPlan, count: int) -> SlotReplay:
        """Replay ``world``'s slot at a level until ``count`` samples were delivered.

        Raises:
            StateError: ``count`` exceeds the slot's share (finite modes).
        """
        opts = self.plan.options
        parts: list[tuple[Iterator[Piece], int | None]] = []
        for part in range(opts.interleave):
            length = None
            if not plan.endless:
                lo, hi = part_span(
                    len(plan.carried[0]), world, mode=opts.mode, pad=opts.pad, part=part, num_parts=opts.interleave
                )
                length = hi - lo
            parts.append((self.part_pieces(world, plan, part), length))
        share = sum(length or 0 for _, length in parts)
        if not plan.endless and count > share:
            raise StateError(
                f"reader state says rank {world.rank} worker {world.worker} delivered {count} samples, but its "
                f"share of epoch {self.epoch} is {share}: the state does not belong to this dataset and topology"
            )
        buffer = self.plan.shuffle_buffer(world, epoch=self.epoch, nbytes=_position_nbytes)
        return replay_slot(count=count, parts=parts, sizes=self.sizes, buffer=buffer)

    def read_resident(self, replay: SlotReplay) -> list[Located]:
        """Read the samples a restored buffer holds, in buffer order, through
        the offset index (a few direct range reads per shard)."""
        if not replay.resident:
            return []
        wanted = {(p[2], p[3]) for p in replay.resident}
        found: dict[tuple[int, int], Located] = {}
        for shard, runs in resident_runs(replay.resident, self.sizes).items():
            bounds = np.concatenate(([0], np.cumsum(self.sizes(shard))))
            for located in self.reader.read_runs(shard, runs, bounds=bounds):
                key = (located[0], located[1])
                if key in wanted:
                    found[key] = located
        out = [found[p[2], p[3]] for p in replay.resident if (p[2], p[3]) in found]
        if len(out) < len(replay.resident):
            log.warning("%d buffered samples could not be read back", len(replay.resident) - len(out))
        return out


#: How a slot's delivered count splits over the sources: (each source's
#: plan at the level, the slot, its count) -> each source's count, or None
#: when the count exceeds the slot's share.
CountSplit = Callable[[list[LevelPlan], World, int], "list[int] | None"]


def level_plans(
    restorers: list[SlotRestorer], base: tuple[Level, ...], *, epoch: int, split: CountSplit
) -> list[LevelPlan]:
    """Each source's plan at the level after ``base``: the iteration's
    epochs, less what each base level's slots delivered of it (see
    :func:`~shardkit.read.resume.elastic.remainder`), each slot's count
    split over the sources by ``split``.

    Raises:
        StateError: A slot's count exceeds its share.
    """
    opts = restorers[0].plan.options
    endless = opts.mode == "infinite"
    plans = [LevelPlan.start(r.plan.layout, epoch=epoch, endless=endless) for r in restorers]  # type: ignore[arg-type]
    for level in base:
        replays: list[dict[tuple[int, int], SlotReplay]] = [{} for _ in restorers]
        for rank in range(level.world_size):
            for worker in range(level.num_workers):
                slot = World(rank=rank, world_size=level.world_size, worker=worker, num_workers=level.num_workers)
                count = level.count(rank, worker)
                assert count is not None  # levels before the last are complete
                own = split(plans, slot, count)
                if own is None:
                    raise StateError(
                        f"reader state says rank {rank} worker {worker} delivered {count} samples, more than "
                        "its share: the state does not belong to this dataset"
                    )
                for i, restorer in enumerate(restorers):
                    replays[i][rank, worker] = restorer.replay(slot, plan=plans[i], count=own[i])
        plans = _aligned(
            [
                remainder(p, level, r, mode=opts.mode, pad=opts.pad, num_parts=opts.interleave)
                for p, r in zip(plans, replays)
            ]
        )
    return plans


def _aligned(plans: list[LevelPlan]) -> list[LevelPlan]:
    """Endless plans that dropped different finished epochs, padded back to
    a common first epoch with empty sequences (a mixture's schedule goes
    epoch by epoch over all its streams)."""
    first = min(p.epoch for p in plans)
    out = []
    for p in plans:
        if p.epoch > first:
            empty = tuple(_empty() for _ in range(p.epoch - first))
            p = LevelPlan(first, empty + p.carried, p.layout, p.endless)
        out.append(p)
    return out


def _empty() -> EpochSequence:
    return EpochSequence(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
