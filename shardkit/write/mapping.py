"""The map stage: the user's function run over a write's items, its samples staged.

``write_dataset(source, dest, map=fn)`` runs ``fn`` on every item of
``source`` (a Python sequence, or each sample of a path source) and writes
what it returns. The stage sits where a path source's scan sits in
scan -> plan -> run -> publish, and gives the plan what a scan gives it:

1. The items are cut into partitions by position only
   (:func:`~shardkit.write.sources.mapped.items_per_partition`:
   a function of the number of items, never of the workers), so what a
   partition holds, and so every byte written, does not depend on how many
   processes or Ray tasks ran them, nor in which order they finished.
2. A worker runs one :class:`MapJob`: ``fn`` on each item in order, each
   sample it returns encoded (:func:`~shardkit.write.encode.sample_fields`,
   the :class:`~shardkit.ShardWriter`'s encoder) into the partition's
   *stage*, ``p-NNNNNN.stage`` (each sample's members joined, back to back),
   with one spill record per sample pointing into it (see
   :mod:`shardkit.write.spill`). The summary is written last; its presence
   marks the partition done.
3. The plan then orders the staged samples by the seeded hash of their keys
   (or keeps item order) and cuts shards by their real sizes, exactly as for
   files; the shard writers copy each sample out of its stage
   (:mod:`shardkit.write.sources.mapped`).

``--resume`` keeps every partition whose summary is there and whose items,
function and options are unchanged (:meth:`MapJob.full_signature`): ``fn`` is not
called again for them, so a killed run redoes at most the partitions that
were in flight. The stage folder goes when the manifest is written.

What the driver holds: one summary per partition and, while a partition is
in flight, its slice of the items; a ``range`` or a numpy array is sliced
without copying, so 10**7 items cost the driver no more than 10**4.
"""

from __future__ import annotations

import hashlib
import inspect
import marshal
import os
import pickle
import traceback
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit.errors import MapError, ShardkitError, UsageError
from shardkit.format.tar import join_members
from shardkit.write.encode import field_kind, sample_fields, short_repr
from shardkit.write.extensions import IMAGE_EXTENSIONS
from shardkit.write.no_sample import EXAMPLES_NAMED
from shardkit.write.resize import ImageOptions, ImageProblem, prepare_image
from shardkit.write.sources.base import Partition, sample_size
from shardkit.write.sources.mapped import MAPPED, SEQUENCE_SOURCE, described
from shardkit.write.spill import (
    SpillWriter,
    file_sum,
    load_summary,
    short_digest,
    spill_error,
    spill_intact,
    spill_prefix,
)

#: The file of a partition's staged samples, beside its spill.
STAGE_SUFFIX = ".stage"
#: The files a map job leaves, in the order a Ray task streams them back (summary last).
MAP_FILES = (STAGE_SUFFIX, ".rec.npy", ".src.npy", ".str", ".json")
#: Frames of the function's traceback a MapError keeps (the innermost).
_TRACEBACK_FRAMES = 5

#: Bytes of staged samples gathered before one write to the stage file.
_STAGE_BUFFER_BYTES = 1 << 20


