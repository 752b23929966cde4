"""ShardWriter: write samples from Python into rolling shards plus a manifest.

For packing an existing dataset on disk in parallel use
:func:`shardkit.write_dataset`; this class is for samples produced by your own
code, in one process::

    with shardkit.ShardWriter("out/", max_samples=1000) as writer:
        for i, (jpeg, label) in enumerate(items):
            writer.write({"__key__": f"{i:08d}", "jpg": jpeg, "cls": label})
    manifest = writer.manifest
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.errors import CorruptShardError, DestinationError, UsageError
from shardkit.format.index import index_path_for, load_index
from shardkit.format.manifest import MANIFEST_NAME, Manifest
from shardkit.format.scan import local_chunks, summarize
from shardkit.format.table import table_from_entries
from shardkit.format.tar import encoded_sample_size, field_name
from shardkit.format.tokens import dataset_tokens
from shardkit.format.ustar import END_OF_ARCHIVE
from shardkit.io.atomic import TMP_SUFFIX
from shardkit.write.destination import (
    JOURNAL_DIR,
    holding_destination,
    is_shardkit_name,
    prepare_destination,
    shard_name,
)
from shardkit.write.encode import sample_fields
from shardkit.write.limits import DEFAULT_MAX_BYTES, ShardLimits
from shardkit.write.occupant import INDEX_JOURNAL_DIR, describe_occupant
from shardkit.write.publish import publish_manifest
from shardkit.write.shard import ShardFile, WrittenShard

logger = logging.getLogger(__name__)

#: The end-of-archive blocks after a shard's last sample.
END_OF_ARCHIVE_BYTES = len(END_OF_ARCHIVE)


#: How ShardWriter spells the options a refused destination advises.
_FLAGS = ("resume=True", "overwrite=True")

#: What a ShardWriter refused for a folder another writer holds advises.
_RERUN = (
    "close the other ShardWriter first (one writer per folder: give each DDP rank its own folder, "
    "or write from rank 0 only)"
)


class ShardWriter:
    """Write samples into shards under ``dest`` that roll over by count/size.

    Args:
        dest: Output directory; created if missing, must be empty unless
            ``overwrite``.
        max_samples: Most samples per shard (None: no count bound).
        max_bytes: Most bytes per shard file, real tar size (None: no bound).
        class_names: Recorded in the manifest for labelled data.
        overwrite: Remove what ``dest`` holds first.
        resume: Finish a write that was interrupted (killed, or left by an
            error) in ``dest``: its finished shards are kept (each read
            through once and checked against its offset index), the shard it
            was writing is removed, and :attr:`resumed_samples` says how many
            samples they hold, so the producer skips that many and writes on.
            Pass the same ``max_samples``/``max_bytes`` and the samples in
            the same order for the same shards as an uninterrupted write.

    The manifest is written by :meth:`close` (also on leaving a ``with``
    block without an error). Leaving by an error writes no manifest and leaves
    no shard under a final name that is incomplete; ``resume=True`` finishes
    such a write::

        writer = shardkit.ShardWriter("out/", max_samples=1000, resume=True)
        with writer:
            for sample in itertools.islice(samples(), writer.resumed_samples, None):
                writer.write(sample)

    Attributes:
        resumed_samples: Samples in the shards a ``resume=True`` writer kept
            (0 otherwise).
    """

    def __init__(
        self,
        dest: str,
        *,
        max_samples: int | None = None,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        class_names: Sequence[str] | None = None,
        overwrite: bool = False,
        resume: bool = False,
    ):
        if overwrite and resume:
            raise UsageError("ShardWriter: overwrite=True removes what resume=True would keep; pass one of them")
        self.dest = dest
        self.limits = ShardLimits(max_samples=max_samples, max_bytes=max_bytes)
        self.class_names = None if class_names is None else tuple(class_names)
        # Held until close() or abort(): two writers into one folder (say one per DDP rank) would
        # write the same shard names over each other; the second is refused instead.
        self._held = contextlib.ExitStack()
        self._held.enter_context(holding_destination(dest, rerun=_RERUN, shared_with_children=False))
        self._extensions: set[str] = set()
        try:
            prepare_destination(dest, overwrite=overwrite, resume=resume, flags=_FLAGS)
            self._written = _finished_shards(dest, self._extensions) if resume else []
        except BaseException:
            self._held.close()
            raise
        self.resumed_samples = sum(shard.num_samples for shard in self._written)
        self._current: ShardFile | None = None
        self._aborted = False
        self.manifest: Manifest | None = None

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample: ``{"__key__": str, ext: value, ...}``."""
        if self.manifest is not None or self._aborted:
            raise UsageError(f"ShardWriter is {'aborted' if self._aborted else 'closed'}: make a new one to write more")
        key, fields = sample_fields(sample)
        size = encoded_sample_size(key, [(ext, len(data)) for ext, data in fields])
        current = self._current
        if current is None or not self.limits.fits(current.num_samples, current.num_bytes, size):
            self._roll()
        assert self._current is not None
        self._current.add(key, fields)
        self._extensions.update(field_name(ext) for ext, _ in fields)  # as readers give them

    def _roll(self) -> None:
        if self._current is not None:
            self._written.append(self._current.commit())
        path = os.path.join(self.dest, shard_name(len(self._written)))
        self._current = ShardFile(path)

    def close(self) -> Manifest:
        """Commit the last shard and write ``manifest.json``; returns it."""
        if self.manifest is not None:
            return self.manifest
        if self._aborted:
            raise UsageError("ShardWriter was aborted: it writes no manifest; make a new one to write the dataset")
        try:
            if self._current is not None:
                self._written.append(self._current.commit())
                self._current = None
            written = self._written
            token_fields, tokens = dataset_tokens(
                [w.token_fields for w in written], [w.token_totals for w in written],
                [w.num_samples for w in written], [w.path for w in written],
            )
            manifest = Manifest(
                shards=table_from_entries((w.entry() for w in written), tokens=tokens),
                token_fields=token_fields,
                extensions=tuple(sorted(self._extensions)),
                class_names=self.class_names,
                source={"format": "python"},
                options={"max_samples": self.limits.max_samples, "max_bytes": self.limits.max_bytes},
                location=os.path.abspath(self.dest),
            )
            publish_manifest(self.dest, manifest)
        except BaseException:
            self.abort()  # a failed close is final: a second one must not publish without the lock
            raise
        self._held.close()  # the folder is free again
        self.manifest = manifest
        return manifest

    def abort(self) -> None:
        """Drop the shard in progress; write no manifest. The writer takes no
        more samples."""
        self._aborted = True
        if self._current is not None:
            self._current.abort()
            self._current = None
        self._held.close()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self._aborted:  # aborted inside the block: nothing to publish
            self.close()
        else:
            self.abort()


