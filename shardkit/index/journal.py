"""What ``shardkit index`` keeps while it runs, so that a rerun after a crash
goes on where it stopped.

Indexing 10^5 published shards over HTTP takes hours; a run killed near the
end (``kill -9``, the OOM killer, a lost node) used to start again from the
first shard. Into a local index folder, a run now keeps its per-shard
results in ``.shardkit-index.journal/`` there: the results file itself
(one fixed-size record per shard, written as each shard finishes; see
:class:`~shardkit.index.columns.ShardResults`), a digest of the
listing's base and shard names it belongs to, and the fields its shards
held so far. A rerun over the same shards reuses each finished record whose shard still
has the size and version it was read at and whose offset index is there,
and reads the rest; shards that could not be indexed are tried again. A run
that publishes its manifest removes the journal.

An index written into a remote ``--out`` keeps the same journal in a
folder of this machine's (:func:`remote_journal_folder`: under
``SourceOptions.cache_dir``, else the temporary folder, named by a digest
of the ``--out`` URL), so its rerun from the same machine goes on too. Its
finished records are trusted without looking for their offset indexes
(listing them would cost a request per shard): a record is written only
once its index was uploaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat

import numpy as np

from shardkit.index.columns import CHUNK_ROWS, INDEXED, KEPT, RECORD, TO_READ, ShardResults, index_name_for
from shardkit.index.source import ShardListing
from shardkit.io.atomic import atomic_write_bytes
from shardkit.io.base import SourceOptions
from shardkit.io.manifest import machine_cache_root
from shardkit.write.occupant import INDEX_JOURNAL_DIR

#: The journal's folder inside a local index folder.
JOURNAL_DIR = INDEX_JOURNAL_DIR
_RESULTS, _NAMES, _FIELDS, _TOKEN_SETS = "results", "names.sha256", "fields.json", "token_fields.json"


def remote_journal_folder(target: str, options: SourceOptions) -> str:
    """Where the journal of an index into the remote folder ``target`` is
    kept on this machine (under :func:`~shardkit.io.manifest.machine_cache_root`)."""
    digest = hashlib.sha256(target.rstrip("/").encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(machine_cache_root(options), "index-journals", digest)


class IndexJournal:
    """The journal of one index run.

    Args:
        folder: The journal's folder: :data:`JOURNAL_DIR` in a local index
            folder, or :func:`remote_journal_folder` for a remote one.
        listing: The shards being indexed.
        local_target: The local index folder, where a finished record's
            offset index must still be for the record to be kept; None for
            a remote one, whose records are trusted.
    """

    def __init__(self, folder: str, listing: ShardListing, local_target: str | None):
        self.folder = folder
        self.target = local_target
        self.listing = listing
        self.extensions: set[str] = set()
        #: Each set of token fields a shard had, numbered by a record's
        #: ``token_set`` (0: none).
        self.token_sets: list[tuple[str, ...]] = [()]

    def open(self) -> tuple[ShardResults, int]:
        """The results file, and how many of its records an earlier run over
        the same shards left that still hold (0 for a new journal)."""
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, _RESULTS)
        digest = _names_digest(self.listing)
        earlier = _read(os.path.join(self.folder, _NAMES))
        size = self.listing.num_shards * RECORD.itemsize
        same = earlier == digest.encode() and os.path.isfile(path) and os.path.getsize(path) == size
        if not same:
            # Another listing (or none): a fresh journal, its names' digest written before any record.
            for name in (_RESULTS, _FIELDS, _TOKEN_SETS):
                _remove(os.path.join(self.folder, name))
            atomic_write_bytes(os.path.join(self.folder, _NAMES), digest.encode(), sync_dir=False)
        results = ShardResults(path, self.listing.num_shards, keep=same)
        if not same:
            return results, 0
        fields = _read(os.path.join(self.folder, _FIELDS))
        self.extensions = set(json.loads(fields)) if fields else set()
        sets = _read(os.path.join(self.folder, _TOKEN_SETS))
        self.token_sets = [tuple(s) for s in json.loads(sets)] if sets else [()]
        return results, self._check(results)

    def _check(self, results: ShardResults) -> int:
        """Keep the finished records whose shard is as it was read and whose
        offset index is there; set every other one to be read again."""
        kept = 0
        for start, records in results.chunks():
            stop = start + len(records)
            sizes, versions = self.listing.sizes[start:stop], self.listing.versions[start:stop]
            done = (records["state"] == INDEXED) | (records["state"] == KEPT)
            done &= (sizes < 0) | (sizes == records["size"])
            done &= (versions < 0) | (versions == records["version"])
            if self.target is not None:  # a remote index's finished records are trusted
                names = index_name_for(self.listing.names[start:stop])
                for j in np.flatnonzero(done & ~records["compressed"]):  # a compressed shard has no offset index
                    index = os.path.join(self.target, bytes(names[j]).decode("utf-8", "surrogateescape"))
                    try:
                        st = os.stat(index)  # one call: there, a file, not empty
                        done[j] = stat.S_ISREG(st.st_mode) and st.st_size > 0
                    except OSError:
                        done[j] = False
            if not done.all():
                fixed = records.copy()
                fixed[~done] = np.zeros((), dtype=RECORD)
                fixed["state"][~done] = TO_READ
                results.put(start, fixed)
            kept += int(done.sum())
        return kept

    def note_extensions(self, extensions: set[str]) -> None:
        """Add the fields of a shard just indexed (written when new ones appear)."""
        if extensions <= self.extensions:
            return
        self.extensions |= extensions
        data = json.dumps(sorted(self.extensions)).encode()
        atomic_write_bytes(os.path.join(self.folder, _FIELDS), data, sync_dir=False)

    def token_set(self, fields: tuple[str, ...]) -> int:
        """The number of a set of token fields (written when a new one appears)."""
        if fields not in self.token_sets:
            self.token_sets.append(fields)
            data = json.dumps(self.token_sets).encode()
            atomic_write_bytes(os.path.join(self.folder, _TOKEN_SETS), data, sync_dir=False)
        return self.token_sets.index(fields)

    def remove(self) -> None:
        """Drop the journal (the run published its manifest)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _names_digest(listing: ShardListing) -> str:
    """A digest of the shards' base and names, in order (a chunk of the fixed-width column at a time)."""
    head = f"{listing.base}\n{listing.num_shards} {listing.names.dtype.str}\n"
    digest = hashlib.sha256(head.encode("utf-8", "surrogateescape"))
    for start in range(0, listing.num_shards, CHUNK_ROWS):
        digest.update(np.ascontiguousarray(listing.names[start : start + CHUNK_ROWS]).tobytes())
    return digest.hexdigest()


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
