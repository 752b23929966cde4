"""Shard size limits and the rule for rolling over to a new shard."""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.errors import UsageError
from shardkit.format.tar import END_OF_ARCHIVE

#: Default shard size bound: large enough for long sequential reads, small
#: enough that a job has many shards to spread over ranks and workers.
DEFAULT_MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class ShardLimits:
    """Upper bounds for one shard.

    Attributes:
        max_samples: Most samples per shard, or None for no count bound.
        max_bytes: Most bytes per shard file (headers, padding and the
            end-of-archive marker included), or None for no size bound.
    """

    max_samples: int | None = None
    max_bytes: int | None = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if self.max_samples is not None and (not isinstance(self.max_samples, int) or self.max_samples < 1):
            raise UsageError(f"max_samples must be a positive integer, got {self.max_samples!r}")
        if self.max_bytes is not None and (
            not isinstance(self.max_bytes, int) or self.max_bytes < 2 * len(END_OF_ARCHIVE)
        ):
            raise UsageError(f"max_bytes must be at least {2 * len(END_OF_ARCHIVE)} bytes, got {self.max_bytes!r}")

    def fits(self, num_samples: int, num_bytes: int, sample_bytes: int) -> bool:
        """Whether a sample of ``sample_bytes`` may join a shard holding
        ``num_samples`` samples in ``num_bytes`` bytes. An empty shard takes any
        sample, even one bigger than ``max_bytes``, so nothing is dropped."""
        if num_samples == 0:
            return True
        if self.max_samples is not None and num_samples >= self.max_samples:
            return False
        if self.max_bytes is not None and num_bytes + sample_bytes + len(END_OF_ARCHIVE) > self.max_bytes:
            return False
        return True


def parse_size(text: str) -> int:
    """Parse a byte size such as ``"512MB"``, ``"1GiB"`` or ``"4096"``.

    Raises:
        UsageError: Not a positive size.
    """
    units = {
        "": 1, "b": 1,
        "k": 1000, "kb": 1000, "kib": 1 << 10,
        "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
        "g": 1000**3, "gb": 1000**3, "gib": 1 << 30,
        "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
    }  # fmt: skip
    cleaned = text.strip().lower().replace(" ", "")
    number = cleaned.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = cleaned[len(number) :]
    try:
        value = float(number)
    except ValueError:
        raise UsageError(f"not a size: {text!r} (examples: 4096, 512MB, 1GiB)") from None
    if unit not in units or value <= 0 or value != value:
        raise UsageError(f"not a positive size: {text!r} (examples: 4096, 512MB, 1GiB)")
    return int(value * units[unit])
