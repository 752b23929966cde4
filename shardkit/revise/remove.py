"""Removing samples from a dataset without rewriting its shards
(``shardkit remove``, :func:`remove_samples`; the format is
:mod:`shardkit.format.removed`).

Three steps, each safe to stop at:

1. **Find.** Every shard is read once, as ``shardkit verify`` reads it (in
   ``workers`` processes), and each sample's key is looked up in the keys
   given; a match is the sample's place ``(shard, stored position)``. The
   samples removed before are found again and counted as such. Memory holds
   the keys and the matches, never a shard's samples beyond one chunk.
2. **Revise.** The shard table gets a new revision: the kept counts, the
   token totals less the removed samples' (read from the offset indexes),
   and the ``removed`` column, the old removals and the new.
3. **Publish.** The new table under its own content name, then
   ``manifest.json`` replaced in one rename (the commit point: a reader, or
   a crash, sees the old revision or the new one), then the table no
   manifest names removed (:func:`~shardkit.revise.publish.publish_revision`).
   The shards and their indexes are not touched.

Keys given that no sample has are reported (the first :data:`LISTED_MISSING`
of them, and how many); removing keys already removed changes nothing, and
nothing is written when nothing new is removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from shardkit.errors import ManifestError, UsageError
from shardkit.format.derived import DerivedManifest
from shardkit.format.manifest import Manifest
from shardkit.format.removed import MAX_POSITION, Removed, pack, unpack
from shardkit.format.tar import SampleParser
from shardkit.io.base import SourceOptions
from shardkit.io.index import fetch_document_tokens, fetch_offset_index
from shardkit.io.local import HASH_CHUNK_BYTES
from shardkit.io.registry import open_source
from shardkit.io.urls import is_local, redact_url
from shardkit.write.pool import group_size, in_groups, run_in_pool
from shardkit.revise.derived_remove import remove_from_derived
from shardkit.revise.keys import DEFAULT_KEY_COLUMN, read_keys  # noqa: F401 - remove's keys files, named here too
from shardkit.revise.publish import publish_revision, revising

#: Keys not found that a report lists (all are counted).
LISTED_MISSING = 100
#: Most shards in one task of the pool.
_MAX_GROUP = 16
_GROUPS_PER_WORKER = 8


@dataclass(frozen=True)
class RemovalReport:
    """What :func:`remove_samples` did.

    Attributes:
        location: The dataset.
        num_keys: Distinct keys given.
        num_removed: Samples removed now.
        num_already_removed: Samples of the keys that an earlier removal had
            taken out.
        num_missing: Keys no sample has.
        missing: The first :data:`LISTED_MISSING` of them, sorted.
        num_removed_total: Samples removed from the dataset in all, now.
        num_samples: Samples the dataset holds now.
        fingerprint: The dataset's fingerprint now (a new one when samples
            were removed).
    """

    location: str
    num_keys: int
    num_removed: int
    num_already_removed: int
    num_missing: int
    missing: tuple[str, ...]
    num_removed_total: int
    num_samples: int
    fingerprint: str

    @property
    def changed(self) -> bool:
        """Whether a new revision was published."""
        return self.num_removed > 0


def remove_samples(
    dest: str,
    keys: Iterable[str],
    *,
    options: SourceOptions | None = None,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> RemovalReport:
    """Remove the samples of ``keys`` from the dataset at ``dest`` without
    touching its shards (see the module docstring).

    Args:
        dest: A local dataset folder: one ``shardkit write`` made, or a local
            index of published shards (``shardkit index URL --out DIR``).
        keys: The samples' keys (``__key__``).
        options: How to read the shards (remote ones, for an index).
        workers: Processes reading shards.
        progress: Called with each shard's size in bytes as it is read.

    Returns:
        What was removed and which keys were not found.

    Raises:
        UsageError: ``dest`` is not a local dataset, or its shards have no
            offset indexes (compressed shards); a bad ``workers``.
        ManifestError: The manifest cannot be loaded.
        CorruptShardError: A shard or index is damaged (nothing is written).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a whole number of at least 1, not {workers!r}")
    options = options or SourceOptions()
    with revising(dest, command="remove") as manifest:
        if isinstance(manifest, DerivedManifest):  # a view or an extension: removed from it alone
            return RemovalReport(**remove_from_derived(dest, manifest, keys, options, workers))
        return _remove(dest, manifest, keys, options, workers, progress)


def _remove(
    dest: str, manifest: Manifest, keys: Iterable[str], options: SourceOptions, workers: int,
    progress: Callable[[int], None] | None,
) -> RemovalReport:
    """:func:`remove_samples` once ``dest`` is held and ``manifest`` loaded."""
    wanted = {str(k) for k in keys}
    found: list[tuple[int, int, str]] = []
    for hits in _find(manifest, wanted, options, workers, progress):
        found.extend(hits)
    old = Removed(manifest.table.removed).packed
    hit_keys = {key for _, _, key in found}
    missing = sorted(wanted - hit_keys)
    packed = pack([s for s, _, _ in found], [p for _, p, _ in found]) if found else np.zeros(0, dtype=np.uint64)
    new = np.setdiff1d(packed, old, assume_unique=True)
    report = dict(
        location=manifest.location or dest, num_keys=len(wanted), num_removed=len(new),
        num_already_removed=len(packed) - len(new), num_missing=len(missing),
        missing=tuple(missing[:LISTED_MISSING]),
    )  # fmt: skip
    if not len(new):
        return RemovalReport(**report, num_removed_total=len(old), num_samples=manifest.num_samples,
                             fingerprint=manifest.fingerprint)  # fmt: skip
    revised = _revise(manifest, old, new, options)
    publish_revision(dest, manifest, revised)
    return RemovalReport(**report, num_removed_total=revised.num_removed, num_samples=revised.num_samples,
                         fingerprint=revised.fingerprint)  # fmt: skip


