"""``shardkit append DEST SOURCE``: new data as new shards after the
dataset's last, published as one new revision (:func:`append`).

Three steps, each safe to stop at (``kill -9`` included); running the same
append again goes on where it stopped:

1. **Stage.** SOURCE is written by the writer itself (scan, plan, run,
   publish: any source, ``map``, either engine, byte-reproducible) into
   ``DEST/.shardkit-append/stage``, its shards numbered after DEST's last
   (``shard-000120.tar``... after 120 shards). The staging write has its own
   journal, so a killed append resumes it; ``DEST/.shardkit-append/base.json``
   records the revision it appends to.
2. **Link.** Each staged shard and offset index is hard-linked into DEST
   under its final name, one that no shard of DEST has.
3. **Publish.** DEST's shard table with the staged rows after its own
   (:func:`~shardkit.format.appended.appended_table`), the revision before
   recorded under ``"appended"`` in the manifest, published as a revision
   (:func:`~shardkit.revise.publish.publish_revision`); then the staging
   folder goes. A reader, or a crash, sees the old revision or the new one.

DEST's shards, offset indexes and (until step 3) manifest are never
touched. Keys repeated within the new data are refused, as ``write``
refuses them. The new keys are **not** checked against DEST's: that would
read the tar headers of every shard DEST has (what ``shardkit verify``
costs), where an append costs what its new data costs. The new samples must
agree with DEST on what readers rely on: the same class names (labels are
their positions), member compression and token fields.

A reader state saved before an append resumes the rest of its epoch over
the shards it knew; the next epoch reads every shard (see
:mod:`shardkit.format.appended`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import DestinationError, UsageError
from shardkit.format.appended import Appended, appended_fingerprint, appended_table
from shardkit.format.manifest import Manifest
from shardkit.io.atomic import atomic_write_bytes
from shardkit.io.urls import local_path
from shardkit.revise.publish import publish_revision, revising
from shardkit.write.occupant import source_name
from shardkit.write.options import WriteOptions
from shardkit.write.parallel import Progress, WriteReport, write_dataset
from shardkit.write.scan import ScanProgress

#: The append's work folder in DEST.
APPEND_DIR = ".shardkit-append"
_BASE, _STAGE = "base.json", "stage"


@dataclass(frozen=True)
class AppendReport:
    """What :func:`append` did.

    Attributes:
        manifest: The dataset's manifest now.
        num_shards: Shards appended.
        num_samples: Samples appended.
        fingerprint_before: The fingerprint of the revision appended to.
        write: The staging write's report (its skipped inputs, map counts,
            shards written or reused); None when a rerun found the append
            already published.
    """

    manifest: Manifest
    num_shards: int
    num_samples: int
    fingerprint_before: str
    write: WriteReport | None


def append(
    dest: str,
    source: str | Sequence,
    *,
    map: Callable[[Any], Any] | None = None,
    options: WriteOptions | None = None,
    progress: Callable[[Progress], None] | None = None,
    scan_progress: Callable[[ScanProgress], None] | None = None,
    again: bool = False,
) -> AppendReport:
    """Append ``source``'s samples to the dataset at ``dest`` as new shards
    (see the module docstring).

    Args:
        dest: A local dataset folder whose shards are in it (``shardkit
            write``'s; not an index whose shards live elsewhere).
        source: What ``write_dataset`` takes: a path, or a Python sequence
            with ``map``.
        map: As ``write_dataset``'s.
        options: The write options of the new shards (``max_samples``,
            ``seed``, ``workers``, ``engine``...); ``resume`` and
            ``overwrite`` are the append's own business and must be unset.
        progress, scan_progress: As ``write_dataset``'s.
        again: Append shards whose contents an earlier append of this
            dataset already added (the same data written the same way):
            refused without it, as a rerun of a finished append that would
            hold every sample twice.

    Returns:
        An :class:`AppendReport`.

    Raises:
        UsageError: ``dest`` is a URL, or ``resume``/``overwrite`` given, or
            the same data was appended before and ``again`` is not set.
        DestinationError: ``dest`` changed since an interrupted append began,
            the new samples disagree with it (class names, compression,
            token fields), or a shard name is taken.
        ManifestError: ``dest`` holds no dataset.
        Whatever ``write_dataset`` raises for the new data.
    """
    options = options or WriteOptions()
    if options.resume or options.overwrite:
        raise UsageError("append resumes an interrupted append by itself and never replaces data: leave resume and overwrite unset")
    with revising(dest, command="append") as manifest:
        return _append(local_path(str(dest)), manifest, source, map, options, progress, scan_progress, again)


def _append(
    folder: str, manifest: Manifest, source: str | Sequence, map: Callable[[Any], Any] | None, options: WriteOptions,
    progress: Callable[[Progress], None] | None, scan_progress: Callable[[ScanProgress], None] | None, again: bool,
) -> AppendReport:
    if manifest.shards_base is not None:
        raise DestinationError(
            f"{folder}: this index's shards live in {manifest.shards_base}, not beside it, so new shards have no "
            "place among them: write the new data as a dataset of its own and read both as a mixture",
            path=folder,
        )
    work = os.path.join(folder, APPEND_DIR)
    stage = os.path.join(work, _STAGE)
    base = {"fingerprint": manifest.fingerprint, "num_shards": manifest.num_shards}
    recorded = _read_base(work)
    if recorded is not None and recorded != base:
        last = manifest.appended[-1] if manifest.appended else None
        if last is not None and (last.fingerprint, last.num_shards) == (recorded["fingerprint"], recorded["num_shards"]):
            shutil.rmtree(work, ignore_errors=True)  # published, killed before it cleaned up
            added = manifest.num_shards - recorded["num_shards"]
            num_samples = int(np.asarray(manifest.table.counts[recorded["num_shards"]:]).sum())
            return AppendReport(manifest, added, num_samples, recorded["fingerprint"], None)
        raise DestinationError(
            f"{folder}: holds an interrupted append to the revision {recorded['fingerprint'][:16]}... "
            f"({recorded['num_shards']} shards), and the dataset has changed since (now {manifest.fingerprint[:16]}..., "
            f"{manifest.num_shards} shards); remove {work} to drop that append, then append again",
            path=folder,
        )
    first = _first_shard(manifest)
    os.makedirs(work, exist_ok=True)
    atomic_write_bytes(os.path.join(work, _BASE), json.dumps(base, sort_keys=True).encode())
    staged_options = dataclasses.replace(options, first_shard=first, resume=os.path.isdir(stage))
    try:
        report = write_dataset(source, stage, map=map, options=staged_options, progress=progress,
                               scan_progress=scan_progress)  # fmt: skip
    except DestinationError as exc:
        if recorded is None:
            raise
        raise DestinationError(
            f"{folder}: holds an interrupted append of other data or options ({exc}); rerun that append to "
            f"finish it, or remove {work} to drop it",
            path=folder,
        ) from None
    staged = report.manifest
    note = _appended_note(source, staged)
    try:
        _check_agrees(manifest, staged, folder)
        if not again:
            _refuse_twice(manifest, note, folder)
    except (DestinationError, UsageError):
        shutil.rmtree(work, ignore_errors=True)  # nothing was linked or published
        raise
    _link(staged, stage, folder)
    revised = dataclasses.replace(
        manifest,
        shards=appended_table(manifest.table, staged.table),
        extensions=tuple(sorted(set(manifest.extensions) | set(staged.extensions))),
        stored_fingerprint=appended_fingerprint(manifest.fingerprint, staged.table),
        appended=(*manifest.appended, Appended(manifest.fingerprint, manifest.num_shards, note)),
    )
    publish_revision(folder, manifest, revised)
    shutil.rmtree(work, ignore_errors=True)
    return AppendReport(revised, staged.num_shards, staged.num_samples, manifest.fingerprint, report)


def _appended_note(source: str | Sequence, staged: Manifest) -> str:
    """What the manifest records of an append: the source as given, and a
    digest of the new shards' contents (their checksums and counts, not
    their names): the same data written the same way gives the same digest,
    whatever shard number it began at."""
    table = staged.table
    digest = hashlib.sha256(np.ascontiguousarray(table.sha256).tobytes() + np.ascontiguousarray(table.counts).tobytes())
    return f"{source_name(source)} #{digest.hexdigest()[:16]}"


def _refuse_twice(manifest: Manifest, note: str, folder: str) -> None:
    """Refuse new shards whose contents an earlier append already added, to
    the byte (a finished append run again would add every sample a second
    time: the new keys are not checked against the dataset's)."""
    digest = note.rpartition(" #")[2]
    for number, earlier in enumerate(manifest.appended):
        if earlier.source.rpartition(" #")[2] == digest:
            raise UsageError(
                f"{folder}: {note.rpartition(' #')[0]} was appended to this dataset already (append {number + 1} of "
                f"{len(manifest.appended)}, after shard {earlier.num_shards - 1}), as the same shards: appending it "
                "again would hold every one of its samples twice; nothing was appended. Pass --again (again=True) "
                "if that is meant"
            )


def _read_base(work: str) -> dict | None:
    """The revision an interrupted append began from, or None (no append began)."""
    try:
        with open(os.path.join(work, _BASE), "rb") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DestinationError(f"{work}: an interrupted append's record cannot be read ({exc}); remove the folder "
                               "to drop that append, then append again", path=work) from None  # fmt: skip
    if not isinstance(data, dict) or set(data) != {"fingerprint", "num_shards"}:
        raise DestinationError(f"{work}: not an append's record; remove the folder, then append again", path=work)
    return data


def _first_shard(manifest: Manifest) -> int:
    """The number of the first new shard: after DEST's last, and after every
    ``shard-N.tar`` or ``.idx`` name (at any folder depth) DEST's shards and
    indexes have, so that no new name is taken. With the writer's naming
    that is the shard count; stored names are searched in numpy, a pass over
    their bytes per number width, no Python string per name."""
    table = manifest.table
    first = table.num_shards
    stored = table.path_columns()
    if stored is None:
        return first
    for offsets, blob in stored:
        first = max(first, _after_our_names(np.asarray(offsets, dtype=np.int64), np.asarray(blob, dtype=np.uint8)))
    return first


def _after_our_names(offsets: np.ndarray, blob: np.ndarray) -> int:
    """One more than the largest N of the names ``shard-N.tar`` / ``shard-N.idx``
    (6 to 9 digits) among names stored as ``offsets`` into ``blob`` (0: none)."""
    starts, ends = offsets[:-1], offsets[1:]
    found = 0
    for digits in range(6, 10):
        width = len("shard-.tar") + digits
        rows = np.flatnonzero(ends - starts >= width)
        if not len(rows):
            continue
        tails = blob[ends[rows, None] - width + np.arange(width)]  # each name's last `width` bytes
        ours = np.all(tails[:, :6] == np.frombuffer(b"shard-", np.uint8), axis=1)
        number = tails[:, 6 : 6 + digits]
        ours &= np.all((number >= ord("0")) & (number <= ord("9")), axis=1)
        suffix = tails[:, 6 + digits :]
        ours &= np.all(suffix == np.frombuffer(b".tar", np.uint8), axis=1) | np.all(suffix == np.frombuffer(b".idx", np.uint8), axis=1)
        whole = ends[rows] - starts[rows] == width  # the name is just that, or that after a '/'
        ours &= whole | (blob[np.maximum(ends[rows] - width - 1, 0)] == ord("/"))
        if ours.any():
            values = (number[ours] - ord("0")).astype(np.int64) @ (10 ** np.arange(digits - 1, -1, -1, dtype=np.int64))
            found = max(found, int(values.max()) + 1)
    return found


def _check_agrees(manifest: Manifest, staged: Manifest, folder: str) -> None:
    """Refuse new samples that read differently from DEST's. (New samples
    without class names, say captions added to an ImageFolder's dataset,
    have no labels to misread.)"""
    for what, ours, theirs in (
        ("class names", manifest.class_names, staged.class_names if staged.class_names is not None else manifest.class_names),
        ("member compression", manifest.member_compression, staged.member_compression),
        ("token fields", manifest.token_fields, staged.token_fields),
    ):
        if ours != theirs:
            raise DestinationError(
                f"{folder}: the new samples' {what} ({_short(theirs)}) differ from the dataset's ({_short(ours)}); "
                "readers would read them differently: make them agree (the same classes, --compress-members, "
                "token fields), or write the new data as a dataset of its own and read both as a mixture. "
                "Nothing was appended",
                path=folder,
            )


def _short(value: Any) -> str:
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 80 else text[:77] + "..."


def _link(staged: Manifest, stage: str, folder: str) -> None:
    """Hard-link every staged shard and index into DEST under its name.

    Raises:
        DestinationError: A file of that name that is not the staged one is there.
    """
    for i in range(staged.num_shards):
        for name in (staged.table.path(i), staged.table.index_path(i)):
            source, target = os.path.join(stage, name), os.path.join(folder, name)
            if os.path.lexists(target):
                if os.path.samefile(source, target):
                    continue  # linked by a run that was stopped
                raise DestinationError(
                    f"{target}: a file of this name is in the dataset's folder, though no shard of the dataset "
                    "has it; move it away, then run the append again",
                    path=target,
                )
            os.link(source, target)
