"""The write's journal in ``DEST/.shardkit-journal/``: one record per finished shard.

A record holds the shard's task fingerprint, its manifest entry and the
inputs skipped while writing it. A resumed run reuses a shard whose file and
index are intact and whose record matches the new plan's fingerprint (or,
after a complete run, whose manifest entry matches). The work folder also
holds the scan's spills (``scan/``) and the plan (``plan/``); it is removed
once the manifest is in place.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shardkit.format.index import index_path_for
from shardkit.format.manifest import SKIPPED_LISTED, ShardEntry, SkippedInput, load_manifest, skip_category
from shardkit.format.table import TABLE_NAME
from shardkit.format.tokens import dataset_tokens
from shardkit.io.atomic import TMP_SUFFIX, atomic_write_bytes, remove_quietly
from shardkit.io.local import file_sha256
from shardkit.write.destination import JOURNAL_DIR, is_shardkit_name
from shardkit.write.plan import ShardTask


@dataclass(frozen=True)
class ShardResult:
    """What writing one shard produced."""

    index: int
    entry: ShardEntry
    fingerprint: str
    skipped: tuple[SkippedInput, ...] = ()
    reused: bool = False
    #: The shard's token fields and their totals (see :mod:`shardkit.format.tokens`).
    token_fields: tuple[str, ...] = ()
    token_totals: tuple[int, ...] = ()


def recorded_tokens(results: Sequence[ShardResult]) -> tuple[tuple[str, ...], np.ndarray | None]:
    """The token fields a write records and its table's ``tokens`` column
    (:func:`~shardkit.format.tokens.dataset_tokens`), from its shards'
    results in table order."""
    return dataset_tokens(
        [r.token_fields for r in results], [r.token_totals for r in results],
        [r.entry.num_samples for r in results], [r.entry.path for r in results],
    )


class SkipTally:
    """Every skipped input of a write, counted by category, and the first
    ``limit`` in source order kept (what the manifest records): the driver's
    memory does not grow with the number of inputs left out.

    Source order: by path, then by row for a table's ``PATH#row=N``; inputs
    of equal position keep the order they were added in (a scan's, then the
    shards')."""

    def __init__(self, limit: int | None = None):
        self.limit = SKIPPED_LISTED if limit is None else limit
        self.counts: collections.Counter[str] = collections.Counter()
        self._kept: list[tuple[tuple[str, int], int, SkippedInput]] = []
        self._added = 0

    def add(self, items: Iterable[SkippedInput]) -> None:
        for item in items:
            self.counts[skip_category(item.reason)] += 1
            self._kept.append((_source_position(item), self._added, item))
            self._added += 1
        if len(self._kept) > 2 * self.limit:
            self._trim()

    def _trim(self) -> None:
        self._kept.sort(key=lambda kept: kept[:2])
        del self._kept[self.limit :]

    def listed(self) -> tuple[SkippedInput, ...]:
        """The first ``limit`` skipped inputs, in source order."""
        self._trim()
        return tuple(item for _, _, item in self._kept)

    def counts_if_partial(self) -> dict[str, int] | None:
        """The counts by category when :meth:`listed` leaves some out, else None."""
        return dict(self.counts) if self._added > self.limit else None


def _source_position(item: SkippedInput) -> tuple[str, int]:
    """Where a skipped input stands in the source: its path, then its row (``PATH#row=N``)."""
    path, marker, row = item.path.rpartition("#row=")
    return (path, int(row)) if marker and row.isdigit() else (item.path, -1)


def _journal_path(dest: str, task_name: str) -> str:
    return os.path.join(dest, JOURNAL_DIR, task_name + ".json")


def journal_record(dest: str, result: ShardResult) -> None:
    os.makedirs(os.path.join(dest, JOURNAL_DIR), exist_ok=True)
    record = {
        "fingerprint": result.fingerprint,
        "entry": asdict(result.entry),
        "skipped": [asdict(s) for s in result.skipped],
    }
    if result.token_fields:
        record["tokens"] = dict(zip(result.token_fields, result.token_totals))
    atomic_write_bytes(_journal_path(dest, result.entry.path), json.dumps(record, sort_keys=True).encode())


#: A finished shard's manifest entry and token counts (field -> total), by its name.
Finished = Callable[[str], "tuple[ShardEntry, dict[str, int]] | None"]


def reusable_result(dest: str, task: ShardTask, finished: Finished) -> ShardResult | None:
    """The result of a finished shard from an earlier run, if it is intact."""
    path = os.path.join(dest, task.name)
    if not os.path.isfile(path) or not os.path.isfile(index_path_for(path)):
        return None
    skipped: tuple[SkippedInput, ...] = ()
    try:
        with open(_journal_path(dest, task.name), "rb") as f:
            record = json.load(f)
        if record["fingerprint"] != task.fingerprint:
            return None
        entry = ShardEntry(**record["entry"])
        skipped = tuple(SkippedInput(**s) for s in record["skipped"])
        tokens = {str(k): int(v) for k, v in record.get("tokens", {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        found = finished(task.name)  # a completed run: trust its manifest entry
        if found is None:
            return None
        entry, tokens = found
    if os.path.getsize(path) != entry.num_bytes or file_sha256(path) != entry.sha256:
        return None
    return ShardResult(
        task.index, entry, task.fingerprint, skipped, reused=True, token_fields=tuple(tokens),
        token_totals=tuple(tokens.values()),
    )


def finished_entries(dest: str, source_info: dict, options: Any) -> Finished:
    """Looks up shard entries and token counts (by name) of a complete
    earlier run with the same source and options, in its manifest of any format."""
    try:
        old = load_manifest(dest)
    except (OSError, ValueError):
        return lambda name: None
    if dict(old.source) != source_info or dict(old.options) != options.recorded() or old.seed != (options.seed if options.shuffle else None):
        return lambda name: None
    table = old.table

    def lookup(name: str) -> tuple[ShardEntry, dict[str, int]] | None:
        match = _SHARD_NUMBER.match(name)
        shard = -1 if match is None else int(match.group(1)) - options.first_shard
        if not 0 <= shard < table.num_shards:
            return None
        entry = table.entry(shard)
        totals = [] if table.tokens is None else table.tokens[shard].tolist()
        return (entry, dict(zip(old.token_fields, totals))) if entry.path == name else None

    return lookup


_SHARD_NUMBER = re.compile(r"^shard-(\d{6,})\.tar$")


def remove_stale(dest: str, keep: set[str]) -> None:
    """Drop temporaries and shards of an earlier run that the plan no longer has."""
    for name in os.listdir(dest):
        path = os.path.join(dest, name)
        stale_tmp = name.endswith(TMP_SUFFIX)
        stale_shard = name.startswith("shard-") and name.endswith((".tar", ".idx"))
        if TABLE_NAME.match(name):
            continue  # the manifest that names it may still be there; publishing removes stale tables
        stem = name[: -len(".idx")] + ".tar" if name.endswith(".idx") else name
        if stale_tmp or (stale_shard and stem not in keep):
            os.unlink(path)


def remove_temporaries(dest: str) -> None:
    """Remove the temporary files of shardkit's own outputs in ``dest``
    (shards, indexes, manifest, journal records) after a failed run."""
    work = os.path.join(dest, JOURNAL_DIR)
    for folder in (dest, work, os.path.join(work, "scan"), os.path.join(work, "plan")):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.endswith(TMP_SUFFIX) and (folder != dest or is_shardkit_name(name)):
                remove_quietly(os.path.join(folder, name))


def clear_journal(dest: str) -> None:
    shutil.rmtree(os.path.join(dest, JOURNAL_DIR), ignore_errors=True)


#: The folder in DEST's work area that holds the plain copies of input
#: shards compressed whole (see :func:`unpack_folder`).
UNPACK_DIR = "unpack"


@contextlib.contextmanager
def unpack_folder(work: str) -> Iterator[str]:
    """The folder, in DEST's work area ``work``, for the plain copies of
    input shards compressed whole; made by the first copy (a write without
    compressed inputs makes none) and removed when the block ends. Copies a
    killed write left there are removed first (a resumed scan makes its own):
    everything a write leaves behind stays inside DEST, and goes with it."""
    folder = os.path.join(work, UNPACK_DIR)
    shutil.rmtree(folder, ignore_errors=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