def map_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function (what messages and the manifest call it)."""
    target = getattr(fn, "func", fn)  # a functools.partial names its function
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


@dataclass(frozen=True)
class MapSpec:
    """What the map stage does to each item (picklable: it goes to every worker).

    Attributes:
        fn: The user's function, or None: the items are sample dicts already.
        images: Applied to every image field of every sample after ``fn``
            (``--resize`` and the image options), or None to store them as they are.
    """

    fn: Callable[[Any], Any] | None = None
    images: ImageOptions | None = None

    @property
    def name(self) -> str:
        return "none" if self.fn is None else map_name(self.fn)

    def check(self) -> None:
        """Refuse a function that cannot run in a worker process.

        Raises:
            UsageError: ``fn`` is not callable, or does not pickle (a lambda,
                a function defined inside another).
        """
        if self.fn is None:
            return
        if not callable(self.fn):
            raise UsageError(f"map must be a callable, got {short_repr(self.fn)}")
        try:
            pickle.dumps(self.fn)
        except Exception as exc:
            raise UsageError(
                f"map {self.name} cannot be sent to worker processes ({type(exc).__name__}: {exc}); define it "
                "at the top level of a module (a lambda or a function defined inside another does not pickle)"
            ) from None

    def identity(self) -> dict:
        """What identifies the stage's work for ``--resume``: the function by
        name and by its compiled code and bound values, and the image options."""
        digest = hashlib.blake2b(digest_size=16)
        if self.fn is not None:
            digest.update(pickle.dumps(self.fn))  # the name; a partial's arguments; an instance's state
            for code in _code_objects(self.fn):
                digest.update(marshal.dumps(code))
        return {"map": self.name, "code": digest.hexdigest(), "images": repr(self.images)}


def _code_objects(fn: Any) -> Iterator[Any]:
    """The compiled code behind ``fn`` (a function, a partial's, a callable instance's ``__call__``)."""
    target = getattr(fn, "func", fn)
    code = getattr(target, "__code__", None)
    if code is None:
        call = getattr(type(target), "__call__", None)
        code = getattr(call, "__code__", None)
    if code is not None:
        yield code


# ---------------------------------------------------------------- the items


@dataclass(frozen=True)
class SequenceItems:
    """A partition's slice of a Python sequence: ``items[i]`` is item ``start + i``."""

    start: int
    items: Any

    def entries(self, on_error: str) -> Iterator[tuple[str, Any, ShardkitError | None]]:
        """``(where, item, None)`` for each item; ``where`` is ``items#row=N``."""
        for i, item in enumerate(self.items):
            yield f"{SEQUENCE_SOURCE}#row={self.start + i}", item, None

    def digest(self) -> str:
        """A hash of the items' pickles (for ``--resume``)."""
        try:
            data = pickle.dumps(self.items, protocol=4)
        except Exception as exc:
            raise UsageError(
                f"items {self.start}..{self.start + len(self.items) - 1} do not pickle ({type(exc).__name__}: "
                f"{exc}); items go to worker processes: give plain values (paths, numbers, dicts, arrays)"
            ) from None
        return hashlib.blake2b(data, digest_size=16).hexdigest()


def take(sequence: Any, start: int, end: int) -> Any:
    """``sequence[start:end]``: a slice where slicing is cheap and keeps the
    type (list, tuple, range, numpy array), else a list of the items."""
    if isinstance(sequence, (list, tuple, range)) or type(sequence).__module__.partition(".")[0] == "numpy":
        return sequence[start:end]
    return [sequence[i] for i in range(start, end)]


def describe(where: str, item: Any) -> str:
    """How an error names an item: ``item 17 ('a.jpg')`` for a sequence's, its input otherwise."""
    named = described(where)
    return where if named == where else f"{named} ({short_repr(item)})"


# ---------------------------------------------------------------- one partition