def _finished_shards(dest: str, extensions: set[str]) -> list[WrittenShard]:
    """The shards an interrupted ShardWriter finished in ``dest``, in order;
    removes its temporaries and adds the shards' fields to ``extensions``.

    Raises:
        DestinationError: ``dest`` holds a finished dataset, or another
            writer's work, or its shard numbers have a gap.
        CorruptShardError: A shard is damaged or disagrees with its index.
    """
    names = set(os.listdir(dest))
    if MANIFEST_NAME in names:
        raise DestinationError(
            f"{dest}: holds {describe_occupant(dest)}; resume=True finishes only an interrupted write: "
            "pass overwrite=True to replace it, or choose another folder",
            path=dest,
        )
    if JOURNAL_DIR in names:
        raise DestinationError(
            f"{dest}: holds {describe_occupant(dest)}; finish it with the same command and "
            "--resume, or pass overwrite=True to replace it",
            path=dest,
        )
    if INDEX_JOURNAL_DIR in names:
        raise DestinationError(
            f"{dest}: holds {describe_occupant(dest)}, not a ShardWriter's; resume=True finishes only an "
            "interrupted ShardWriter: choose another folder",
            path=dest,
        )
    for name in sorted(names):
        if name.endswith(TMP_SUFFIX) and is_shardkit_name(name):
            os.unlink(os.path.join(dest, name))  # the shard (or index) being written when it stopped
    written = []
    while shard_name(len(written)) in names:
        path = os.path.join(dest, shard_name(len(written)))
        index_path = index_path_for(path)
        bounds = load_index(index_path)
        summary = summarize(path, local_chunks(path, {}))
        if summary.num_samples != len(bounds) - 1 or int(bounds[-1]) + END_OF_ARCHIVE_BYTES != summary.num_bytes:
            raise CorruptShardError(
                f"{path}: holds {summary.num_samples} samples in {summary.num_bytes} bytes, its index "
                f"{len(bounds) - 1} samples in {int(bounds[-1])} bytes; remove it and the shards after it, then resume",
                path=path,
            )
        extensions.update(field_name(ext) for ext in summary.fields)
        written.append(WrittenShard(
            path, index_path, summary.num_samples, summary.num_bytes, summary.sha256, summary.token_fields,
            summary.token_totals,
        ))  # fmt: skip
    later = sorted(n for n in names if n.endswith(".tar") and is_shardkit_name(n) and n > shard_name(len(written)))
    if later:
        raise DestinationError(
            f"{dest}: {shard_name(len(written))} is missing but {later[0]} is there; a resumed write numbers its "
            "shards from 0 without gaps: restore the missing shard, or pass overwrite=True to write again",
            path=dest,
        )
    if written:
        logger.info("%s: resuming after %d finished shards (%d samples)", dest, len(written), sum(w.num_samples for w in written))
    return written
