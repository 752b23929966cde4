"""What a write's DEST already holds, and whether ``--resume`` may go on there.

``--resume`` continues one interrupted write: the one its journal
(``DEST/.shardkit-journal``) belongs to. Each write records who it is in
the journal's :data:`IDENTITY_NAME` before it scans (the source, the
options that shape the output, the seed and the map), and a resumed run
compares itself with that record before it touches a file:

* an interrupted write of the same source, options, seed and map: go on
  (a changed body of the same map only redoes the map stage's partitions);
* the finished dataset of that same write (the same source, options, seed
  and map in its manifest, and no revision since: nothing removed or
  appended): go on, which checks every shard and rewrites only a missing
  or damaged one;
* anything else: a finished dataset of another source or with other
  options, one with samples removed since, another write's journal, an
  index, files shardkit did not write: refused in one line that says what
  DEST holds and what to do. Nothing is changed there.

:func:`describe_occupant` gives the one-line description the refusals of
``write``, ``index`` and :class:`~shardkit.ShardWriter` share.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from shardkit.errors import DestinationError
from shardkit.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardkit.io.atomic import atomic_write_bytes
from shardkit.io.urls import redact_url

#: The dataset card's file name (the Hub's and ``datasets``' name for it).
CARD_NAME = "README.md"
#: A write's work folder and journal in DEST (see :mod:`shardkit.write.journal`).
JOURNAL_DIR = ".shardkit-journal"
#: The file in a write's journal that says which write it is.
IDENTITY_NAME = "write.json"
#: The folder ``shardkit index`` keeps its journal in (see :mod:`shardkit.index.journal`).
INDEX_JOURNAL_DIR = ".shardkit-index.journal"


@dataclass(frozen=True)
class WriteIdentity:
    """Who a write is, as far as ``--resume`` is concerned.

    Attributes:
        source: The source as the manifest records it (the path or URL as
            given; for a Python sequence, its kind and length).
        real_source: A local source's real path (None otherwise), so one
            source named from two folders is still one.
        format: The format asked for (None: detected).
        options: :meth:`~shardkit.write.options.WriteOptions.recorded`.
        seed: The shuffle seed, None without a shuffle.
        map: The map function's name (``"none"`` without one).
    """

    source: str
    real_source: str | None
    format: str | None
    options: dict
    seed: int | None
    map: str

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WriteIdentity:
        record = json.loads(data)
        return cls(**{name: record[name] for name in cls.__dataclass_fields__})

    def differences(self, other: WriteIdentity) -> list[str]:
        """How ``other`` (another run's) differs from this one, in words: empty when it is this write."""
        found = []
        if self.real_source != other.real_source or (self.real_source is None and self.source != other.source):
            found.append(f"source {other.source} there, {self.source} here")
        if self.format != other.format:
            found.append(f"--format {other.format} there, {self.format} here")
        for name in sorted(set(self.options) | set(other.options)):
            if self.options.get(name) != other.options.get(name):
                found.append(f"{name} {other.options.get(name)!r} there, {self.options.get(name)!r} here")
        if self.seed != other.seed:
            found.append(f"seed {other.seed} there, {self.seed} here")
        if self.map != other.map:
            found.append(f"map {other.map} there, {self.map} here")
        return found


def source_name(source: Any) -> str:
    """How a write's source is named in records and messages: a path or URL
    as given (redacted), or a Python sequence by its length."""
    if isinstance(source, (str, os.PathLike)):
        return redact_url(os.fspath(source))
    return _sequence_name(len(source))


def _sequence_name(num_items: object) -> str:
    return f"a Python sequence of {num_items} items"


def write_identity(source: Any, options: Any, map_name: str) -> WriteIdentity:
    """The identity of a write of ``source`` with ``options`` (a
    :class:`~shardkit.write.options.WriteOptions`) and the map named ``map_name``."""
    named = source_name(source)
    real = os.path.realpath(source) if isinstance(source, (str, os.PathLike)) and os.path.exists(source) else None
    seed = options.seed if options.shuffle else None
    return WriteIdentity(named, real, options.format, options.recorded(), seed, map_name)


def record_identity(dest: str, identity: WriteIdentity) -> None:
    """Write ``identity`` into DEST's journal (made if missing), before the write scans."""
    work = os.path.join(dest, JOURNAL_DIR)
    os.makedirs(work, exist_ok=True)
    atomic_write_bytes(os.path.join(work, IDENTITY_NAME), identity.to_json())


def recorded_identity(dest: str) -> WriteIdentity | None:
    """The identity in DEST's journal, or None where there is none (an
    older shardkit's journal) or it cannot be read."""
    try:
        with open(os.path.join(dest, JOURNAL_DIR, IDENTITY_NAME), "rb") as f:
            return WriteIdentity.from_json(f.read())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _manifest_identity(manifest: Manifest, like: WriteIdentity) -> WriteIdentity:
    """The identity of the write that published ``manifest``, as far as
    it records one (``like`` fills in what it does not: the format asked for)."""
    source = dict(manifest.source)
    path = str(source.get("path", ""))
    real = os.path.realpath(path) if path and os.path.exists(path) else None
    if source.get("format") == "python":  # a sequence: named by its length, as write_identity names it
        path, real = _sequence_name(source.get("num_items")), None
    return WriteIdentity(path, real, like.format, dict(manifest.options), manifest.seed, str(source.get("map", like.map)))


def describe_occupant(dest: str) -> str | None:
    """What a local folder ``dest`` holds, in words (None: nothing, or only a dataset card).

    E.g. ``a finished dataset of images/ (180 samples in 90 shards)``, ``an
    interrupted write of images/ (3 shards finished)``, ``an interrupted
    `shardkit index```, ``4 entries shardkit did not write (e.g. 'notes.txt')``.
    """
    try:
        entries = sorted(e for e in os.listdir(dest) if e != CARD_NAME)
    except OSError:
        return None
    if not entries:
        return None
    if JOURNAL_DIR in entries:
        identity = recorded_identity(dest)
        of = f" of {identity.source}" if identity is not None else ""
        try:
            finished = sum(n.endswith(".json") and n != IDENTITY_NAME for n in os.listdir(os.path.join(dest, JOURNAL_DIR)))
        except OSError:
            finished = 0
        return f"{INTERRUPTED_WRITE}{of} ({finished} shards finished)"
    if INDEX_JOURNAL_DIR in entries:
        return "an interrupted `shardkit index`"
    if MANIFEST_NAME in entries:
        try:
            manifest = load_manifest(dest)
        except (OSError, ValueError):
            return f"a {MANIFEST_NAME} that is not a readable shardkit manifest"
        source = dict(manifest.source)
        if source.get("format") == "index":
            of = f"an index of {redact_url(str(manifest.shards_base or source.get('path')))}"
        else:
            of = f"a finished dataset of {source.get('path', 'a Python sequence')}"
        removed = f", {manifest.num_removed:,} removed since" if manifest.num_removed else ""
        return f"{of} ({manifest.num_samples:,} samples in {manifest.num_shards:,} shards{removed})"
    shards = [e for e in entries if e.startswith("shard-") and e.endswith((".tar", ".tar.tmp"))]
    if shards:
        return f"{UNFINISHED_SHARDS} ({len(shards)} shard files and no manifest)"
    return f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'} and no shardkit dataset (e.g. {entries[0]!r})"


#: How :func:`describe_occupant` begins for the shards of an interrupted :class:`~shardkit.ShardWriter`.
UNFINISHED_SHARDS = "the unfinished shards of a ShardWriter"
#: How it begins for an interrupted ``shardkit write``.
INTERRUPTED_WRITE = "an interrupted `shardkit write`"


def check_resume(dest: str, identity: WriteIdentity) -> None:
    """Refuse ``--resume`` into the local folder ``dest`` unless it holds
    nothing, this write's interrupted journal, or this write's finished
    dataset (see the module docstring). Changes nothing.

    Raises:
        DestinationError: ``dest`` holds anything else; the message says
            what, and what to do.
    """
    held = describe_occupant(dest)
    if held is None:
        return
    entries = set(os.listdir(dest))
    if JOURNAL_DIR in entries:
        recorded = recorded_identity(dest)
        if recorded is None:  # an older shardkit's journal: its shards are checked one by one
            return
        differences = identity.differences(recorded)
        if not differences:
            return
        raise DestinationError(
            f"{dest}: holds {held}, and --resume continues only that write ({'; '.join(differences)}): rerun "
            "it with its own source and options, or pass --overwrite to discard it and write this one",
            path=dest,
        )
    if MANIFEST_NAME in entries and INDEX_JOURNAL_DIR not in entries:
        try:
            manifest = load_manifest(dest)
        except (OSError, ValueError):
            manifest = None
        if manifest is not None and dict(manifest.source).get("format") != "index":
            differences = identity.differences(_manifest_identity(manifest, identity))
            if not differences and not manifest.num_removed and not manifest.appended:
                return  # this write, finished: its shards are checked, a damaged one rewritten
            why = "; ".join(differences) or (
                "samples were removed from it since, which a rewrite would bring back" if manifest.num_removed
                else "data was appended to it since, which a rewrite of this source would drop"
            )
            raise DestinationError(
                f"{dest}: holds {held}, not an interrupted write of this source ({why}); --resume finishes only "
                "an interrupted write: choose another DEST, or pass --overwrite to replace this dataset",
                path=dest,
            )
    ours = held.startswith(UNFINISHED_SHARDS) or MANIFEST_NAME in entries
    replace = ", or pass --overwrite to replace what is there" if ours else ""
    raise DestinationError(
        f"{dest}: holds {held}, not an interrupted write of this source; --resume finishes only an interrupted "
        f"`shardkit write`: choose another DEST{replace}",
        path=dest,
    )


def refuse_unfinished_write(folder: str, *, beside_shards: bool) -> None:
    """Refuse to publish an index into ``folder`` while it holds a write's
    unfinished work: an interrupted ``shardkit write`` (its journal), or,
    for an index folder apart from the shards (``beside_shards`` False), tar
    shards of its own (an interrupted :class:`~shardkit.ShardWriter`'s,
    whose offset indexes the index's would replace).

    Raises:
        DestinationError: It does; the message says what it holds.
    """
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    if JOURNAL_DIR in entries:
        raise DestinationError(
            f"{folder}: holds {describe_occupant(folder)}; finish that write with --resume (or remove it with "
            "--overwrite) before indexing here, or index into another --out folder",
            path=folder,
        )
    shards = sorted(e for e in entries if e.endswith(".tar")) if not beside_shards else []
    if shards and MANIFEST_NAME not in entries:
        raise DestinationError(
            f"{folder}: holds tar shards of its own ({len(shards)}, e.g. {shards[0]!r}) and no manifest, an "
            "unfinished write whose offset indexes the index would replace; index into an empty --out folder",
            path=folder,
        )
