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
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.errors import UsageError
from shardkit.format.codecs import encode_value
from shardkit.format.manifest import Manifest
from shardkit.format.tar import encoded_sample_size, field_name, member_name_problem, repeated_field, split_key
from shardkit.write.destination import holding_destination, prepare_destination, shard_name
from shardkit.write.extensions import IMAGE_EXTENSIONS
from shardkit.write.limits import DEFAULT_MAX_BYTES, ShardLimits
from shardkit.write.publish import publish_manifest
from shardkit.write.resize import encode_image
from shardkit.write.shard import ShardFile, WrittenShard


#: What a ShardWriter refused for a folder another writer holds advises.
_RERUN = (
    "close the other ShardWriter first (one writer per folder: give each DDP rank its own folder, "
    "or write from rank 0 only)"
)


def sample_fields(sample: Mapping[str, Any]) -> tuple[str, list[tuple[str, bytes]]]:
    """Split a sample dict into its key and sorted ``(extension, bytes)`` fields.

    Keys starting with ``__`` other than ``__key__`` are metadata and dropped.

    Raises:
        UsageError: No ``__key__``, a key that is not a valid member stem, or
            a value that cannot be encoded.
    """
    key = sample.get("__key__")
    if not isinstance(key, str) or not key:
        raise UsageError(f"sample needs a non-empty str '__key__', got {key!r}")
    fields = []
    for ext in sorted(sample):
        if ext.startswith("__"):
            continue
        if split_key(f"{key}.{ext}") != (key, ext):
            raise UsageError(
                f"sample {key!r}: member {key}.{ext!s} would not split back into key {key!r} "
                f"and extension {ext!r} (a key has no '.' in its last path part)"
            )
        problem = member_name_problem(f"{key}.{ext}")
        if problem is not None:
            raise UsageError(f"sample {key!r}: member name {key}.{ext!s} is refused: {problem}")
        try:
            fields.append((ext, encode_value(_stored(ext, sample[ext]))))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"sample {key!r}, field {ext!r}: {exc}") from exc
    if not fields:
        raise UsageError(f"sample {key!r} has no fields besides its key")
    clash = repeated_field(ext for ext, _ in fields)
    if clash is not None:
        raise UsageError(
            f"sample {key!r}: fields {clash[0]!r} and {clash[1]!r} would both be read as field "
            f"{field_name(clash[0])!r} (readers lower-case extensions); give them distinct names"
        )
    return key, fields


def _stored(ext: str, value: Any) -> Any:
    """``value`` as :func:`~shardkit.format.codecs.encode_value` takes it, for
    the objects a training script holds, as webdataset's writer takes them: a
    Pillow image under an image extension is encoded (:func:`encode_image`);
    a numpy array or a torch tensor is saved as ``.npy`` (no pickled objects)
    under ``npy``, or as an image under an image extension (uint8, H x W or
    H x W x C); a 0-d one is its number. Anything else is given back as it is."""
    module = type(value).__module__.partition(".")[0]
    if module not in ("PIL", "numpy", "torch"):
        return value
    image_ext = ext.lower() in IMAGE_EXTENSIONS
    if module == "PIL" and hasattr(value, "save"):
        return encode_image(value, ext) if image_ext else value
    if module == "torch" and hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    import numpy as np

    if not isinstance(value, (np.ndarray, np.generic)):
        return value
    if value.ndim == 0:
        return value.item()
    if ext.lower() == "npy":
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)  # an object array is refused (ValueError)
        return buffer.getvalue()
    if image_ext and value.dtype == np.uint8 and (value.ndim == 2 or (value.ndim == 3 and value.shape[2] in (1, 3, 4))):
        from PIL import Image

        return encode_image(Image.fromarray(value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value), ext)
    raise TypeError(
        f"cannot store a {value.dtype} array of shape {value.shape} as .{ext}: store it as .npy, "
        "or as an image a uint8 H x W or H x W x C array"
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
