"""A plain-list model of ``mode="infinite"`` across topology changes, for tests.

It follows the documented semantics with lists of keys, independently of the
interval arithmetic of :mod:`shardkit.read.resume`: a level's slots read, per
epoch, their near-equal share of that epoch's keys (a remainder an earlier
level left, or the whole epoch), one part after another, through a shuffle
buffer seeded like the reader's. Each output is tagged with its epoch, which
the reader's keys alone do not tell.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from shardkit import ShardDataset, World
from shardkit.read.shuffle import ShuffleBuffer
from shardkit.read.split import SAMPLE_SHUFFLE_DOMAIN, epoch_order, even_cut, seed_sequence, slot_span

Tagged = tuple[int, str]  # (epoch, key)
Slot = tuple[int, int]  # (rank, worker)


@dataclass
class ModelPlan:
    """Keys per epoch from ``epoch`` on: ``carried`` lists, then whole epochs."""

    epoch: int
    carried: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class Model:
    """The options of the dataset being modelled (``buffer_bytes`` unset)."""

    counts: Sequence[int]
    seed: int
    buffer_size: int
    interleave: int
    start: int  # the epoch the iteration started from (the state's epoch)

    def epoch_keys(self, epoch: int) -> list[str]:
        order = epoch_order(len(self.counts), seed=self.seed, epoch=epoch, shuffle=True)
        return [f"s{shard:03d}_{i:05d}" for shard in order for i in range(self.counts[shard])]

    def keys_of(self, plan: ModelPlan, epoch: int) -> list[str]:
        k = epoch - plan.epoch
        return plan.carried[k] if k < len(plan.carried) else self.epoch_keys(epoch)

    def _part(self, plan: ModelPlan, world: World, part: int) -> Iterator[Tagged]:
        for epoch in itertools.count(plan.epoch):
            keys = self.keys_of(plan, epoch)
            lo, hi = slot_span(len(keys), world, mode="infinite")
            a, b = even_cut(hi - lo, self.interleave, part)
            yield from ((epoch, key) for key in keys[lo + a : lo + b])

    def slot_stream(self, plan: ModelPlan, world: World) -> Iterator[Tagged]:
        """What ``world``'s slot delivers at a level with ``plan``."""
        parts = [self._part(plan, world, p) for p in range(self.interleave)]
        # Endless streams: the round robin never drops one.
        merged = itertools.chain.from_iterable(zip(*parts))
        if self.buffer_size <= 1:
            return merged
        seeds = seed_sequence(self.seed, self.start, SAMPLE_SHUFFLE_DOMAIN, world.rank, world.worker)
        buffer: ShuffleBuffer[Tagged] = ShuffleBuffer(
            size=self.buffer_size, rng=np.random.Generator(np.random.PCG64(seeds))
        )
        return buffer.shuffle(merged)

    def read_level(
        self, plan: ModelPlan, topology: tuple[int, int], takes: dict[Slot, int]
    ) -> dict[Slot, list[Tagged]]:
        """The first ``takes[slot]`` items of each slot of a level."""
        world_size, num_workers = topology
        out = {}
        for (rank, worker), take in takes.items():
            world = World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
            out[rank, worker] = list(itertools.islice(self.slot_stream(plan, world), take))
        return out

    def next_plan(self, plan: ModelPlan, delivered: dict[Slot, list[Tagged]]) -> ModelPlan:
        """The plan after a level delivered ``delivered``: per epoch up to the
        last one touched, the keys not delivered; leading empty epochs dropped."""
        done = {(e, k) for tagged in delivered.values() for e, k in tagged}
        last = max([plan.epoch + len(plan.carried) - 1] + [e for e, _ in done])
        rests = [[k for k in self.keys_of(plan, e) if (e, k) not in done] for e in range(plan.epoch, last + 1)]
        skip = next((i for i, rest in enumerate(rests) if rest), len(rests))
        return ModelPlan(plan.epoch + skip, rests[skip:])


def read_slots(
    ds: ShardDataset, topology: tuple[int, int], *, epoch: int, state: dict | None, takes: dict[Slot, int | None]
) -> dict[Slot, list[str]]:
    """The keys of the first ``takes[slot]`` items (None: all) of each slot,
    resuming ``state`` (the in-process simulation of a multi-rank run)."""
    world_size, num_workers = topology
    out = {}
    for (rank, worker), take in takes.items():
        world = World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
        samples = ds.iter_slot(world, epoch=epoch, state=state)
        out[rank, worker] = [s["__key__"] for s in itertools.islice(samples, take)]
    return out


def per_epoch(*levels: dict[Slot, list[Tagged]]) -> dict[int, Counter[str]]:
    """How often each key was delivered in each epoch, over all levels."""
    counts: dict[int, Counter[str]] = {}
    for level in levels:
        for tagged in level.values():
            for epoch, key in tagged:
                counts.setdefault(epoch, Counter())[key] += 1
    return counts
