"""shardkit: tar-shard (WebDataset-format) training data.

``import shardkit`` is cheap: the writer side never imports torch. The
reader (:class:`ShardDataset` and its loader helper) is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardkit.errors import (
    CorruptShardError,
    DestinationError,
    DuplicateSampleError,
    InputFileError,
    ManifestError,
    ShardkitError,
    SourceError,
    UsageError,
    VerifyError,
)
from shardkit.format.manifest import Manifest, ShardEntry, SkippedInput, load_manifest
from shardkit.write.writer import ShardWriter

__version__ = "0.1.0"

__all__ = [
    "CorruptShardError",
    "DestinationError",
    "DuplicateSampleError",
    "InputFileError",
    "Manifest",
    "ManifestError",
    "ShardEntry",
    "ShardWriter",
    "ShardkitError",
    "SkippedInput",
    "SourceError",
    "UsageError",
    "VerifyError",
    "__version__",
    "load_manifest",
]
