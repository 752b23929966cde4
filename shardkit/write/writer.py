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
import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.errors import UsageError
from shardkit.format.manifest import Manifest
from shardkit.format.tar import encoded_sample_size, field_name
from shardkit.write.destination import holding_destination, prepare_destination, shard_name
from shardkit.write.encode import sample_fields
from shardkit.write.limits import DEFAULT_MAX_BYTES, ShardLimits
from shardkit.write.publish import publish_manifest
from shardkit.write.shard import ShardFile, WrittenShard


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

    The manifest is written by :meth:`close` (also on leaving a ``with``
    block without an error). Leaving by an error writes no manifest and leaves
    no shard under a final name that is incomplete.
    """

    def __init__(
        self,
        dest: str,
        *,
        max_samples: int | None = None,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        class_names: Sequence[str] | None = None,
        overwrite: bool = False,
    ):
        self.dest = dest
        self.limits = ShardLimits(max_samples=max_samples, max_bytes=max_bytes)
        self.class_names = None if class_names is None else tuple(class_names)
        # Held until close() or abort(): two writers into one folder (say one per DDP rank) would
        # write the same shard names over each other; the second is refused instead.
        self._held = contextlib.ExitStack()
        self._held.enter_context(holding_destination(dest, rerun=_RERUN, shared_with_children=False))
        try:
            prepare_destination(dest, overwrite=overwrite, resume=False)
        except BaseException:
            self._held.close()
            raise
        self._current: ShardFile | None = None
        self._written: list[WrittenShard] = []
        self._extensions: set[str] = set()
        self._keys_seen = 0
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
            manifest = Manifest(
                shards=tuple(w.entry() for w in self._written),
                extensions=tuple(sorted(self._extensions)),
                class_names=self.class_names,
                source={"format": "python"},
                options={"max_samples": self.limits.max_samples, "max_bytes": self.limits.max_bytes},
                location=os.path.abspath(self.dest),
            )
            publish_manifest(self.dest, manifest)
        finally:
            self._held.close()  # the folder is free again, whatever happened
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
