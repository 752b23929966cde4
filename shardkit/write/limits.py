"""Shard size limits and the rule for rolling over to a new shard."""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.config import parse_size  # noqa: F401  (re-exported: sizes are parsed in one place)
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
