"""The reader state: its format, its checks, and merging rank-local states.

A state is plain JSON data (no sample bytes)::

    {"version": 3, "fingerprint": "...", "shuffle_algorithm": "growing_swap_buffer_v1",
     "options": {"mode": ..., "seed": ..., ...}, "epoch": 3,
     "levels": [{"world_size": 2, "num_workers": 4,
                 "delivered": [[12, 11, 12, 12], null], "next_worker": [1, null]}],
     "mixture": null}

**Versions.** :data:`STATE_VERSION` is 3: version 3 added the ``mixture``
key, a mixture's stream configuration (null for one dataset; see
:mod:`shardkit.read.mixture`), and version 2 the
``shuffle_algorithm`` key, naming the shuffle
(:data:`~shardkit.read.shuffle.SHUFFLE_ALGORITHM`) whose buffers the state's
counts refer to. Restoring replays that shuffle, so a state of another
algorithm is refused with a :class:`~shardkit.StateError` naming both. A
version 1 state (an earlier release, which has no such key) is read as one of
``"swap_buffer_v1"``, the only shuffle that release had; states of versions 1
and 2 are of one dataset. Other versions are refused.

A state at the start of an epoch (no levels) holds no buffer position, so it
does not depend on the shuffle: whatever algorithm it names, it is read as
one of the current :data:`~shardkit.read.shuffle.SHUFFLE_ALGORITHM`. Thus a
checkpoint taken between epochs by a release with another shuffle still
loads; one taken mid-epoch is refused.

History of the shuffle: ``"swap_buffer_v1"`` filled each buffer to its size
before emitting; ``"growing_swap_buffer_v1"`` (current) starts emitting at an
initial fill and grows to its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from shardkit.errors import StateError, UsageError
from shardkit.read.catalog import ShardCatalog
from shardkit.read.options import ReaderOptions
from shardkit.read.shuffle import SHUFFLE_ALGORITHM
from shardkit.world import World, all_gather_objects

#: Version of the state format written; see the module docstring.
STATE_VERSION = 3
#: Versions read (1: before ``shuffle_algorithm`` was recorded; 2: before ``mixture``).
READABLE_VERSIONS = (1, 2, 3)
#: The shuffle a version 1 state was written with (the only one it had).
V1_SHUFFLE_ALGORITHM = "swap_buffer_v1"

KEY_VERSION = "version"
KEY_FINGERPRINT = "fingerprint"
KEY_SHUFFLE_ALGORITHM = "shuffle_algorithm"
KEY_OPTIONS = "options"
KEY_EPOCH = "epoch"
KEY_LEVELS = "levels"
KEY_MIXTURE = "mixture"
#: Keys of a state, exactly.
STATE_KEYS = frozenset(
    {KEY_VERSION, KEY_FINGERPRINT, KEY_SHUFFLE_ALGORITHM, KEY_OPTIONS, KEY_EPOCH, KEY_LEVELS, KEY_MIXTURE}
)
#: Keys of a version 2 state, exactly.
V2_STATE_KEYS = STATE_KEYS - {KEY_MIXTURE}
#: Keys of a version 1 state, exactly.
V1_STATE_KEYS = V2_STATE_KEYS - {KEY_SHUFFLE_ALGORITHM}
_KEYS_OF_VERSION = {1: V1_STATE_KEYS, 2: V2_STATE_KEYS, 3: STATE_KEYS}

KEY_WORLD_SIZE = "world_size"
KEY_NUM_WORKERS = "num_workers"
KEY_DELIVERED = "delivered"
KEY_NEXT_WORKER = "next_worker"
#: Keys of one level, exactly.
LEVEL_KEYS = frozenset({KEY_WORLD_SIZE, KEY_NUM_WORKERS, KEY_DELIVERED, KEY_NEXT_WORKER})

#: Reader options a state depends on (the fields of ReaderOptions, under
#: their names); all must match on restore.
OPTION_KEYS = tuple(f.name for f in fields(ReaderOptions))


@dataclass(frozen=True)
class Level:
    """One topology's progress through an epoch.

    Attributes:
        world_size: Ranks of this level.
        num_workers: DataLoader workers per rank (1 for in-process loading).
        delivered: Per rank, per worker: samples out of that slot's shuffle
            buffer; None where this state does not know (a rank-local state
            holds only its own rank).
        next_worker: Per rank, the worker whose batch the loader would have
            handed out next (so a resumed in-order loader keeps the order
            across workers); None where unknown.
    """

    world_size: int
    num_workers: int
    delivered: tuple[tuple[int | None, ...] | None, ...]
    next_worker: tuple[int | None, ...] = ()

    def first_worker(self, rank: int) -> int:
        """The worker a resumed loader of ``rank`` takes its first batch from."""
        found = self.next_worker[rank] if rank < len(self.next_worker) else None
        return found or 0

    def count(self, rank: int, worker: int) -> int | None:
        """The delivered count of one slot, or None if unknown."""
        entry = self.delivered[rank]
        return None if entry is None else entry[worker]

    @property
    def complete(self) -> bool:
        """Whether every slot's count is known."""
        return all(entry is not None and None not in entry for entry in self.delivered)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-serializable form."""
        return {
            KEY_WORLD_SIZE: self.world_size,
            KEY_NUM_WORKERS: self.num_workers,
            KEY_DELIVERED: [None if e is None else list(e) for e in self.delivered],
            KEY_NEXT_WORKER: list(self.next_worker) if self.next_worker else [None] * self.world_size,
        }


@dataclass(frozen=True)
class ReaderState:
    """A reader's position in an epoch (see :mod:`shardkit.read.resume`).

    Attributes:
        fingerprint: Identifies the dataset's content.
        options: The reader options the state was saved with.
        epoch: The epoch being read.
        levels: Topologies that read parts of the epoch, oldest first; empty
            at the start of an epoch.
        shuffle_algorithm: The shuffle whose buffers the counts refer to.
        mixture: For a mixture of streams, its configuration as JSON data
            (see :mod:`shardkit.read.mixture`); None for one dataset.
    """

    fingerprint: str
    options: ReaderOptions
    epoch: int
    levels: tuple[Level, ...]
    shuffle_algorithm: str = SHUFFLE_ALGORITHM
    mixture: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-serializable form (what ``state_dict()`` returns)."""
        return {
            KEY_VERSION: STATE_VERSION,
            KEY_FINGERPRINT: self.fingerprint,
            KEY_SHUFFLE_ALGORITHM: self.shuffle_algorithm,
            KEY_OPTIONS: saved_options(self.options),
            KEY_EPOCH: self.epoch,
            KEY_LEVELS: [level.to_dict() for level in self.levels],
            KEY_MIXTURE: None if self.mixture is None else dict(self.mixture),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ReaderState:
        """Parse and check a state produced by :meth:`to_dict` (or by the
        previous release, format version 1).

        Raises:
            StateError: Not a mapping, missing or extra keys, values of the
                wrong type or out of range, or an unsupported format version.
        """
        if not isinstance(data, Mapping):
            raise StateError(f"a reader state must be a mapping, not {type(data).__name__}")
        version = data.get(KEY_VERSION)
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise StateError(
                f"reader state version {version!r} is not supported (this shardkit reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}): resume with the shardkit release that saved it"
            )
        expected = _KEYS_OF_VERSION[version]
        keys = set(data)
        if keys != expected:
            raise StateError(_key_problem("reader state", keys, expected))
        fingerprint = data[KEY_FINGERPRINT]
        if not isinstance(fingerprint, str):
            raise StateError(f"reader state: 'fingerprint' must be a string, not {type(fingerprint).__name__}")
        algorithm = data.get(KEY_SHUFFLE_ALGORITHM, V1_SHUFFLE_ALGORITHM)
        if not isinstance(algorithm, str):
            raise StateError(f"reader state: 'shuffle_algorithm' must be a string, got {algorithm!r}")
        epoch = _int(data[KEY_EPOCH], "epoch")
        levels_data = data[KEY_LEVELS]
        if not isinstance(levels_data, list):
            raise StateError(f"reader state: 'levels' must be a list, not {type(levels_data).__name__}")
        levels = tuple(_parse_level(level, i) for i, level in enumerate(levels_data))
        if not levels:
            algorithm = SHUFFLE_ALGORITHM  # no buffer position: the shuffle does not matter
        for i, level in enumerate(levels[:-1]):
            if not level.complete:
                raise StateError(f"reader state: level {i} is not the last one but lacks some slots' counts")
        mixture = data.get(KEY_MIXTURE)
        if mixture is not None and not isinstance(mixture, Mapping):
            raise StateError(f"reader state: 'mixture' must be a mapping or null, not {type(mixture).__name__}")
        return cls(
            fingerprint,
            _parse_options(data[KEY_OPTIONS]),
            epoch,
            levels,
            shuffle_algorithm=algorithm,
            mixture=mixture,
        )


def _parse_options(options: Any) -> ReaderOptions:
    # A state saved before ``batching`` existed read stratified batches.
    if isinstance(options, Mapping) and set(options) == set(OPTION_KEYS) - {"batching"}:
        options = {**options, "batching": "stratified"}
    if not isinstance(options, Mapping) or set(options) != set(OPTION_KEYS):
        raise StateError(
            f"reader state: 'options' must be a mapping with keys {sorted(OPTION_KEYS)}, got {options!r}"
        )
    try:
        return ReaderOptions(**options)
    except (UsageError, TypeError) as exc:
        raise StateError(f"reader state: invalid 'options': {exc}") from exc


def _key_problem(what: str, keys: set[str], expected: frozenset[str]) -> str:
    missing = sorted(expected - keys)
    extra = sorted(keys - expected)
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"unexpected {extra}")
    return f"{what}: {', '.join(parts)}"