@dataclass(frozen=True)
class MapJob:
    """One partition of the map stage, with everything its worker needs (picklable).

    Attributes:
        part: The partition (kind :data:`MAPPED`; ``start``/``end``: its item positions).
        items: Its items (:class:`SequenceItems`, or a path source's scanned
            samples, :class:`~shardkit.write.sources.mapped.ScannedItems`).
        spec: The function and image options.
        spill_dir: The stage's folder (its spills and stage files).
        seed: The shuffle seed (spill records are sorted by the seeded key hash).
        on_error: ``"raise"``: the first failing item stops the write;
            ``"skip"``: it is recorded and left out.
        signature: What identifies the partition's work but its items (see
            :meth:`full_signature`, stored in its summary).
    """

    part: Partition
    items: Any
    spec: MapSpec
    spill_dir: str
    seed: int
    on_error: str
    signature: dict

    #: Map jobs read no compressed input (for the Ray scanner's placement).
    unpacks = False
    #: The files :meth:`run` leaves (a Ray task streams them back in this order).
    files = MAP_FILES

    def full_signature(self) -> dict:
        """:attr:`signature` with a hash of the items: what ``--resume``
        compares. Worked out where the job runs (pickling the items again is
        the workers' work, not the driver's), and by the driver only when it
        looks for partitions to keep."""
        return {**self.signature, "items": self.items.digest()}

    def run(self, spill_dir: str | None = None) -> dict:
        """Map the partition's items into its stage in ``spill_dir`` (default
        :attr:`spill_dir`); return its summary.

        Raises:
            MapError: An item failed under ``on_error="raise"`` (named, with
                the function's exception chained).
            DestinationError: The stage cannot be written.
        """
        prefix = spill_prefix(spill_dir or self.spill_dir, self.part.index)
        stage = _Stage(prefix, self.seed)
        try:
            tally = self._map_into(stage)
            summary = stage.finish(
                {
                    "signature": self.full_signature(),
                    "partition": self.part.index,
                    "num_items": tally.items,
                    "num_filtered": tally.filtered,
                    "filtered_first": tally.filtered_first,
                    "num_failed": len(tally.skipped),
                    "skipped": tally.skipped,
                    "num_files": 0,
                    "unpacked_bytes": 0,
                    "has_urls": False,
                }
            )
        except OSError as exc:
            stage.discard()
            raise spill_error(exc, os.path.dirname(prefix), self.part.path) from exc
        except BaseException:
            stage.discard()
            raise
        return summary

    def _map_into(self, stage: _Stage) -> _Tally:
        tally = _Tally()
        fn, images = self.spec.fn, self.spec.images
        for where, item, failure in self.items.entries(self.on_error):
            tally.items += 1
            if failure is not None:  # an input that could not be read (already under "skip")
                tally.skipped.append([where, str(failure)])
                continue
            try:
                produced = fn(item) if fn is not None else item
                samples = _samples_of(produced)
            except _NotASample as exc:
                self._fail(tally, where, item, "bad_sample", f"map's output for {describe(where, item)} {exc}")
                continue
            except Exception as exc:
                self._fail(
                    tally, where, item, "map_error",
                    f"map {self.spec.name} failed on {describe(where, item)}: {type(exc).__name__}: "
                    f"{_shortened(str(exc))}", exc,
                )  # fmt: skip
                continue
            if not samples:
                tally.filtered += 1
                if len(tally.filtered_first) < EXAMPLES_NAMED:  # what a write with no sample left names
                    tally.filtered_first.append(where)
                continue
            try:
                encoded = [_encoded(sample, images) for sample in samples]
            except _Unstorable as exc:
                self._fail(tally, where, item, exc.reason, f"map's output for {describe(where, item)}: {exc}")
                continue
            for key, fields in encoded:
                stage.add(key, fields, where)
        return tally

    def _fail(self, tally: _Tally, where: str, item: Any, reason: str, message: str, cause: BaseException | None = None) -> None:
        """Record the item as skipped, or raise under ``on_error="raise"``."""
        if self.on_error != "raise":
            tally.skipped.append([where, f"{reason}: {message}"])
            return
        advice = "fix the function, or pass on_error='skip' (--on-error skip) to record such items and go on"
        error = MapError(f"{message}; {advice}", path=where, reason=reason)
        if cause is not None:  # the function's own frames, whichever engine carries the error back
            error.frames = "".join(traceback.format_exception(cause, limit=-_TRACEBACK_FRAMES))
        raise error from cause