def _revise(manifest: Manifest, old: np.ndarray, new: np.ndarray, options: SourceOptions) -> Manifest:
    """``manifest`` with the samples ``new`` (packed) removed as well as ``old``."""
    table = manifest.table
    shards, positions = unpack(new)
    counts = np.array(table.counts, dtype=np.int64)
    counts -= np.bincount(shards, minlength=table.num_shards)
    tokens = None
    if table.tokens is not None:
        tokens = np.array(table.tokens, dtype=np.int64)
        earlier = Removed(old)
        for shard in np.unique(shards).tolist():
            gone = earlier.in_shard(shard)
            rows = fetch_document_tokens(
                manifest.index_url(shard, allowed_prefixes=options.allowed_prefixes),
                num_samples=earlier.stored_count(table.counts, shard), totals=table.tokens[shard], options=options,
                check_totals=False,
            )
            kept = np.delete(rows, gone, axis=0).sum(axis=0)
            if not np.array_equal(kept, table.tokens[shard]):
                raise ManifestError(
                    f"{manifest.name}: shard {shard}'s offset index counts {kept.tolist()} tokens, its table "
                    f"{table.tokens[shard].tolist()}: run `shardkit verify` on the dataset before removing samples",
                    path=manifest.location,
                )
            tokens[shard] -= rows[positions[shards == shard]].sum(axis=0)
    revised = table.revised(counts, tokens=tokens, removed=np.union1d(old, new).astype(np.uint64))
    return dataclasses.replace(
        manifest,
        shards=revised,
        stored_fingerprint=removed_fingerprint(manifest.fingerprint, new),
        # A state saved from any revision so far counts samples now gone; one
        # from before an append no longer reads as that revision's prefix.
        earlier_fingerprints=(*manifest.earlier_fingerprints, *(a.fingerprint for a in manifest.appended), manifest.fingerprint),
        appended=(),
    )


def removed_fingerprint(before: str, new: np.ndarray) -> str:
    """The fingerprint of the revision that removes the samples ``new``
    (packed) from the revision whose fingerprint is ``before``: a chain, as
    an append's (:func:`~shardkit.format.appended.appended_fingerprint`), so
    it costs the removals, not a Python pass over every shard."""
    digest = hashlib.sha256(f"shardkit remove\0{before}\0".encode())
    digest.update(np.ascontiguousarray(new, dtype="<u8").tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------ finding


def _find(
    manifest: Manifest, keys: set[str], options: SourceOptions, workers: int, progress: Callable[[int], None] | None
) -> Iterator[list[tuple[int, int, str]]]:
    """Per shard, ``(shard, stored position, key)`` of its samples whose key is in ``keys``."""
    removed = Removed(manifest.table.removed)
    numbers = [n for n in range(manifest.num_shards) if removed.stored_count(manifest.table.counts, n)]
    if not keys or not numbers:
        return
    if workers == 1 or len(numbers) < 2:
        for number in numbers:
            yield find_in_shard(manifest, number, keys, options)
            if progress is not None:
                progress(int(manifest.table.num_bytes[number]))
        return
    size = group_size(len(numbers), workers, most=_MAX_GROUP, per_worker=_GROUPS_PER_WORKER)
    for number, hits in run_in_pool(
        _find_in_worker, in_groups(numbers, size), min(workers, len(numbers)),
        initializer=_start_worker, initargs=(manifest, keys, options),
    ):  # fmt: skip
        yield hits
        if progress is not None:
            progress(int(manifest.table.num_bytes[number]))


def find_in_shard(manifest: Manifest, number: int, keys: set[str], options: SourceOptions) -> list[tuple[int, int, str]]:
    """``(number, stored position, key)`` of shard ``number``'s samples whose
    key is in ``keys``, read once through its offset index.

    Raises:
        UsageError: The dataset's shards have no offset indexes.
        CorruptShardError: The shard or its index is damaged.
    """
    allowed = options.allowed_prefixes
    url = manifest.shard_url(number, allowed_prefixes=allowed)
    entry = manifest.table.entry(number)
    stored = Removed(manifest.table.removed).stored_count(manifest.table.counts, number)
    if stored > MAX_POSITION:
        raise UsageError(f"{redact_url(url)}: {stored:,} samples in one shard, more than samples can be removed from")
    index = fetch_offset_index(
        manifest.index_url(number, allowed_prefixes=allowed), num_samples=stored, shard_bytes=entry.num_bytes,
        options=options,
    )
    parser = SampleParser(path=url, bounds=index.bounds)
    source = open_source(url, options=options, expected_size=entry.num_bytes)
    out: list[tuple[int, int, str]] = []
    position = 0
    for chunk in source.iter_range(0, None, chunk_bytes=HASH_CHUNK_BYTES if is_local(url) else options.chunk_bytes):
        for raw in parser.feed(chunk):
            if raw.key in keys:
                out.append((number, position, raw.key))
            position += 1
    for raw in parser.finish():
        if raw.key in keys:
            out.append((number, position, raw.key))
        position += 1
    return out


#: What :func:`_start_worker` gave this worker process: (manifest, keys, options).
_job: tuple[Manifest, set[str], SourceOptions] | None = None


def _start_worker(manifest: Manifest, keys: set[str], options: SourceOptions) -> None:
    global _job
    _job = (manifest, keys, options)


def _find_in_worker(numbers: list[int]) -> list[tuple[int, list[tuple[int, int, str]]]]:
    assert _job is not None
    manifest, keys, options = _job
    return [(number, find_in_shard(manifest, number, keys, options)) for number in numbers]