def _int(value: Any, name: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StateError(f"reader state: {name!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _parse_level(data: Any, index: int) -> Level:
    if not isinstance(data, Mapping):
        raise StateError(f"reader state: level {index} must be a mapping, not {type(data).__name__}")
    if set(data) != LEVEL_KEYS:
        raise StateError(_key_problem(f"reader state level {index}", set(data), LEVEL_KEYS))
    world_size = _int(data[KEY_WORLD_SIZE], f"levels[{index}].world_size", minimum=1)
    num_workers = _int(data[KEY_NUM_WORKERS], f"levels[{index}].num_workers", minimum=1)
    delivered = data[KEY_DELIVERED]
    if not isinstance(delivered, list) or len(delivered) != world_size:
        raise StateError(
            f"reader state: levels[{index}].delivered must be a list of {world_size} entries (one per rank)"
        )
    entries: list[tuple[int | None, ...] | None] = []
    for rank, entry in enumerate(delivered):
        if entry is None:
            entries.append(None)
            continue
        if not isinstance(entry, list) or len(entry) != num_workers:
            raise StateError(
                f"reader state: levels[{index}].delivered[{rank}] must be null or a list of {num_workers} counts"
            )
        entries.append(
            tuple(None if c is None else _int(c, f"levels[{index}].delivered[{rank}]") for c in entry)
        )
    next_worker = data[KEY_NEXT_WORKER]
    if not isinstance(next_worker, list) or len(next_worker) != world_size:
        raise StateError(f"reader state: levels[{index}].next_worker must be a list of {world_size} entries")
    for rank, worker in enumerate(next_worker):
        if worker is not None and (_int(worker, f"levels[{index}].next_worker[{rank}]") >= num_workers):
            raise StateError(f"reader state: levels[{index}].next_worker[{rank}] must be < {num_workers}")
    return Level(
        world_size=world_size, num_workers=num_workers, delivered=tuple(entries), next_worker=tuple(next_worker)
    )


def require_index(catalog: ShardCatalog) -> np.ndarray:
    """A catalog's per-shard sample counts, checking its offset indexes exist.

    Raises:
        UsageError: Without them (no manifest and no ``.idx`` sidecars).
    """
    counts = catalog.counts
    if counts is None or not catalog.has_indexes:
        raise UsageError(
            "checkpoint/resume needs per-shard sample counts and offset indexes: read a dataset with a "
            "manifest (or .idx sidecars); index published shards in place with `shardkit index SOURCE`"
        )
    return counts


def dataset_fingerprint(catalog: ShardCatalog) -> str:
    """The fingerprint a state of ``catalog``'s dataset carries.

    Raises:
        UsageError: The catalog has no sample counts and offset indexes.
    """
    require_index(catalog)
    return catalog.fingerprint


def saved_options(options: ReaderOptions) -> dict[str, Any]:
    """The options as a state holds them: ``batching`` only when it is not
    the default, so that a stratified reader's state is what a shardkit from
    before per-stream batches saved, and reads (see :func:`_parse_options`)."""
    out = options.to_dict()
    if out["batching"] == "stratified":
        del out["batching"]
    return out


def saved_before_removal(epoch: int, what: str = "this dataset") -> StateError:
    """The refusal of a state saved before samples were removed from
    ``what`` (``shardkit remove``): it counts positions among samples that
    are gone, and the reader numbers samples without them, so it resumes
    nothing exactly; the epoch is started afresh instead."""
    return StateError(
        f"reader state was saved before samples were removed from {what} (`shardkit remove`): its positions "
        "count samples that are now gone, so it cannot resume here. Start its epoch afresh instead: "
        f"dataset.set_epoch({epoch}) without load_state_dict (the removed samples are left out; what that "
        "epoch had already delivered is read again), or set_epoch of the next epoch"
    )


def check_compatible(
    state: ReaderState, *, fingerprint: str, options: ReaderOptions, earlier: Sequence[str] = ()
) -> None:
    """Refuse a state from another dataset, shuffle algorithm or reader options.

    Args:
        state: The state.
        fingerprint: The fingerprint it must carry.
        options: The reader's options.
        earlier: The dataset's fingerprints before samples were removed
            from it (:func:`saved_before_removal`).

    Raises:
        StateError: Naming the mismatch and what to do.
    """
    if state.fingerprint in earlier:
        raise saved_before_removal(state.epoch)
    if state.fingerprint != fingerprint:
        raise StateError(
            f"reader state is from another dataset: its manifest fingerprint is {state.fingerprint[:16]}..., "
            f"this dataset's is {fingerprint[:16]}... Restore it with the dataset it was saved from."
        )
    if state.shuffle_algorithm != SHUFFLE_ALGORITHM:
        raise StateError(
            f"reader state was saved with shuffle algorithm {state.shuffle_algorithm!r}, but this shardkit "
            f"shuffles with {SHUFFLE_ALGORITHM!r}, so the saved buffers cannot be rebuilt. Resume with the "
            "shardkit release that saved the state, or start the epoch afresh without loading it."
        )
    for key in OPTION_KEYS:
        saved, ours = getattr(state.options, key), getattr(options, key)
        if saved != ours:
            raise StateError(
                f"reader state was saved with {key}={saved!r} but this dataset has "
                f"{key}={ours!r}; create the dataset with the same {key} to resume"
            )


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine rank-local states (one per rank, as each rank's loader saves
    them) into one state that knows every slot, which resuming with a
    different world size or worker count needs.

    Raises:
        StateError: Malformed states, or states of different epochs,
            datasets, shuffle algorithms, options or earlier levels.
    """
    parsed = [ReaderState.from_dict(s) for s in states]
    if not parsed:
        raise StateError("merge_states needs at least one state")
    first = parsed[0]
    if any(len(s.levels) == 0 for s in parsed):
        if all(len(s.levels) == 0 for s in parsed) and all(s.epoch == first.epoch for s in parsed):
            return first.to_dict()
        raise StateError("cannot merge a state at the start of an epoch with states in the middle of one")
    for other in parsed[1:]:
        for what, a, b in (
            ("fingerprint", first.fingerprint, other.fingerprint),
            ("shuffle algorithm", first.shuffle_algorithm, other.shuffle_algorithm),
            ("options", first.options.to_dict(), other.options.to_dict()),
            ("epoch", first.epoch, other.epoch),
            ("earlier levels", first.levels[:-1], other.levels[:-1]),
        ):
            if a != b:
                raise StateError(f"cannot merge reader states with different {what}: {a!r} vs {b!r}")
    last = first.levels[-1]
    merged: list[list[int | None] | None] = [None] * last.world_size
    turns: list[int | None] = [None] * last.world_size
    for state in parsed:
        level = state.levels[-1]
        if state.mixture != first.mixture:
            raise StateError("cannot merge reader states of different mixtures")
        if (level.world_size, level.num_workers) != (last.world_size, last.num_workers):
            raise StateError("cannot merge reader states of different world sizes or worker counts")
        for rank, entry in enumerate(level.delivered):
            if entry is None:
                continue
            if level.next_worker[rank] is not None:
                turns[rank] = level.next_worker[rank]
            slot = merged[rank]
            if slot is None:
                slot = merged[rank] = [None] * last.num_workers
            for worker, count in enumerate(entry):
                if count is None:
                    continue
                if slot[worker] is not None and slot[worker] != count:
                    raise StateError(
                        f"reader states disagree on rank {rank} worker {worker}: {slot[worker]} vs {count}"
                    )
                slot[worker] = count
    level = Level(
        world_size=last.world_size,
        num_workers=last.num_workers,
        delivered=tuple(None if e is None else tuple(e) for e in merged),
        next_worker=tuple(turns),
    )
    levels = first.levels[:-1] + (level,)
    return ReaderState(
        first.fingerprint, first.options, first.epoch, levels, first.shuffle_algorithm, mixture=first.mixture
    ).to_dict()


def gather_states(state: Mapping[str, Any]) -> dict[str, Any]:
    """Every rank's state merged into one (see :func:`merge_states`).

    A collective under ``torch.distributed``: call it on every rank at the
    same step. Returns ``state`` unchanged when not distributed.
    """
    return merge_states(all_gather_objects(dict(state)))  # type: ignore[arg-type]


def rank_local_level(world: World, counts: Iterable[int | None], *, next_worker: int = 0) -> Level:
    """A level that knows one rank's workers' counts."""
    delivered: list[tuple[int | None, ...] | None] = [None] * world.world_size
    delivered[world.rank] = tuple(counts)
    turns: list[int | None] = [None] * world.world_size
    turns[world.rank] = next_worker
    return Level(
        world_size=world.world_size, num_workers=world.num_workers, delivered=tuple(delivered), next_worker=tuple(turns)
    )


def rank_state(
    fingerprint: str,
    options: ReaderOptions,
    epoch: int,
    *,
    base: tuple[Level, ...],
    world: World,
    counts: Iterable[int | None],
    next_worker: int = 0,
    mixture: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The state one rank saves: ``base`` levels, then a level holding
    ``world``'s rank with its workers' delivered ``counts`` (None where
    unknown) and the worker its loader takes the next batch from."""
    levels = base + (rank_local_level(world, counts, next_worker=next_worker),)
    return ReaderState(fingerprint, options, epoch, levels, mixture=mixture).to_dict()


def start_for(state: ReaderState, world: World) -> tuple[tuple[Level, ...], int]:
    """Where a slot starts when resuming ``state`` (in any mode).

    Returns:
        The levels before the slot's own (their remainder is what the slot's
        level splits) and the slot's delivered count within its level.

    Raises:
        StateError: The state lacks the slot's count (same topology), or
            lacks other slots' counts (another topology).
    """
    if not state.levels:
        return (), 0
    last = state.levels[-1]
    if (last.world_size, last.num_workers) == (world.world_size, world.num_workers):
        count = last.count(world.rank, world.worker)
        if count is None:
            raise StateError(
                f"reader state has no position for rank {world.rank}, worker {world.worker}: restore each rank "
                "from its own state, or from merge_states() of all ranks' states"
            )
        return state.levels[:-1], count
    if not last.complete:
        known = [r for r, e in enumerate(last.delivered) if e is not None]
        raise StateError(
            f"resuming with {world.world_size} ranks x {world.num_workers} workers a state saved with "
            f"{last.world_size} x {last.num_workers} needs every old rank's position, but this state holds "
            f"ranks {known}: combine all ranks' states with shardkit.read.resume.merge_states() "
            "(or gather_states() under torch.distributed)"
        )
    return state.levels, 0