def _shortened(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters (an exception may quote a whole array)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Tally:
    """What one partition's items came to, besides their samples."""

    items: int = 0
    filtered: int = 0
    filtered_first: list[str] = field(default_factory=list)  # where the first few filtered items are
    skipped: list[list[str]] = field(default_factory=list)  # [where, reason]


class _NotASample(Exception):
    """``map`` returned something that is not a sample, None or a list of samples."""


class _Unstorable(Exception):
    """A sample ``map`` returned cannot be stored; ``reason`` is its skip category."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _samples_of(produced: Any) -> list[Mapping[str, Any]]:
    """What ``map`` returned as a list of sample dicts (None and an empty list: none).

    Raises:
        _NotASample: Neither a dict, None, nor a list/tuple/iterator of dicts.
        Exception: Whatever a generator raised while it was drawn.
    """
    if produced is None:
        return []
    if isinstance(produced, Mapping):
        return [produced]
    if isinstance(produced, (str, bytes, bytearray)) or not isinstance(produced, Iterable):
        raise _NotASample(f"is a {type(produced).__name__}, not a sample: {_SHAPES}")
    samples = list(produced)
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise _NotASample(f"holds a {type(sample).__name__} at position {i}, not a sample dict: {_SHAPES}")
    return samples


_SHAPES = (
    "return a dict {'__key__': str, EXT: value, ...}, None to drop the item, or a list or generator of such dicts"
)


def _encoded(sample: Mapping[str, Any], images: ImageOptions | None) -> tuple[str, list[tuple[str, bytes]]]:
    """A sample as its key and members, images prepared as ``images`` says.

    Raises:
        _Unstorable: No key, an unencodable value, an image that does not decode.
    """
    try:
        key, fields = sample_fields(sample)
    except UsageError as exc:
        raise _Unstorable("bad_sample", str(exc)) from None
    if images is None:
        return key, fields
    prepared = []
    for ext, data in fields:
        if field_kind(ext) in IMAGE_EXTENSIONS:
            try:
                image = prepare_image(data, images)
            except ImageProblem as exc:
                raise _Unstorable(exc.reason, f"sample {key!r}, field {ext!r}: {exc.detail}") from None
            if image.ext != field_kind(ext):  # re-encoded in another format: named after what it holds
                ext = ext[: len(ext) - len(field_kind(ext))] + image.ext
            data = image.data
        prepared.append((ext, data))
    prepared.sort(key=lambda field: field[0])
    return key, prepared


class _Stage:
    """One partition's staged samples: the stage file and its spill.

    The stage holds each sample's members joined
    (:func:`~shardkit.format.tar.join_members`), one after another; its spill
    record points at them (``offset``, ``length``) and plans the sample's tar
    size (``size``). A shard writer copies them into its shard in blocks
    (:meth:`~shardkit.write.shard.ShardFile.add_joined_block`), its headers
    made for many samples at once.
    """

    def __init__(self, prefix: str, seed: int):
        self.path = prefix + STAGE_SUFFIX
        self._file = open(self.path, "wb")  # inside the work folder; its summary, written last, vouches for it
        self._buffer = bytearray()
        self._written = 0
        self._crc = 0
        self.spill = SpillWriter(prefix, seed)
        self.extensions: set[str] = set()
        self.num_bytes = 0

    def add(self, key: str, fields: list[tuple[str, bytes]], where: str) -> None:
        """Append one sample; ``where`` (its item) is kept as its name, for messages."""
        raw_key = key.encode("utf-8", "surrogateescape")
        joined = join_members([(ext.encode("utf-8", "surrogateescape"), data) for ext, data in fields])
        size = sample_size(key, [(ext, len(data)) for ext, data in fields])
        digest = short_digest(raw_key + b"\0" + joined)
        self.spill.add(raw_key, where.encode("utf-8", "surrogateescape"), self._written + len(self._buffer),
                       len(joined), size, digest)  # fmt: skip
        self._buffer += joined
        self.num_bytes += size
        self.extensions.update(ext for ext, _ in fields)
        if len(self._buffer) >= _STAGE_BUFFER_BYTES:
            self._flush()

    def _flush(self) -> None:
        self._file.write(self._buffer)
        self._crc = zlib.crc32(self._buffer, self._crc)
        self._written += len(self._buffer)
        self._buffer = bytearray()

    def finish(self, summary: dict) -> dict:
        """Close the stage, then write the spill, the summary last; return the summary."""
        self._flush()
        self._file.close()
        summary = {
            **summary,
            "num_samples": len(self.spill),
            "num_bytes": self.num_bytes,
            "extensions": sorted(self.extensions),
            "read_path": self.path,
            "stage": [self._written, self._crc],
        }
        self.spill.finish(summary)
        return summary

    def discard(self) -> None:
        """Remove what was staged (a failed or stopped partition leaves nothing)."""
        self._file.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def stage_path(spill_dir: str, index: int) -> str:
    """Where partition ``index``'s staged samples are."""
    return spill_prefix(spill_dir, index) + STAGE_SUFFIX


def reusable_summary(spill_dir: str, index: int, signature: dict) -> dict | None:
    """``--resume``: the summary of partition ``index`` when its stage is
    complete and was made from the same work (``signature``), else None."""
    prefix = spill_prefix(spill_dir, index)
    summary = load_summary(prefix)
    if summary is None or summary.get("signature") != signature or not spill_intact(prefix, summary):
        return None
    return summary if file_sum(stage_path(spill_dir, index)) == summary.get("stage") else None


def is_path(source: Any) -> bool:
    """Whether a write's source names a path (else it is a sequence of items)."""
    return isinstance(source, (str, os.PathLike))


def check_sequence(source: Any) -> Sequence:
    """``source`` as a sequence of items, or a UsageError saying what is taken."""
    if isinstance(source, (str, bytes, os.PathLike)) or isinstance(source, Mapping):
        raise UsageError(f"a source of items must be a sequence (list, range, numpy array), got {short_repr(source)}")
    if inspect.isgenerator(source) or not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise UsageError(
            f"source must be a path or a sequence with len() and indexing (list, tuple, range, numpy array), got a "
            f"{type(source).__name__}: items are split by position so the output does not depend on the workers "
            "and a resumed run finds its place; pass list(iterator) for an iterator or generator"
        )
    return source


__all__ = [
    "MAPPED",
    "MapJob",
    "MapSpec",
    "SequenceItems",
    "check_sequence",
    "is_path",
    "describe",
    "map_name",
    "reusable_summary",
    "stage_path",
    "take",
]
