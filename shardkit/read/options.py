"""The reader's two groups of options.

* :class:`ReaderOptions` decide what each slot reads. They are exactly the
  options a checkpoint depends on: two readers with the same
  ``ReaderOptions`` over the same dataset and world read the same samples in
  the same order, so a state saved by one resumes in the other (see
  :mod:`shardkit.read.resume`, which refuses a state saved with other
  values).
* :class:`OutputOptions` decide how the samples come out (decoding, the map
  function, batching); a checkpoint does not depend on them.

:class:`~shardkit.ShardDataset` takes either group whole (``options=``,
``output=``) or its fields as keyword arguments of the same names. What
remains a keyword argument of its own (the fault policy, read-ahead,
storage) changes how bytes are read, never which samples or how they look.

A YAML config loads into either class through the one loader for options
dataclasses::

    from shardkit.config import load_options
    options = load_options(ReaderOptions, "configs/reader.yaml", section="read")
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from shardkit.errors import UsageError
from shardkit.read.decode import Decoder, ImageMode, make_decoder
from shardkit.read.split import MODES, Mode

#: How a mixture's streams share batches (``ReaderOptions.batching``).
BATCHING = ("stratified", "per_stream", "device_per_stream")
#: Default number of samples held by the shuffle buffer.
DEFAULT_BUFFER_SIZE = 1000


def check_flag(name: str, value: Any, *, hint: str = "") -> None:
    """Refuse a non-bool where an option is a flag (``shuffle=1000``)."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, not {value!r}{hint}")


def check_count(name: str, value: Any, *, optional: bool = False) -> None:
    """Refuse a non-integer (a bool, a float, a string) where an option is a count."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UsageError(f"{name} must be an integer{' or None' if optional else ''}, not {value!r}")


@dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """What decides a reader's sample sequence (see the module docstring).

    Attributes:
        mode: ``"exact"``, ``"balanced"`` (default) or ``"infinite"``; see
            :class:`~shardkit.ShardDataset`.
        seed: Seed of all randomness (shard order and sample shuffle); >= 0.
        shuffle: Permute shards per epoch and shuffle samples in a buffer;
            False reads in manifest order.
        buffer_size: Samples held by each worker's shuffle buffer; 0 or 1
            disables the buffer.
        buffer_bytes: Optional cap on the bytes each worker's shuffle buffer
            holds, counting samples at their stored size; None for no cap.
        pad: In ``"balanced"`` mode, pad by repetition instead of dropping.
        interleave: Read parts each worker mixes (>= 1).
        batching: How a mixture's streams share the batches made in the
            workers (``batch_size``): ``"stratified"`` (default) mixes every
            batch in proportion; ``"per_stream"`` makes every batch of one
            stream, and every rank's batch at a step of the same stream;
            ``"device_per_stream"``, every batch of one stream, each rank
            in its own order of the same batches (see
            :func:`~shardkit.read.slot.per_stream_epochs`).

    Raises:
        UsageError: A value out of range, or ``pad`` outside ``"balanced"``.
    """

    mode: Mode = "balanced"
    seed: int = 0
    shuffle: bool = True
    buffer_size: int = DEFAULT_BUFFER_SIZE
    buffer_bytes: int | None = None
    pad: bool = False
    interleave: int = 1
    batching: str = "stratified"

    def __post_init__(self) -> None:
        buffer_hint = (
            f" (the shuffle buffer's size is buffer_size: shuffle=True, buffer_size={self.shuffle!r})"
            if isinstance(self.shuffle, int) and not isinstance(self.shuffle, bool)
            else ""
        )
        check_flag("shuffle", self.shuffle, hint=buffer_hint)
        check_flag("pad", self.pad)
        for name in ("seed", "buffer_size", "interleave"):
            check_count(name, getattr(self, name))
        check_count("buffer_bytes", self.buffer_bytes, optional=True)
        if self.mode not in MODES:
            raise UsageError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.seed < 0:
            raise UsageError(f"seed must be >= 0, not {self.seed}")
        if self.buffer_size < 0 or (self.buffer_bytes is not None and self.buffer_bytes <= 0):
            raise UsageError("buffer_size must be >= 0 and buffer_bytes > 0 (or None)")
        if self.interleave < 1:
            raise UsageError(f"interleave must be >= 1, not {self.interleave}")
        if self.pad and self.mode != "balanced":
            raise UsageError("pad=True applies to mode='balanced' only")
        if self.batching not in BATCHING:
            raise UsageError(f"batching must be one of {BATCHING}, not {self.batching!r}")

    @property
    def shuffles_samples(self) -> bool:
        """Whether each slot mixes its samples in a shuffle buffer."""
        return self.shuffle and self.buffer_size > 1

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain mapping of field names (JSON-serializable)."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class OutputOptions:
    """How a reader presents its samples (see the module docstring); each
    field is also a keyword argument of :class:`~shardkit.ShardDataset`,
    which documents it.

    Attributes:
        decode: None for raw bytes, ``"pil"`` / ``"tensor"``, or a
            :class:`~shardkit.Decoder`.
        select: Keeps a (decoded) sample when it returns true, applied
            after ``decode`` and before ``map`` (webdataset's ``.select``);
            None keeps every sample.
        map: Applied to each (decoded, selected) sample dict, or None.
        batch_size: Samples per batch, or None for single samples.
        collate: Turns a list of samples into a batch (None: torch's
            ``default_collate``).
        partial_batches: Yield each worker's last, smaller batch.

    Raises:
        UsageError: ``decode`` unknown, ``select`` not callable, a value of
            the wrong type, or ``batch_size`` below 1.
    """

    decode: ImageMode | Decoder | None = None
    select: Callable[[dict[str, Any]], Any] | None = None
    map: Callable[[dict[str, Any]], Any] | None = None
    batch_size: int | None = None
    collate: Callable[[list[Any]], Any] | None = None
    partial_batches: bool = True
    #: ``decode`` as a :class:`~shardkit.Decoder` (None for raw bytes).
    decoder: Decoder | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_count("batch_size", self.batch_size, optional=True)
        check_flag("partial_batches", self.partial_batches)
        if self.select is not None and not callable(self.select):
            raise UsageError(f"select must be a function of the sample dict returning a bool, not {self.select!r}")
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or self.batch_size < 1):
            raise UsageError(f"batch_size must be >= 1 or None, not {self.batch_size}")
        object.__setattr__(self, "decoder", make_decoder(self.decode))


_Group = TypeVar("_Group", ReaderOptions, OutputOptions)


def grouped(cls: type[_Group], group: _Group | None, name: str, **fields: Any) -> _Group:
    """``group`` if given (the fields' keyword arguments then left at their
    defaults), else ``cls`` made from those keyword arguments."""
    if group is None:
        return cls(**fields)
    if not isinstance(group, cls):
        raise UsageError(f"{name}= takes a shardkit.{cls.__name__}, not {type(group).__name__}")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    both = [key for key, value in fields.items() if value is not defaults[key] and value != defaults[key]]
    if both:
        raise UsageError(
            f"{', '.join(both)} given both as keyword arguments and inside {name}=: "
            f"set {'them' if len(both) > 1 else 'it'} in one place"
        )
    return group
